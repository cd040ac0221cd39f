//! `ork plan --project` on hostile input (issue 39): board files read under the input rule,
//! names printed escaped, token counts beyond the context, draft vocabularies.

use super::safety::{mkfifo, run_within};
use super::*;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ork plan --model M --project FILE` within 60 s, refused with exit 2 and every one of
/// `needles` in its error.
fn refused_board(file: &Path, needles: &[&str]) {
    let m = model();
    let o = run_within(
        ork().args(["plan", "--model", s(&m), "--project", s(file)]),
        60,
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    for n in needles {
        assert!(e.contains(n), "{n}: {e}");
    }
    assert!(!e.chars().any(|c| c.is_control() && c != '\n'), "{e:?}");
}

/// `--project FILE` is read as every file ork reads whole: a FIFO is refused at once (it blocked
/// forever), a link to `/dev/zero` as a device (it read until out of memory), a file above
/// `ork_board::BOARD_FILE_LIMIT` before it is read (a 300 MB JSON was read whole).
#[test]
fn board_files_are_read_under_the_input_rule() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["fifo.json", "fifo"] {
        let fifo = dir.path().join(name);
        mkfifo(&fifo);
        refused_board(&fifo, &["--project", name, "FIFO"]);
    }
    let zero = dir.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    refused_board(&zero, &["zero.json", "character device"]);
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    refused_board(&big, &["big.json", "above the limit"]);
    let bin = dir.path().join("bin.json");
    std::fs::write(&bin, b"{\"name\": \"\xff\"}").unwrap();
    refused_board(&bin, &["bin.json", "UTF-8"]);
}

/// A board name with an ANSI escape or a newline is refused, the error showing it escaped; a
/// parameter outside its range is refused naming it (`"k_max": 1, "k_segment": 0.5` panicked).
#[test]
fn board_files_with_control_names_or_absurd_parameters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (r#""\u001b[31mred""#, "{}", "name"),
        (r#""two\nlines""#, "{}", "name"),
        (
            r#""b""#,
            r#"{"k_max": 1, "k_segment": 0.5}"#,
            "overrides.k_max",
        ),
        (r#""b""#, r#"{"call_s": 1e308}"#, "overrides.call_s"),
        (
            r#""b""#,
            r#"{"npu_read_bw": 1e-308}"#,
            "overrides.npu_read_bw",
        ),
        (
            r#""b""#,
            r#"{"host_cores": 1e-308}"#,
            "overrides.host_cores",
        ),
    ];
    for (i, (name, over, field)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("b{i}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"name": {name}, "chip": "rk3588", "ram_gib": 16, "storage_read_gbps": 1,
                    "overrides": {over}}}"#
            ),
        )
        .unwrap();
        refused_board(&file, &[&format!("b{i}.json"), field]);
    }
}

/// `ork plan --model M --project rk3588 ARGS` within 120 s.
fn plan(args: &[&str]) -> Output {
    let m = model();
    let mut a = vec!["plan", "--model", s(&m), "--project", "rk3588", "--json"];
    a.extend_from_slice(args);
    run_within(ork().args(&a), 120)
}

/// `--prompt-tokens` + `--gen-tokens` beyond the model's context are refused as `ork run`
/// refuses a prompt and `-n` beyond it (`--gen-tokens 1000000` grew ~70 KB per token until out
/// of memory; `--prompt-tokens 1000000` projected "TTFT 2160208021 ms"); up to the context, a
/// plan's memory does not grow with the tokens (`ork_board::schedule_sampled`).
#[test]
fn plans_beyond_the_context_are_refused() {
    // SmolLM2-135M's context: 8192 positions.
    for args in [
        &["--gen-tokens", "1000000"][..],
        &["--prompt-tokens", "1000000"],
        &["--prompt-tokens", "8000", "--gen-tokens", "193"],
    ] {
        let o = plan(args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("context") && e.contains("8192"), "{e}");
    }
    let o = plan(&["--prompt-tokens", "64", "--gen-tokens", "8128"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let p = &json(&o)["projected"];
    let ok = |k: &str| p[k].as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
    assert!(ok("ttft_s") && ok("decode_tok_s"), "{p}");
    assert_eq!(
        p["passes"].as_u64(),
        Some(ork_board::DECODE_PASSES_REPLAYED as u64 + 1),
        "{p}"
    );
}

/// `plan --project --draft D.gguf` refuses a draft whose vocabulary is not the model's, with the
/// check `ork run --draft` makes (gemma3's 262,144 tokens against SmolLM2's 49,152).
#[test]
fn plan_refuses_a_draft_vocabulary_as_run_does() {
    let g = ork_testkit::gemma3_path();
    let args = ["--draft", s(&g), "--acceptance", "0.5"];
    let o = plan(&args);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let planned = stderr(&o);
    let m = model();
    let o = run_within(
        ork().args([
            "run",
            "--model",
            s(&m),
            "--prompt",
            "x",
            "-n",
            "1",
            "--draft",
            s(&g),
            "--device",
            "emu",
        ]),
        120,
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let ran = stderr(&o);
    for e in [&planned, &ran] {
        assert!(e.contains("262144") && e.contains("49152"), "{e}");
    }
}
