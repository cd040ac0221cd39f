//! `--prefill-device` / `--decode-device`: a mixed run, its plan, and the pairings refused.

use super::{code, converted, json, model, ork, run, stderr};

#[test]
fn a_mixed_run_reports_its_engines_and_is_deterministic() {
    let m = model();
    let pack = converted();
    let go = || {
        let o = run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--pack",
            pack.to_str().unwrap(),
            "--prefill-device",
            "emu",
            "--decode-device",
            "cpu",
            "--threads",
            "2",
            "--prompt",
            "The capital of France is",
            "-n",
            "8",
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        json(&o)
    };
    let (a, b) = (go(), go());
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(a["engines"]["prefill"], "device");
    assert_eq!(a["engines"]["decode"], "cpu");
    assert_eq!(a["npu_weights"]["source"], "pack");
    assert!(a["npu_weights"]["pack_bytes"].as_u64().unwrap() > 0);
    let device = a["device"].as_str().unwrap();
    assert!(device.ends_with(", decode cpu"), "{device}");
}

#[test]
fn plan_says_where_the_device_weights_come_from_and_why() {
    let m = model();
    let o = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        "--prefill-device",
        "emu",
        "--decode-device",
        "cpu",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["engines"]["decode"], "cpu");
    let w = &v["npu_weights"];
    assert_eq!(w["pack_bytes"], v["model_bytes"]);
    let gguf = std::fs::metadata(&m).unwrap().len();
    assert_eq!(w["gguf_bytes"].as_u64(), Some(gguf));
    assert!(!w["why"].as_str().unwrap().is_empty());
}

#[test]
fn pairings_that_cannot_run_exit_2() {
    let m = model();
    let m = m.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &[
            "run",
            "--model",
            m,
            "--prefill-device",
            "emu",
            "--decode-device",
            "rknn",
            "--prompt",
            "x",
        ],
        &[
            "run",
            "--model",
            m,
            "--decode-device",
            "cpu",
            "--calib",
            m,
            "--prompt",
            "x",
        ],
        &[
            "perplexity",
            "--model",
            m,
            "--decode-device",
            "cpu",
            "--file",
            m,
        ],
        &[
            "run",
            "--model",
            m,
            "--no-pack",
            "--prefill-device",
            "rknn",
            "--decode-device",
            "cpu",
            "--prompt",
            "x",
        ],
    ];
    for args in cases {
        // No vendor runtime: `rknn` cannot open.
        let o = ork()
            .args(args)
            .env("ORK_RKNN_LIB", "/nonexistent/librknnrt.so")
            .output()
            .unwrap();
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.lines().count() == 1, "{args:?}: {e}");
    }
}
