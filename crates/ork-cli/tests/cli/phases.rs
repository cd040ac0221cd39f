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

/// `--pin-mb` with the decode on the CPU engine and the prefill on the emulator, on a MoE
/// fixture (SmolLM2's weights as a qwen3moe): accepted, and the budget reaches the CPU engine:
/// its expert figures carry the 16 MiB budget, and the stats line says what was pinned.
#[test]
fn pin_mb_reaches_the_cpu_engine_of_a_mixed_pairing() {
    let m = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    let go = |json: bool| {
        let mut args = vec!["run", "--model", m.to_str().unwrap()];
        let engines = "--no-pack --prefill-device emu --decode-device cpu --threads 2";
        args.extend(engines.split(' '));
        args.extend([
            "--pin-mb",
            "16",
            "-n",
            "8",
            "--prompt",
            "The capital of France is",
        ]);
        if json {
            args.push("--json");
        }
        let o = run(&args);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        o
    };
    let v = json(&go(true));
    assert_eq!(v["engines"]["prefill"], "device", "{v}");
    assert_eq!(v["engines"]["decode"], "cpu", "{v}");
    let e = &v["cpu_experts"];
    assert_eq!(e["pin_budget_bytes"].as_u64(), Some(16 << 20), "{v}");
    let pinned = e["pinned_bytes"].as_u64().unwrap();
    // Pinned within the budget, or the lock refused and said so (no CAP_IPC_LOCK).
    assert!(pinned <= 16 << 20, "{v}");
    assert!(pinned > 0 || e["pin_error"].is_string(), "{v}");
    let text = stderr(&go(false));
    assert!(
        text.contains("pinned") && text.contains("of 16.0 MiB"),
        "{text}"
    );
}

/// `--pin-mb` above this machine's RAM (the flag's largest value, 16 TiB), with the CPU engine
/// alone and beside the emulator: exit 2, one line naming the flag and the RAM.
#[test]
fn pin_mb_above_the_ram_exits_2_naming_the_flag_and_the_ram() {
    let m = model();
    let m = m.to_str().unwrap();
    let most = (1u64 << 24).to_string();
    let engines: [&[&str]; 2] = [
        &["--device", "cpu"],
        &["--prefill-device", "emu", "--decode-device", "cpu"],
    ];
    for e in engines {
        let base = ["run", "--model", m, "--no-pack", "--prompt", "x", "-n", "1"];
        let o = run(&[&base[..], e, &["--pin-mb", &most]].concat());
        assert_eq!(code(&o), Some(2), "{e:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{e:?}: {err}");
        assert!(
            err.contains("--pin-mb") && err.contains("MiB of RAM"),
            "{err}"
        );
    }
}
