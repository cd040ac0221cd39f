//! `--device rknn` against the CI stand-in runtime (`ORK_RKNN_LIB`, built by scripts/test.sh):
//! the real model's greedy text equals the emulator's, resident and streamed; a failing runtime
//! call and a missing library end the run with exit 2 naming them.

use crate::{code, converted, json, model, ork, stderr};

const PROMPT: &str = "The capital of France is";

fn standin() -> String {
    ork_testkit::rknn_standin().to_string_lossy().into_owned()
}

/// `ork run --json` on the shared converted pack with `device`, `budget_mb` and extra env.
fn run_on(device: &str, budget_mb: &str, env: &[(&str, &str)]) -> std::process::Output {
    run_with(device, budget_mb, &[], env)
}

/// [`run_on`] with extra `ork run` arguments.
fn run_with(
    device: &str,
    budget_mb: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let m = model();
    let mut cmd = ork();
    cmd.args([
        "run",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        converted().to_str().unwrap(),
        "--budget-mb",
        budget_mb,
        "--device",
        device,
        "--prompt",
        PROMPT,
        "-n",
        "8",
        "--json",
    ]);
    cmd.args(args);
    cmd.env("ORK_RKNN_LIB", standin());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn the_real_model_through_rknn_equals_the_emulator() {
    for budget in ["1024", "40"] {
        // With the prefetcher (the default) and without it. A streamed run's eviction count
        // depends on how far the prefetcher gets ahead of compute, which is timing: the same
        // emulator run at 40 MiB evicted 1505 or 1507 weights. Without it the cache follows
        // compute alone, and the accounting must match exactly.
        for prefetch in [true, false] {
            let args: &[&str] = if prefetch { &[] } else { &["--no-prefetch"] };
            let emu = run_with("emu", budget, args, &[]);
            assert_eq!(code(&emu), Some(0), "{}", stderr(&emu));
            let rknn = run_with("rknn", budget, args, &[]);
            assert_eq!(code(&rknn), Some(0), "{}", stderr(&rknn));
            let (e, r) = (json(&emu), json(&rknn));
            let at = format!("budget {budget} MiB, prefetch {prefetch}");
            assert_eq!(r["text"], e["text"], "{at}");
            assert_eq!(r["tokens"], e["tokens"], "{at}");
            // The same window accounting: the same placement, evictions and wall hits.
            let keys: &[&str] = if prefetch {
                &["mode", "wall_hits"]
            } else {
                &["mode", "evictions", "wall_hits", "peak_resident_bytes"]
            };
            for k in keys {
                assert_eq!(r[k], e[k], "{k} at {at}");
            }
        }
    }
}

#[test]
fn a_failing_runtime_call_ends_the_run_naming_it() {
    let o = run_on(
        "rknn",
        "1024",
        &[("ORK_RKNN_STANDIN_FAIL", "rknn_matmul_run=-2")],
    );
    assert_eq!(code(&o), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("rknn_matmul_run") && err.contains("-2"),
        "{err}"
    );
    let o = run_on(
        "rknn",
        "1024",
        &[("ORK_RKNN_LIB", "/nonexistent/librknnrt.so")],
    );
    assert_eq!(code(&o), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/librknnrt.so"),
        "{}",
        stderr(&o)
    );
}

/// `ork doctor` on this machine (no NPU; the runtime library hidden): exit 0, says there is no
/// NPU and what it would check.
#[test]
fn doctor_without_an_npu_passes_and_says_what_it_would_check() {
    let o = ork()
        .args(["doctor"])
        .env("ORK_RKNN_LIB", "/nonexistent/librknnrt.so")
        .output()
        .unwrap();
    // An ORK_RKNN_LIB that does not load is a failed check (exit 1), naming it.
    assert_eq!(code(&o), Some(1), "{}", crate::stdout(&o));
    assert!(crate::stdout(&o).contains("/nonexistent/librknnrt.so"));
    let o = ork()
        .args(["doctor", "--json"])
        .env_remove("ORK_RKNN_LIB")
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", crate::stdout(&o));
    let v = json(&o);
    assert_eq!(v["passed"], true);
    assert_eq!(v["target"], "none");
    let checks = v["checks"].as_array().unwrap();
    let skipped: Vec<&serde_json::Value> =
        checks.iter().filter(|c| c["status"] == "skip").collect();
    assert!(skipped.len() >= 5, "{v}");
    assert!(skipped.iter().all(|c| c["detail"]
        .as_str()
        .unwrap()
        .contains("no NPU: would check")));
    // No NPU, no calibration figures: the emulator's timings are not a board's.
    assert!(v["calibration"].is_null(), "{v}");
    assert!(skipped.iter().any(|c| c["name"] == "calibration"), "{v}");
    let o = ork()
        .args(["doctor"])
        .env_remove("ORK_RKNN_LIB")
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0));
    assert!(
        crate::stdout(&o).contains("no NPU here"),
        "{}",
        crate::stdout(&o)
    );
}

/// Against the stand-in the matmul and DMA checks run, labelled as the stand-in's.
#[test]
fn doctor_against_the_stand_in_runs_the_matmul_checks() {
    let o = ork()
        .args(["doctor", "--json"])
        .env("ORK_RKNN_LIB", standin())
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", crate::stdout(&o));
    let v = json(&o);
    assert_eq!(v["target"], "stand-in");
    let passed: Vec<String> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "pass")
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert!(passed.len() >= 6, "{v}");
    assert!(
        passed.iter().all(|n| n.ends_with("[stand-in]")),
        "{passed:?}"
    );
    assert!(passed.iter().any(|n| n.contains("per-group")));
    assert!(passed.iter().any(|n| n.contains("N-chunks")));
    // The board clock's recalibration figures are measured and labelled as the stand-in's: not
    // a board's.
    let c = &v["calibration"];
    assert_eq!(c["measured_on"], "stand-in", "{v}");
    assert_eq!(c["board_figures"], false, "{v}");
    for k in [
        "call_s",
        "npu_read_bw",
        "npu_int8_ops",
        "memcpy_bw",
        "sync_s_per_byte",
        "host_read_bw",
    ] {
        let x = c["parameters"][k].as_f64().unwrap();
        assert!(x.is_finite() && x > 0.0, "{k}: {c}");
    }
    let lines: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "calibration [stand-in]")
        .map(|c| c["detail"].as_str().unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("NOT a board's")),
        "{lines:?}"
    );
}
