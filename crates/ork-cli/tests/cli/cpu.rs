//! `--device cpu`: runs, its stats and plan, and what it refuses.

use super::{code, json, model, run, stderr};

#[test]
fn run_on_the_cpu_is_the_same_with_one_and_two_threads() {
    let m = model();
    let go = |threads: &str| {
        let o = run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "cpu",
            "--threads",
            threads,
            "--prompt",
            "The capital of France is",
            "-n",
            "12",
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        json(&o)
    };
    let (one, two) = (go("1"), go("2"));
    // Rows are computed independently of how they are split: the same bits, the same tokens.
    assert_eq!(one["tokens"], two["tokens"]);
    assert_eq!(one["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(one["device"], "cpu");
    assert_eq!(
        (one["threads"].as_u64(), two["threads"].as_u64()),
        (Some(1), Some(2))
    );
    assert!(one["mode"].is_null());
    // No weight was loaded, packed or copied into a device.
    for k in ["loaded", "packed", "bytes_streamed"] {
        assert_eq!(one[k].as_u64(), Some(0), "{k}");
    }
    assert!(one["rss_anon_bytes"].as_u64().unwrap() > 0);
    assert!(one["decode_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn plan_on_the_cpu_reports_the_weights_in_place() {
    let m = model();
    let o = run(&[
        "plan",
        "--model",
        m.to_str().unwrap(),
        "--device",
        "cpu",
        "--threads",
        "2",
        "--ctx",
        "256",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["threads"], 2);
    let types = v["types"].as_array().unwrap();
    let sum: u64 = types.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(v["mapped_bytes"].as_u64(), Some(sum));
    assert!(types.iter().any(|t| t["type"] == "Q4_1"));
    // SmolLM2: 30 layers, K and V of 3 heads × 64 at 256 positions, f16.
    assert_eq!(v["kv_bytes"].as_u64(), Some(30 * 2 * 192 * 256 * 2));
}

#[test]
fn device_only_verbs_and_flags_refuse_the_cpu() {
    let m = model();
    let m = m.to_str().unwrap();
    let cases: [&[&str]; 6] = [
        &["bench", "stream", "--model", m, "--device", "cpu"],
        &["bench", "spec", "--model", m, "--device", "cpu"],
        &["probe", "stream", "--device", "cpu"],
        &["run", "--model", m, "--cpus", "0", "--prompt", "x"],
        &["plan", "--model", m, "--threads", "2"],
        &[
            "run", "--model", m, "--device", "cpu", "--calib", m, "--prompt", "x",
        ],
    ];
    for args in cases {
        let o = run(args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("cpu") && e.lines().count() == 1, "{args:?}: {e}");
    }
}
