//! `ork run`, `ork plan`, `ork perplexity`, `ork bench stream` on the real model: the acceptance
//! tests of the residency/executor and prefetch issues.

use std::path::Path;

use crate::{code, json, model, run, stderr};

const PROMPT: &str = "The capital of France is";

/// `ork run --json` with the given extra flags; returns the JSON object (asserting exit 0).
fn run_json(pack: &Path, budget_mb: u64, extra: &[&str]) -> serde_json::Value {
    let m = model();
    let budget = budget_mb.to_string();
    let mut args = vec![
        "run",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--budget-mb",
        &budget,
        "--device",
        "emu",
        "--prompt",
        PROMPT,
        "-n",
        "12",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_eq!(code(&o), Some(0), "ork run failed: {}", stderr(&o));
    json(&o)
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("missing {k} in {v}"))
}

/// The packed model's bytes, from `ork plan --json`.
fn model_bytes() -> u64 {
    let m = model();
    let o = run(&["plan", "--model", m.to_str().unwrap(), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    u(&json(&o), "model_bytes")
}

#[test]
fn convert_then_reload_same_text_as_resident_and_other_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let quarter_mb = model_bytes().div_ceil(4) >> 20;
    // Pass 1: no .orkpack yet → everything packed; pass 2: everything loaded, nothing packed.
    let first = run_json(&pack, quarter_mb + 1, &[]);
    let second = run_json(&pack, quarter_mb + 1, &[]);
    assert_eq!(u(&first, "packed"), 211, "{first}");
    assert_eq!(u(&second, "packed"), 0, "{second}");
    assert!(u(&second, "loaded") >= 211, "{second}");
    // Streaming takes evicted weights' buffers instead of allocating (the first pass through
    // the blocks allocates; nearly every later load reuses).
    assert!(
        u(&second, "buffers_reused") * 10 >= (u(&second, "loaded") - 211) * 9,
        "{second}"
    );
    let text = first["text"].as_str().unwrap();
    assert!(text.starts_with(" Paris"), "greedy continuation: {text:?}");
    assert_eq!(first["text"], second["text"]);
    // Fully resident, a middle budget, and without prefetch: the same text.
    let resident = run_json(&pack, 1024, &[]);
    assert_eq!(resident["mode"], "resident");
    assert_eq!(u(&resident, "evictions"), 0);
    assert_eq!(resident["text"], first["text"]);
    // Resident, the first pass's loads run on the first-pass loader, ahead of compute (each
    // weight still loaded once); `--no-prefetch` turns it off.
    assert!(u(&resident, "prefetched") > 0, "{resident}");
    assert_eq!(
        u(&resident, "loaded") + u(&resident, "packed"),
        211,
        "{resident}"
    );
    let resident_off = run_json(&pack, 1024, &["--no-prefetch"]);
    assert_eq!(u(&resident_off, "prefetched"), 0, "{resident_off}");
    assert_eq!(resident_off["text"], first["text"]);
    let middle = run_json(&pack, 80, &[]);
    assert_eq!(middle["text"], first["text"]);
    // `--threads` sizes the compute pool (it was once silently ignored: loading the model used
    // rayon first, which built the pool before the engine could), and the text does not change.
    for t in [1u64, 3] {
        let v = run_json(&pack, 1024, &["--threads", &t.to_string()]);
        assert_eq!(u(&v, "threads"), t, "{v}");
        assert_eq!(v["text"], first["text"]);
    }
    let no_prefetch = run_json(&pack, quarter_mb + 1, &["--no-prefetch"]);
    assert_eq!(no_prefetch["text"], first["text"]);
    assert_eq!(u(&no_prefetch, "prefetched"), 0);
}

/// `--kv-cache` picks what the KV cache stores; `run --json` reports it and its bytes: an f32
/// cache holds twice the f16 one's, keys and values of every position in every layer.
#[test]
fn the_kv_cache_type_is_chosen_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let f16 = run_json(&pack, 1024, &[]);
    let f32 = run_json(&pack, 1024, &["--kv-cache", "f32"]);
    assert_eq!(
        (&f16["kv_cache"], &f32["kv_cache"]),
        (&"f16".into(), &"f32".into())
    );
    let positions = u(&f16, "prefill_tokens") + u(&f16, "decode_tokens");
    // SmolLM2: 30 layers, keys and values of 3 heads × 64 each.
    assert_eq!(
        u(&f16, "kv_cache_bytes"),
        positions * 30 * 2 * 192 * 2,
        "{f16}"
    );
    assert_eq!(
        u(&f32, "kv_cache_bytes"),
        2 * u(&f16, "kv_cache_bytes"),
        "{f32}"
    );
    assert!(f32["text"].as_str().unwrap().starts_with(" Paris"), "{f32}");
    let m = model();
    let o = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "x",
        "--kv-cache",
        "f8",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("f8"), "{}", stderr(&o));
}

#[test]
fn quarter_budget_streams_with_zero_wall_hits_within_budget() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q.orkpack");
    let budget_mb = (model_bytes().div_ceil(4) >> 20) + 1;
    let v = run_json(&pack, budget_mb, &[]);
    assert_eq!(v["mode"], "streamed");
    assert_eq!(u(&v, "wall_hits"), 0, "{v}");
    assert!(u(&v, "evictions") > 0, "a quarter budget must evict: {v}");
    assert!(u(&v, "peak_resident_bytes") <= budget_mb << 20, "{v}");
    assert!(u(&v, "prefetched") > 0, "{v}");
}

#[test]
fn stale_or_corrupt_pack_is_repacked_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("c.orkpack");
    let clean = run_json(&pack, 1024, &[]);
    // Flip one byte inside the first blob (blobs start at 4096-aligned offsets after the header).
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[4096 + 100] ^= 0x5a;
    std::fs::write(&pack, &bytes).unwrap();
    let repaired = run_json(&pack, 1024, &[]);
    assert!(u(&repaired, "packed") >= 1, "{repaired}");
    assert_eq!(repaired["text"], clean["text"]);
    // And the file was rewritten: a third run packs nothing.
    let third = run_json(&pack, 1024, &[]);
    assert_eq!(u(&third, "packed"), 0, "{third}");
    assert_eq!(third["text"], clean["text"]);
}

#[test]
fn on_the_fly_packing_without_a_pack_file_gives_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("p.orkpack");
    let with_pack = run_json(&pack, 1024, &[]);
    let m = model();
    let o = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--no-pack",
        "--budget-mb",
        "1024",
        "--prompt",
        PROMPT,
        "-n",
        "12",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["text"], with_pack["text"]);
    assert_eq!(u(&v, "loaded"), 0);
    assert_eq!(u(&v, "packed"), 211);
}

#[test]
fn int4_weights_run_in_half_the_device_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("i4.orkpack");
    let i8 = run_json(&pack, 1024, &[]);
    // The same file is repacked to int4 (every entry is stale for the other dtype). int8
    // activations × int4 weights exist on the RK3576 only.
    let i4 = run_json(&pack, 1024, &["--dtype", "i4", "--soc", "rk3576"]);
    assert_eq!(
        (i4["soc"].as_str(), i4["matmul_type"].as_str()),
        (Some("rk3576"), Some("int8xint4"))
    );
    assert_eq!(
        (i8["soc"].as_str(), i8["matmul_type"].as_str()),
        (Some("rk3588"), Some("int8xint8"))
    );
    assert_eq!(u(&i4, "packed"), 211, "{i4}");
    let (a, b) = (u(&i8, "peak_resident_bytes"), u(&i4, "peak_resident_bytes"));
    assert!(b * 2 <= a + (211 << 12), "int4 {b} vs int8 {a} bytes");
}

#[test]
fn a_matmul_type_the_chip_lacks_is_refused_before_converting() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("chip.orkpack");
    let m = model();
    for (extra, needle) in [
        (&["--act", "f16"][..], "fp16 × int8"),
        (&["--act", "f16", "--dtype", "i4"][..], "fp16 × int4"),
        (&["--dtype", "i4"][..], "int8 × int4"),
        (&["--dtype", "f16"][..], "int8 × fp16"),
    ] {
        let mut args = vec!["run", "--model", m.to_str().unwrap(), "--pack"];
        args.push(pack.to_str().unwrap());
        args.extend(["--prompt", "Hi", "-n", "2"]);
        args.extend(extra);
        let o = run(&args);
        assert_eq!(code(&o), Some(2), "{extra:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("rk3588") && err.contains(needle),
            "{extra:?}: {err}"
        );
        assert!(
            !pack.exists(),
            "{extra:?}: nothing may be converted for a refused run"
        );
    }
    // The same fp16 activations are the RK3576's w8a16.
    let v = run_json(&pack, 1024, &["--act", "f16", "--soc", "rk3576"]);
    assert_eq!(v["matmul_type"].as_str(), Some("fp16xint8"), "{v}");
    let o = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--soc",
        "rk9999",
        "--prompt",
        "Hi",
    ]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("rk9999"), "{}", stderr(&o));
}

#[test]
fn chat_template_runs() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("chat.orkpack");
    let v = run_json(&pack, 1024, &["--chat"]);
    assert!(!v["text"].as_str().unwrap().is_empty(), "{v}");
}

#[test]
fn bad_inputs_fail_with_one_clear_line() {
    let m = model();
    let ms = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("b.orkpack");
    let ps = pack.to_str().unwrap();
    let check = |args: &[&str], needle: &str| {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(code(&o), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err:?}"
        );
        assert_eq!(
            err.trim_end()
                .lines()
                .filter(|l| l.starts_with("error"))
                .count(),
            1,
            "{err}"
        );
    };
    // Budget below the largest weight: the error says the minimum.
    check(
        &[
            "run",
            "--model",
            ms,
            "--pack",
            ps,
            "--budget-mb",
            "8",
            "--prompt",
            "hi",
        ],
        "minimum budget is 27 MiB",
    );
    // Empty prompt.
    check(
        &["run", "--model", ms, "--pack", ps, "--prompt", ""],
        "empty",
    );
    // Prompt longer than the context: refused before the .orkpack is converted.
    let long = "word ".repeat(9000);
    let fresh = dir.path().join("never.orkpack");
    check(
        &[
            "run",
            "--model",
            ms,
            "--pack",
            fresh.to_str().unwrap(),
            "--prompt",
            &long,
            "-n",
            "1",
        ],
        "context",
    );
    assert!(
        !fresh.exists(),
        "a refused prompt must not cost a conversion"
    );
    // Invalid UTF-8 in --prompt-file names the file.
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"ok \xff\xfe here").unwrap();
    check(
        &[
            "run",
            "--model",
            ms,
            "--pack",
            ps,
            "--prompt-file",
            bad.to_str().unwrap(),
        ],
        "bad.txt",
    );
    // A GGUF of an unsupported architecture names it.
    let arch = dir.path().join("mamba.gguf");
    ork_gguf::writer::GgufBuilder::new()
        .kv(
            "general.architecture",
            ork_gguf::MetaValue::String("mamba".into()),
        )
        .tensor_f32(
            "token_embd.weight",
            &[32, 8],
            ork_gguf::GgmlType::F32,
            &[0.5; 256],
        )
        .unwrap()
        .write(&arch)
        .unwrap();
    check(
        &[
            "run",
            "--model",
            arch.to_str().unwrap(),
            "--no-pack",
            "--prompt",
            "hi",
        ],
        "mamba",
    );
}

#[test]
fn plan_resident_across_domains_and_streamed_figures() {
    let m = model();
    let ms = m.to_str().unwrap();
    // A 64 MiB window cannot hold the 128 MiB model: with 4 domains it is resident across 3.
    let o = run(&[
        "plan",
        "--model",
        ms,
        "--window-mb",
        "64",
        "--domains",
        "4",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["mode"], "resident", "{v}");
    assert_eq!(u(&v, "domains_used"), 3);
    assert_eq!(u(&v, "switches_per_pass"), 3);
    assert_eq!(u(&v, "streamed_bytes_per_decode_token"), 0);
    // One domain and a 40 MiB budget: streamed, decode bandwidth-bound.
    let o = run(&["plan", "--model", ms, "--budget-mb", "40", "--json"]);
    let v = json(&o);
    assert_eq!(v["mode"], "streamed");
    assert_eq!(v["decode_bandwidth_bound"], true);
    assert!(u(&v, "streamed_bytes_per_decode_token") > 64 << 20, "{v}");
}

#[test]
fn multi_domain_run_matches_single_domain() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("d.orkpack");
    let one = run_json(&pack, 1024, &[]);
    // 48 MiB per domain → the model is placed resident across 4 domains.
    let four = run_json(&pack, 48, &["--domains", "4"]);
    assert_eq!(four["mode"], "resident", "{four}");
    assert_eq!(four["text"], one["text"]);
    assert_eq!(u(&four, "evictions"), 0);
}

#[test]
fn perplexity_is_finite_and_plausible() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    let para =
        "The quick brown fox jumps over the lazy dog. Scientists study the stars to learn how \
                the universe began, and engineers build machines that help people every day. ";
    std::fs::write(&text, para.repeat(40)).unwrap();
    let pack = dir.path().join("ppl.orkpack");
    let o = run(&[
        "perplexity",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--file",
        text.to_str().unwrap(),
        "--ctx",
        "128",
        "--chunks",
        "2",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let ppl = v["ppl"].as_f64().unwrap();
    // Repeated text is very predictable: far below the vocabulary size, and above 1.
    assert!(ppl > 1.0 && ppl < 50.0, "{v}");
    assert_eq!(v["chunks"], 2, "--chunks is honoured exactly: {v}");
    // One chunk is one chunk (it used to be silently raised to two).
    let o = run(&[
        "perplexity",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--file",
        text.to_str().unwrap(),
        "--ctx",
        "128",
        "--chunks",
        "1",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["chunks"], 1);
}

#[test]
fn run_writes_a_trace_and_bench_stream_reports_ratios() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("s.orkpack");
    let trace = dir.path().join("trace.json");
    run_json(&pack, 40, &["--trace", trace.to_str().unwrap()]);
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["cat"] == "compute"));
    assert!(
        events.iter().any(|e| e["cat"] == "load" && e["tid"] == 2),
        "prefetch lane has loads"
    );

    let svg = dir.path().join("stream.svg");
    let o = run(&[
        "bench",
        "stream",
        "--model",
        m.to_str().unwrap(),
        "--pack",
        pack.to_str().unwrap(),
        "--tokens",
        "32",
        "--plot",
        svg.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert!(v["streamed_over_resident"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 3);
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") || s.contains("<svg"), "an SVG file");
}

/// A MoE model (the qwen3moe fixture of `ork_testkit::moe`): `ork plan` reports the expert
/// figures; `ork run --json` reports expert hits and the speculative prefetch, which
/// `--no-speculate` turns off without changing the text.
#[test]
fn plan_and_run_report_expert_figures_on_a_moe_model() {
    let m = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    let ms = m.to_str().unwrap();
    let o = run(&["plan", "--model", ms, "--budget-mb", "40", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!((u(&v, "experts"), u(&v, "experts_used")), (8, 2), "{v}");
    let active = v["active_bytes_per_token"].as_f64().unwrap();
    let expected = v["expected_streamed_bytes_per_token"].as_f64().unwrap();
    assert!(
        u(&v, "expert_bytes") > 0 && active < u(&v, "model_bytes") as f64,
        "{v}"
    );
    assert!(expected <= active && expected > 0.0, "{v}");

    let run_moe = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            ms,
            "--no-pack",
            "--budget-mb",
            "40",
            "--device",
            "emu",
            "--prompt",
            PROMPT,
            "-n",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        json(&o)
    };
    let spec = run_moe(&[]);
    let plain = run_moe(&["--no-speculate"]);
    assert_eq!(spec["text"], plain["text"]);
    assert!(u(&spec["experts"], "predictions") > 0, "{spec}");
    assert!(spec["experts"]["recall"].as_f64().is_some(), "{spec}");
    assert_eq!(u(&plain["experts"], "predictions"), 0, "{plain}");
    assert!(u(&spec["experts"], "expert_matmuls") > 0 && u(&spec, "bytes_streamed") > 0);

    // The warmed decode benchmark: six configurations, the same greedy tokens in each, decode
    // counters (streamed bytes, recall) only where they apply.
    let o = run(&[
        "bench",
        "stream",
        "--model",
        ms,
        "--no-pack",
        "--budget-mb",
        "40",
        "--tokens",
        "4",
        "--decode",
        "3",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let results = v["results"].as_array().unwrap();
    let configs: Vec<&str> = results
        .iter()
        .map(|r| r["config"].as_str().unwrap())
        .collect();
    assert_eq!(
        configs,
        [
            "resident",
            "streamed",
            "streamed, speculation k",
            "streamed, speculation k+2",
            "streamed, no speculation",
            "streamed, no prefetch"
        ]
    );
    for r in results {
        assert_eq!(r["same_tokens_as_resident"], true, "{v}");
        assert_eq!(u(r, "decode_tokens"), 3, "{v}");
    }
    assert_eq!(
        results[0]["mib_per_token"].as_f64(),
        Some(0.0),
        "warmed: {v}"
    );
    for r in &results[1..4] {
        assert!(r["recall"].as_f64().is_some(), "{v}");
    }
    for r in &results[4..] {
        assert!(r["recall"].is_null(), "{v}");
    }
    // More predicted experts per block can only find more of the used ones.
    let recall = |i: usize| results[i]["recall"].as_f64().unwrap();
    assert!(recall(2) <= recall(1) && recall(1) <= recall(3), "{v}");
}

/// `--quant`: an unknown name and a quant the chip lacks (w4a16, w4a16-g32 on the RK3588) are
/// each one clear error and convert writes nothing; `ork plan` names the chip, the type pair and
/// the lm head's split.
#[test]
fn quant_refusals_and_the_plan_of_the_chip() {
    let m = model();
    let ms = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q.orkpack");
    let ps = pack.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["convert", ms, "-o", ps, "--quant", "w8a8-g64"],
            "w8a8-g64",
        ),
        (vec!["convert", ms, "-o", ps, "--quant", "w4a16"], "rk3576"),
        (
            vec!["convert", ms, "-o", ps, "--quant", "w4a16-g32"],
            "rk3576",
        ),
    ] {
        let o = run(&args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!pack.exists(), "{args:?}: nothing may be written");
    }
    let o = run(&["plan", "--model", ms, "--quant", "w8a8-g128", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let chip = &v["chip"];
    assert_eq!(chip["soc"].as_str(), Some("rk3588"), "{v}");
    assert_eq!(
        (chip["a"].as_str(), chip["b"].as_str()),
        (Some("int8"), Some("int8"))
    );
    assert_eq!(chip["grouped"].as_u64(), Some(30));
    assert_eq!(chip["split"][0]["name"].as_str(), Some("token_embd.weight"));
    assert_eq!(chip["split"][0]["n_chunks"].as_u64(), Some(12));
}

/// `--smooth-targets` reaches the pack: the same set reuses it, another set rebuilds it with
/// the reason on stderr; a set without `norm`, or the flag without `--calib`, is refused.
#[test]
fn smooth_targets_select_the_smoothing_and_a_set_without_norm_is_refused() {
    let m = model();
    let ms = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let calib = dir.path().join("calib.txt");
    std::fs::write(
        &calib,
        // Above ork_runtime::CALIB_MIN_TOKENS (about 15 tokens a sentence).
        "A short calibration text about rivers, mountains and the weather in spring. ".repeat(6),
    )
    .unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "Ships sail from the harbour at night. ".repeat(40)).unwrap();
    let pack = dir.path().join("sm.orkpack");
    let (cs, ps, ts) = (
        calib.to_str().unwrap(),
        pack.to_str().unwrap(),
        text.to_str().unwrap(),
    );
    let o = run(&[
        "convert",
        ms,
        "-o",
        ps,
        "--calib",
        cs,
        "--smooth-targets",
        "norm,vo",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let ppl = |targets: &str| {
        run(&[
            "perplexity",
            "--model",
            ms,
            "--pack",
            ps,
            "--file",
            ts,
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--calib",
            cs,
            "--smooth-targets",
            targets,
            "--json",
        ])
    };
    let same = ppl("norm,vo");
    assert_eq!(code(&same), Some(0), "{}", stderr(&same));
    assert!(
        !stderr(&same).contains("was asked for"),
        "{}",
        stderr(&same)
    );
    let other = ppl("all");
    assert_eq!(code(&other), Some(0), "{}", stderr(&other));
    let err = stderr(&other);
    assert!(
        err.contains("targets norm,vo") && err.contains("targets all"),
        "{err}"
    );
    for (args, needle) in [
        (
            vec![
                "perplexity",
                "--model",
                ms,
                "--file",
                ts,
                "--calib",
                cs,
                "--smooth-targets",
                "vo",
            ],
            "norm",
        ),
        (
            vec![
                "perplexity",
                "--model",
                ms,
                "--file",
                ts,
                "--smooth-targets",
                "all",
            ],
            "--calib",
        ),
    ] {
        let o = run(&args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}
