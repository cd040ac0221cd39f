//! `--project BOARD`: the board clock on `ork run` and `ork plan` (docs/board-model.md).

use super::*;

const PROMPT: &str = "The capital of France is a city that many people like to visit because";

fn projected(v: &serde_json::Value) -> &serde_json::Value {
    let p = &v["projected"];
    assert_eq!(p["label"], "projected", "{v}");
    p
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("missing {k} in {v}"))
}

/// `run --project` and `plan --project` on the same model and budget: the run's own events and
/// the planned schedule give TTFT and decode within 10 % of each other for the resident plan.
/// Streamed (40 MiB), the run's cache keeps more weights resident than the plan pins (see
/// docs/board-model.md), so the plan's decode is lower: within 25 % here, and both are slower
/// than resident.
#[test]
fn plan_and_run_projections_agree_resident_within_ten_percent() {
    let m = model();
    let ms = m.to_str().unwrap();
    let pack = converted().to_str().unwrap();
    let mut decode = Vec::new();
    for budget in ["3072", "40"] {
        let o = run(&[
            "run",
            "--model",
            ms,
            "--pack",
            pack,
            "--budget-mb",
            budget,
            "--device",
            "emu",
            "--prompt",
            PROMPT,
            "-n",
            "12",
            "--project",
            "orangepi5-16g",
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        let r = json(&o);
        let rp = projected(&r).clone();
        assert_eq!(rp["board"], "orangepi5-16g");
        let prompt = r["prefill_tokens"].as_u64().unwrap().to_string();
        let gen = r["tokens"].as_array().unwrap().len().to_string();
        let o = run(&[
            "plan",
            "--model",
            ms,
            "--budget-mb",
            budget,
            "--project",
            "orangepi5-16g",
            "--prompt-tokens",
            &prompt,
            "--gen-tokens",
            &gen,
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        let p = json(&o);
        let pp = projected(&p);
        let tolerance = if budget == "3072" { 0.10 } else { 0.25 };
        for k in ["ttft_s", "decode_tok_s"] {
            let (a, b) = (f(&rp, k), f(pp, k));
            assert!(
                (a / b - 1.0).abs() <= tolerance,
                "budget {budget} MiB: {k} run {a} vs plan {b}\nrun {rp}\nplan {pp}"
            );
        }
        decode.push((f(&rp, "decode_tok_s"), f(pp, "decode_tok_s")));
        // The resident plan loaded its weights before the prompt.
        if budget == "3072" {
            assert!(f(&rp, "load_s") > 0.0, "{rp}");
        }
    }
    assert!(
        decode[1].0 < decode[0].0 && decode[1].1 < decode[0].1,
        "{decode:?}"
    );
}

#[test]
fn unknown_boards_list_the_known_ones_and_bad_board_files_name_the_parameter() {
    let m = model();
    let ms = m.to_str().unwrap();
    let o = run(&["plan", "--model", ms, "--project", "rk9999"]);
    assert_eq!(code(&o), Some(2));
    let e = stderr(&o);
    for k in ["rk9999", "rk3588", "rk3576", "orangepi5-16g", "rock5b-16g"] {
        assert!(e.contains(k), "{e}");
    }
    let o = run(&[
        "run",
        "--model",
        ms,
        "--prompt",
        "x",
        "--project",
        "nope",
        "--device",
        "emu",
    ]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("orangepi5-16g"), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("board.json");
    std::fs::write(
        &file,
        r#"{"name": "mine", "chip": "rk3588", "ram_gib": 16, "storage_read_gbps": -1}"#,
    )
    .unwrap();
    let o = run(&["plan", "--model", ms, "--project", file.to_str().unwrap()]);
    assert_eq!(code(&o), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("storage_read_gbps") && e.contains("board.json"),
        "{e}"
    );
}

/// A sparse GGUF of Qwen2-0.5B's shapes (no tensor data on disk): `ork plan --project`
/// projects it as the calibration does.
#[test]
fn plan_projects_a_sparse_model_of_a_published_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen2-0.5b-shape.gguf");
    let dims = ork_board::fit::FIT_ROWS[0].dims;
    ork_testkit::sparse::write_sparse_llama(&path, &dims).unwrap();
    let o = run(&[
        "plan",
        "--model",
        path.to_str().unwrap(),
        "--soc",
        "rk3588",
        "--project",
        "--prompt-tokens",
        "128",
        "--gen-tokens",
        "64",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let p = projected(&v);
    assert_eq!(p["board"], "rk3588");
    let want =
        ork_board::fit::project_row(&ork_board::fit::FIT_ROWS[0], &ork_board::Chip::rk3588())
            .unwrap();
    let d = f(p, "decode_tok_s");
    let w = want.decode_tok_s.unwrap();
    assert!(
        (d / w - 1.0).abs() < 0.02,
        "plan {d} vs calibration {w}: {p}"
    );
    assert!((f(p, "ttft_s") / want.ttft_s - 1.0).abs() < 0.02, "{p}");
}
