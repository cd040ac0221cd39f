//! `ork run --draft …`: speculative decoding gives the plain greedy text and reports the draft's
//! figures; unusable draft settings are one clear line and exit code 2.

use crate::{code, converted, json, model, run, stderr};

/// `ork run --json` on the converted pack at `budget_mb` with extra flags.
fn run_args(budget_mb: u64, extra: &[&str]) -> std::process::Output {
    let m = model();
    let budget = budget_mb.to_string();
    let mut args = vec![
        "run",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        converted().to_str().unwrap(),
        "--budget-mb",
        &budget,
        "--device",
        "emu",
        "--prompt",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
        "-n",
        "16",
        "--json",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn run_with_a_draft_gives_the_plain_greedy_text_and_reports_the_draft() {
    // A quarter of the model's 135 MiB: the verifier streams.
    let plain = run_args(34, &[]);
    assert_eq!(code(&plain), Some(0), "{}", stderr(&plain));
    let plain = json(&plain);
    assert!(plain["streamed_bytes_per_token"].as_f64().unwrap() > 0.0);
    for draft in [&["lookup"][..], &["self"], &["lookup", "--draft-tree", "8"]] {
        let mut extra = vec!["--draft", draft[0], "--draft-max", "4"];
        extra.extend_from_slice(&draft[1..]);
        let o = run_args(34, &extra);
        assert_eq!(code(&o), Some(0), "{draft:?}: {}", stderr(&o));
        let v = json(&o);
        assert_eq!(v["tokens"], plain["tokens"], "{draft:?}");
        assert_eq!(v["text"], plain["text"], "{draft:?}");
        for key in [
            "drafted",
            "accepted",
            "verifier_passes",
            "draft_bytes",
            "draft_max",
        ] {
            assert!(v[key].is_u64(), "{draft:?}: {key} missing in {v}");
        }
        for key in [
            "acceptance_rate",
            "tokens_per_pass",
            "streamed_bytes_per_token",
        ] {
            assert!(v[key].is_f64(), "{draft:?}: {key} missing in {v}");
        }
        assert!(v["verifier_passes"].as_u64().unwrap() <= 16, "{v}");
        assert!(v["tokens_per_pass"].as_f64().unwrap() >= 1.0, "{v}");
    }
}

#[test]
fn unusable_draft_settings_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    for extra in [
        &["--draft", "lookup", "--draft-max", "0"][..],
        &["--draft", "lookup", "--draft-tree", "0"],
        &["--draft-tree", "4"],
        &["--draft-max", "4"],
        &["--draft", "self:0"],
        &["--draft", "self:31"],
        &["--draft", missing.to_str().unwrap()],
        &["--draft", "lookup", "--draft-p-min", "1.5"],
    ] {
        let o = run_args(1024, extra);
        assert_eq!(code(&o), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{extra:?}");
    }
}
