//! `--decode-device split`: a run whose decode matmuls' rows are shared between the emulated
//! NPU and the CPU engine, its report, its plan, and the flags refused. The numerics bound of
//! the split (every row once, on its engine, bit for bit) is `ork-runtime`'s `tests/split.rs`.

use super::{code, converted, json, model, ork, run, stderr};

fn run_split(device: &[&str]) -> serde_json::Value {
    let m = model();
    let pack = converted();
    let mut args = vec![
        "run",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--threads",
        "2",
        "--prompt",
        "The capital of France is",
        "-n",
        "8",
        "--json",
    ];
    args.extend_from_slice(device);
    let o = run(&args);
    assert_eq!(code(&o), Some(0), "{device:?}: {}", stderr(&o));
    json(&o)
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

#[test]
fn plan_prints_the_split_and_where_its_share_comes_from() {
    let m = model();
    let o = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        "--decode-device",
        "split",
        "--project",
        "orangepi5-16g",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
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
    let cases: [(&[&str], &str); 8] = [
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
        (&["--device", "split"], "decode steps only"),
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
