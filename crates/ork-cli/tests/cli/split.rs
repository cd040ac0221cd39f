//! `--decode-device split` and `--prefill-device split`: runs whose decode (prefill) matmuls'
//! rows are shared between the emulated NPU and the CPU engine, their reports, their plans,
//! and the flags refused. The numerics bound of the splits (every row once, on its engine, bit
//! for bit) is `ork-runtime`'s `tests/split.rs` and `tests/split_prefill.rs`.

use super::{code, converted, json, model, ork, run, stderr};

/// `ork VERB --model SmolLM2 --pack (converted) --threads 2 --json ARGS… EXTRA…`, exit 0: its
/// JSON.
fn ork_json(verb: &str, args: &[&str], extra: &[&str]) -> serde_json::Value {
    let (m, pack) = (model(), converted());
    let head = [
        verb,
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--threads",
        "2",
        "--json",
    ];
    let o = run(&[&head[..], args, extra].concat());
    assert_eq!(code(&o), Some(0), "{verb} {extra:?}: {}", stderr(&o));
    json(&o)
}

fn run_split(device: &[&str]) -> serde_json::Value {
    let prompt = ["--prompt", "The capital of France is", "-n", "8"];
    ork_json("run", &prompt, device)
}

#[test]
fn a_split_run_reports_each_engines_rows_and_prefills_on_the_device() {
    let split = run_split(&[
        "--device",
        "emu",
        "--decode-device",
        "split",
        "--split-rows",
        "0.5",
    ]);
    let emu = run_split(&["--device", "emu"]);
    assert_eq!(split["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(split["engines"]["prefill"], "device");
    assert_eq!(split["engines"]["decode"], "split");
    // The first token comes from the prefill, on the emulator in both runs.
    assert_eq!(split["tokens"][0], emu["tokens"][0]);
    let s = &split["decode_split"];
    assert_eq!(s["share"], 0.5);
    assert_eq!(s["from"], "--split-rows");
    assert!(s["split_calls"].as_u64().unwrap() > 0, "{s}");
    assert!(s["device_rows"].as_u64().unwrap() > 0, "{s}");
    assert!(s["cpu_rows"].as_u64().unwrap() > 0, "{s}");
    let device = split["device"].as_str().unwrap();
    assert!(device.contains("decode split (emulated"), "{device}");
}

/// `--prefill-device cpu --decode-device split` (here `--device cpu`): the CPU engine
/// prefills, the decode's rows are shared with `auto`'s device (the emulator here); its first
/// token is the CPU-only run's (the same engine prefills).
#[test]
fn a_cpu_prefill_with_a_split_decode_runs() {
    let split = run_split(&[
        "--device",
        "cpu",
        "--decode-device",
        "split",
        "--split-rows",
        "0.5",
    ]);
    let cpu = run_split(&["--device", "cpu"]);
    assert_eq!(split["engines"]["prefill"], "cpu");
    assert_eq!(split["engines"]["decode"], "split");
    assert_eq!(split["tokens"][0], cpu["tokens"][0]);
    let s = &split["decode_split"];
    assert!(s["split_calls"].as_u64().unwrap() > 0, "{s}");
    let device = split["device"].as_str().unwrap();
    assert!(
        device.starts_with("prefill cpu, decode split (emulated"),
        "{device}"
    );
}

/// `ork plan` of SmolLM2 with `flag` (a phase) `split`, projected on orangepi5-16g: its JSON.
fn plan_split(flag: &str) -> serde_json::Value {
    let m = model();
    let o = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        flag,
        "split",
        "--project",
        "orangepi5-16g",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{flag}: {}", stderr(&o));
    json(&o)
}

#[test]
fn plan_prints_the_split_and_where_its_share_comes_from() {
    let m = model();
    let v = plan_split("--decode-device");
    assert_eq!(v["engines"]["decode"], "split");
    let s = &v["decode_split"];
    let share = s["share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{s}");
    assert!(s["from"].as_str().unwrap().contains("orangepi5-16g"), "{s}");
    assert_eq!(s["projected"]["npu_row_share"].as_f64(), Some(share));
    assert_eq!(v["projected"]["split_decode"]["built"], true);
    // `--split-rows auto` (the default): each kind of weight at its own share, the split's
    // mean (by int8 bytes) the share above; SmolLM2's small matmuls stay on the CPU (a device
    // call costs more than their rows) and its wide output head is shared.
    assert_eq!(s["per_weight"], true, "{s}");
    let kinds = s["by_shape"].as_array().unwrap();
    let shares: Vec<f64> = kinds.iter().map(|k| k["share"].as_f64().unwrap()).collect();
    assert!(kinds.len() >= 4, "{s}");
    assert!(shares.iter().all(|f| (0.0..=1.0).contains(f)), "{s}");
    let (lo, hi) = shares
        .iter()
        .fold((1.0f64, 0.0f64), |(lo, hi), &f| (lo.min(f), hi.max(f)));
    assert!(hi > lo, "one share for every kind of weight: {s}");
    let bytes = |k: &serde_json::Value| {
        (k["k"].as_u64().unwrap() * k["n"].as_u64().unwrap() * k["weights"].as_u64().unwrap())
            as f64
    };
    let mean = kinds
        .iter()
        .map(|k| bytes(k) * k["share"].as_f64().unwrap())
        .sum::<f64>()
        / kinds.iter().map(bytes).sum::<f64>();
    assert!((mean - share).abs() < 1e-9, "{mean} vs {share}: {s}");
    let auto = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        "--decode-device",
        "split",
        "--split-rows",
        "auto",
        "--board",
        "orangepi5-16g",
        "--json",
    ]);
    assert_eq!(code(&auto), Some(0), "{}", stderr(&auto));
    assert_eq!(json(&auto)["decode_split"]["by_shape"], s["by_shape"]);
    let text = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        "--decode-device",
        "split",
        "--split-rows",
        "0.25",
    ]);
    assert_eq!(code(&text), Some(0), "{}", stderr(&text));
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("decode split: the device computes 25.0%"),
        "{out}"
    );
}

#[test]
fn split_flags_that_cannot_run_exit_2_with_one_line() {
    let m = model();
    let m = m.to_str().unwrap();
    let base = ["run", "--model", m, "--prompt", "x", "-n", "1"];
    let cases: [(&[&str], &str); 10] = [
        (
            &["--decode-device", "split", "--split-rows", "1.5"],
            "--split-rows",
        ),
        (
            &["--decode-device", "split", "--split-rows", "0"],
            "--split-rows",
        ),
        (&["--decode-device", "split"], "--split-rows FRACTION"),
        // `auto` without a board (no --board, --project, rknpu driver): refused, naming --board.
        (
            &[
                "--device",
                "emu",
                "--decode-device",
                "split",
                "--split-rows",
                "auto",
            ],
            "--board NAME",
        ),
        // A board without an NPU has no rows to give it.
        (
            &["--decode-device", "split", "--board", "pi5-16g"],
            "no NPU",
        ),
        (&["--split-rows", "0.5"], "--decode-device split"),
        // A prefill split: the same rules.
        (&["--prefill-device", "split"], "--split-rows FRACTION"),
        (
            &["--prefill-device", "split", "--split-rows", "1"],
            "--split-rows",
        ),
        (&["--device", "split", "--board", "pi5-16g"], "no NPU"),
        // The device the split would share with is absent: no vendor runtime here.
        (
            &[
                "--device",
                "rknn",
                "--no-pack",
                "--decode-device",
                "split",
                "--split-rows",
                "0.5",
            ],
            "rknn",
        ),
    ];
    for (extra, says) in cases {
        let o = ork()
            .args(base)
            .args(extra)
            .env("ORK_RKNN_LIB", "/nonexistent/librknnrt.so")
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(code(&o), Some(2), "{extra:?}: {e}");
        let first = e.lines().next().unwrap_or("");
        assert!(
            first.starts_with("error: ") && first.contains(says),
            "{extra:?}: {e}"
        );
        // clap's own usage errors add a hint after a blank line; ork's are one line.
        assert!(
            e.lines().filter(|l| !l.trim().is_empty()).count() <= 2,
            "{extra:?}: {e}"
        );
    }
}

/// `--prefill-device split`: the prompt's matmuls' rows shared, the decode on the emulator;
/// both phases split (`--device split`), each reports its rows.
#[test]
fn a_prefill_split_run_reports_each_engines_rows() {
    let split = run_split(&[
        "--device",
        "emu",
        "--prefill-device",
        "split",
        "--split-rows",
        "0.5",
    ]);
    assert_eq!(split["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(split["engines"]["prefill"], "split");
    assert_eq!(split["engines"]["decode"], "device");
    let s = &split["prefill_split"];
    assert_eq!((&s["share"], &s["phase"]), (&0.5.into(), &"prefill".into()));
    assert!(s["split_calls"].as_u64().unwrap() > 0, "{s}");
    assert!(s["device_rows"].as_u64().unwrap() > 0, "{s}");
    assert!(s["cpu_rows"].as_u64().unwrap() > 0, "{s}");
    assert!(split.get("decode_split").is_none(), "{split}");
    let both = run_split(&["--device", "split", "--split-rows", "0.5"]);
    assert_eq!(both["engines"]["prefill"], "split");
    assert_eq!(both["engines"]["decode"], "split");
    for phase in ["prefill_split", "decode_split"] {
        assert!(both[phase]["split_calls"].as_u64().unwrap() > 0, "{both}");
    }
}

/// `ork plan --prefill-device split --project BOARD`: each weight's prefill share from the
/// board clock; perplexity runs on a prefill split too.
#[test]
fn plan_and_perplexity_take_a_prefill_split() {
    let m = model();
    let v = plan_split("--prefill-device");
    assert_eq!(v["engines"]["prefill"], "split");
    let s = &v["prefill_split"];
    assert_eq!(
        (&s["per_weight"], &s["phase"]),
        (&true.into(), &"prefill".into())
    );
    assert!(s["from"].as_str().unwrap().contains("orangepi5-16g"), "{s}");
    let share = s["share"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 1.0, "{s}");
    assert_eq!(
        s["projected_prefill"]["npu_row_share"].as_f64(),
        Some(share)
    );
    assert!(v["decode_split"].is_null(), "{v}");
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "Paris is the capital of France. ".repeat(30)).unwrap();
    let t = text.to_str().unwrap();
    let ppl = |extra: &[&str]| {
        let args = ["--file", t, "--ctx", "64", "--chunks", "2"];
        ork_json("perplexity", &args, extra)["ppl"]
            .as_f64()
            .unwrap()
    };
    let (emu, cpu) = (ppl(&["--device", "emu"]), ppl(&["--device", "cpu"]));
    let split = ppl(&["--prefill-device", "split", "--split-rows", "0.5"]);
    // Each row of the split is one engine's: its perplexity near both engines' own.
    let (lo, hi) = (emu.min(cpu), emu.max(cpu));
    assert!(
        split > 0.97 * lo && split < 1.03 * hi,
        "{split} vs {emu}, {cpu}"
    );
    // Without a board or a share: exit 2.
    let o = run(&[
        "perplexity",
        "--model",
        m.to_str().unwrap(),
        "--file",
        text.to_str().unwrap(),
        "--prefill-device",
        "split",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--split-rows FRACTION"),
        "{}",
        stderr(&o)
    );
}
