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
    let cases: [(&[&str], &str); 7] = [
        (
            &["--decode-device", "split", "--split-rows", "1.5"],
            "--split-rows",
        ),
        (
            &["--decode-device", "split", "--split-rows", "0"],
            "--split-rows",
        ),
        (&["--decode-device", "split"], "--split-rows FRACTION"),
        (&["--split-rows", "0.5"], "--decode-device split"),
        (&["--device", "split"], "decode steps only"),
        (
            &[
                "--device",
                "cpu",
                "--decode-device",
                "split",
                "--split-rows",
                "0.5",
            ],
            "names no device",
        ),
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
