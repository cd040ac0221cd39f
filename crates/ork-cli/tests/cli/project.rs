//! `--project BOARD`: the board clock on `ork run` and `ork plan` (docs/board-model.md).

use super::*;

const PROMPT: &str = "The capital of France is a city that many people like to visit because";

fn projected(v: &serde_json::Value) -> &serde_json::Value {
    let p = &v["projected"];
    assert_eq!(p["label"], "projected", "{v}");
    p
}

/// `ork plan --model ARGS[0] ARGS[1..] --project orangepi5-16g --json`'s `projected` object
/// (exit 0 asserted).
fn plan_projected(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["plan", "--model"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--project", "orangepi5-16g", "--json"]);
    let o = run(&a);
    assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
    projected(&json(&o)).clone()
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("missing {k} in {v}"))
}

/// `run --project` and `plan --project` on the same model and budget: the run's own events and
/// the planned schedule (which simulates ork's weight cache: what it keeps, which loads reuse a
/// buffer, the prefetcher's lookahead; docs/board-model.md) give TTFT and decode within 10 % of
/// each other, resident (3072 MiB) and streamed (100 MiB: 63 of SmolLM2's 211 weights loaded in
/// every pass); streamed is slower than resident. (At 40 MiB a run's own projection varies from
/// run to run — the emulator's timing decides whether ork's cache keeps the 28 MB output weight —
/// and 2 runs in 10 fell 5–10 % below the plan; docs/board-model.md.)
#[test]
fn plan_and_run_projections_agree_within_ten_percent() {
    let m = model();
    let ms = m.to_str().unwrap();
    let pack = converted().to_str().unwrap();
    let mut decode = Vec::new();
    for budget in ["3072", "100"] {
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
        for k in ["ttft_s", "decode_tok_s"] {
            let (a, b) = (f(&rp, k), f(pp, k));
            assert!(
                (a / b - 1.0).abs() <= 0.10,
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

/// `ork plan --project --draft`: the speculative schedule of `ork_board::spec`, labelled with its
/// draft and the acceptance given. Lookup drafts at acceptance 0 project plain decode (within
/// 10 %); at 0.9 faster; a model draft at acceptance 0 costs its passes; no acceptance: exit 2.
#[test]
fn plan_projects_speculative_decoding() {
    let m = model();
    let ms = m.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let base = [ms, "--budget-mb", "40", "--gen-tokens", "32"];
        plan_projected(&[&base[..], extra].concat())
    };
    let plain = plan(&[]);
    assert!(plain.get("schedule").is_none(), "{plain}");
    let d = |p: &serde_json::Value| f(p, "decode_tok_s");
    let lookup0 = plan(&["--draft", "lookup", "--draft-max", "4", "--acceptance", "0"]);
    let lookup9 = plan(&[
        "--draft",
        "lookup",
        "--draft-max",
        "4",
        "--acceptance",
        "0.9",
    ]);
    let self0 = plan(&["--draft", "self:3", "--draft-max", "4", "--acceptance", "0"]);
    assert!(
        (d(&lookup0) / d(&plain) - 1.0).abs() <= 0.10,
        "{lookup0} vs {plain}"
    );
    assert!(d(&lookup9) > 1.5 * d(&plain), "{lookup9} vs {plain}");
    assert!(d(&self0) < d(&lookup0), "{self0} vs {lookup0}");
    let s = lookup9["schedule"].as_str().unwrap();
    assert!(
        s.contains("lookup") && s.contains("0.9") && s.contains("not measured"),
        "{s}"
    );
    let o = run(&["plan", "--model", ms, "--project", "--draft", "lookup"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--acceptance"), "{}", stderr(&o));
}

/// `ork plan --project` on a MoE model (the qwen3moe fixture): the board clock's MoE schedule,
/// labelled with the expert cache and the prefetch mode. Resident (every expert cached) is
/// fastest; experts on demand (`--no-prefetch`) are slower than router-driven prefetch at the same
/// cache; a shared expert (qwen2moe) is refused naming it.
#[test]
fn plan_projects_a_moe_model() {
    use ork_testkit::moe::{moe_fixture, MoeFixture};
    let m = moe_fixture(MoeFixture::Qwen3Moe);
    let ms = m.to_str().unwrap();
    let plan = |extra: &[&str]| plan_projected(&[&[ms][..], extra].concat());
    let d = |p: &serde_json::Value| f(p, "decode_tok_s");
    let resident = plan(&[]);
    let small = ["--budget-mb", "40", "--expert-cache", "16"];
    let router = plan(&small);
    let on_demand = plan(&[&small[..], &["--no-prefetch"]].concat());
    let spec = plan(&[&small[..], &["--expert-recall", "0.8"]].concat());
    assert!(d(&resident) > d(&router), "{resident} vs {router}");
    assert!(d(&router) > d(&on_demand), "{router} vs {on_demand}");
    let label = |p: &serde_json::Value| p["schedule"].as_str().unwrap().to_owned();
    assert!(label(&router).contains("16 of 48") && label(&router).contains("router-driven"));
    assert!(label(&on_demand).contains("on demand"), "{on_demand}");
    assert!(label(&spec).contains("recall 0.8"), "{spec}");
    let shared = moe_fixture(MoeFixture::Qwen2Moe);
    let o = run(&["plan", "--model", shared.to_str().unwrap(), "--project"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("shared expert"), "{}", stderr(&o));
}

/// `ork bench spec` projects each configuration's last round on rk3588 beside the measured
/// figures: plain decode is the baseline (1.0) of its budget, streamed projects slower than
/// resident, and lookup drafts that yield more than one token per verifier pass project faster
/// than plain decode (they cost no device time).
#[test]
fn bench_spec_prints_projected_ratios() {
    let m = model();
    let o = run(&[
        "bench",
        "spec",
        "--model",
        m.to_str().unwrap(),
        "--no-pack",
        "--device",
        "emu",
        "--tokens",
        "8",
        "--rounds",
        "1",
        "--drafts",
        "lookup",
        "--budgets-mb",
        "40",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["projected_board"], "rk3588");
    let rows = v["results"].as_array().unwrap();
    let find = |draft: &str, resident: bool| {
        let r = rows
            .iter()
            .find(|r| r["draft"] == draft && r["resident"] == resident)
            .unwrap_or_else(|| panic!("{draft} {resident}: {v}"));
        assert_eq!(r["projected"]["label"], "projected", "{r}");
        assert_eq!(r["projected"]["board"], "rk3588", "{r}");
        r
    };
    let (plain_s, plain_r) = (find("none", false), find("none", true));
    assert_eq!(f(&plain_s["projected"], "speedup"), 1.0);
    assert!(
        f(&plain_s["projected"], "tok_s") < f(&plain_r["projected"], "tok_s"),
        "{plain_s} {plain_r}"
    );
    let lookup = find("lookup", false);
    if f(lookup, "tokens_per_pass") > 1.1 {
        assert!(f(&lookup["projected"], "speedup") > 1.0, "{lookup}");
    }
}

/// The attention events of an event-stream dump (`ORK_BOARD_EVENTS`), as (flops, bytes).
fn attention_events(path: &Path) -> Vec<(f64, f64)> {
    let events: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    events
        .iter()
        .filter(|e| e["event"] == "host" && e["kind"] == "attention")
        .map(|e| (f(e, "flops"), f(e, "bytes")))
        .collect()
}

/// Gemma 3's local layers read at most their window of keys: the run records, and the plan
/// charges, the same attention for every block and pass (one rule,
/// `HostKind::attended_context`), and on the tiny gemma3 (window 4, one global layer in six)
/// a local layer's attention stops growing with the context while the global one's grows.
#[test]
fn sliding_window_attention_is_charged_for_its_window_by_run_and_plan() {
    let gguf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ork-exec/tests/golden/gemma3_tiny.gguf");
    let dir = tempfile::tempdir().unwrap();
    let (pack, run_events, plan_events) = (
        dir.path().join("tiny.orkpack"),
        dir.path().join("run.json"),
        dir.path().join("plan.json"),
    );
    let o = ork()
        .env("ORK_BOARD_EVENTS", &run_events)
        .args([
            "run",
            "--model",
            gguf.to_str().unwrap(),
            "--pack",
            pack.to_str().unwrap(),
            "--device",
            "emu",
            "--prompt",
            "hello there",
            "-n",
            "8",
            "--project",
            "orangepi5-16g",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let r = json(&o);
    let prompt = r["prefill_tokens"].as_u64().unwrap();
    assert!(prompt > 4, "the prompt must pass the window: {r}");
    let gen = r["tokens"].as_array().unwrap().len().to_string();
    let o = ork()
        .env("ORK_BOARD_EVENTS", &plan_events)
        .args([
            "plan",
            "--model",
            gguf.to_str().unwrap(),
            "--project",
            "orangepi5-16g",
            "--prompt-tokens",
            &prompt.to_string(),
            "--gen-tokens",
            &gen,
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let (ran, planned) = (
        attention_events(&run_events),
        attention_events(&plan_events),
    );
    assert_eq!(ran, planned, "run and plan charge attention alike");
    // Per pass six blocks; block 5 is global. Between the last two decode passes the global
    // layer read one position more and the local ones the same window.
    assert!(ran.len() >= 12 && ran.len() % 6 == 0, "{}", ran.len());
    let (last, before) = (&ran[ran.len() - 6..], &ran[ran.len() - 12..ran.len() - 6]);
    assert_eq!(last[..5], before[..5], "local blocks");
    assert!(
        last[5].1 > before[5].1,
        "global block: {:?} vs {:?}",
        last[5],
        before[5]
    );
    assert!(last[5].1 > last[0].1, "{:?} vs {:?}", last[5], last[0]);
}

/// `ork plan --project --json` on shapes-only GGUFs of the types ork reads: every pairing of
/// the NPU and the CPU is projected, the chosen one is the fastest by the stated rule and never
/// slower than either engine alone; a CPU-only board projects the CPU alone; a MoE file is
/// costed by its chosen experts.
#[test]
fn plan_projects_engines_per_phase_on_sparse_files_of_each_type() {
    use ork_testkit::sparse::{sparse_type, write_sparse_typed};
    let dir = tempfile::tempdir().unwrap();
    let dims = ork_board::fit::FIT_ROWS[0].dims;
    let total = |a: &serde_json::Value| f(a, "total_s");
    for ty in ["Q3_K", "Q4_0", "Q4_K", "Q8_0"] {
        let path = dir.path().join(format!("{ty}.gguf"));
        let t = sparse_type(ty).unwrap();
        write_sparse_typed(&path, &dims, t, sparse_type("Q6_K"), (0, 0)).unwrap();
        let o = run(&[
            "plan",
            "--model",
            path.to_str().unwrap(),
            "--project",
            "orangepi5-16g",
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{ty}: {}", stderr(&o));
        let v = json(&o);
        let p = projected(&v);
        let alts = p["alternatives"].as_array().unwrap();
        // npu/npu, then on the big cores and on every core: npu/cpu, cpu/cpu, cpu/npu, and the
        // split's npu/split (the NPU holding the pack) and cpu/split (the dense weights: every
        // weight of this dense model; the plan is resident), the prefill split's split/npu
        // (the pack), split/cpu and split/split (the dense weights).
        assert_eq!(alts.len(), 17, "{ty}: {p}");
        let e = &p["engines"];
        let same = |a: &serde_json::Value| {
            ["prefill", "decode", "cores", "npu_holds"]
                .iter()
                .all(|k| a[k] == e[k])
        };
        assert_eq!(alts.iter().filter(|a| same(a)).count(), 1, "{ty}: {p}");
        let chosen = alts.iter().find(|a| same(a)).unwrap();
        for a in alts {
            assert!(total(chosen) <= total(a), "{ty}: {p}");
            assert!(
                f(a, "ttft_s") > 0.0 && f(a, "decode_tok_s") > 0.0,
                "{ty}: {p}"
            );
        }
        assert_eq!(p["cpu"]["label"], "projected");
        // The row split, projected and built (`--decode-device split`): not below the CPU
        // engine's decode (the split at the middle context, the pairings over every step:
        // within 1 %).
        let split = &p["split_decode"];
        assert_eq!(
            (&split["label"], &split["built"]),
            (&"projected".into(), &true.into())
        );
        let cpu_decode = alts
            .iter()
            .filter(|a| a["decode"] == "cpu")
            .map(|a| f(a, "decode_tok_s"))
            .fold(0.0, f64::max);
        assert!(f(split, "decode_tok_s") >= cpu_decode * 0.99, "{ty}: {p}");
        // The split's pairings on its cores, the NPU holding what it holds, decode at its rate.
        let splits: Vec<_> = alts.iter().filter(|a| a["decode"] == "split").collect();
        assert_eq!(splits.len(), 6, "{ty}: {p}");
        for a in splits {
            if (&a["cores"], &a["npu_holds"]) == (&split["cores"], &split["npu_holds"]) {
                assert_eq!(a["decode_tok_s"], split["decode_tok_s"], "{ty}: {p}");
            }
        }
        // The prefill split (`--prefill-device split`), projected and built: never slower than
        // either engine alone in its own model; its pairings on its cores, the NPU holding what
        // it holds, prefill in its TTFT.
        let sp = &p["split_prefill"];
        assert_eq!(
            (&sp["label"], &sp["built"]),
            (&"projected".into(), &true.into())
        );
        let alone = f(sp, "model_npu_ttft_s").min(f(sp, "model_cpu_ttft_s"));
        assert!(f(sp, "ttft_s") <= alone * (1.0 + 1e-12), "{ty}: {p}");
        let prefills: Vec<_> = alts.iter().filter(|a| a["prefill"] == "split").collect();
        assert_eq!(prefills.len(), 6, "{ty}: {p}");
        for a in prefills {
            if (&a["cores"], &a["npu_holds"]) == (&sp["cores"], &sp["npu_holds"]) {
                assert_eq!(a["ttft_s"], sp["ttft_s"], "{ty}: {p}");
            }
        }
    }
    // The RK3576's CPU is modelled (unfitted): every pairing, ggml's plain-NEON cycles.
    let path = dir.path().join("Q4_0.gguf");
    let o = run(&[
        "plan",
        "--model",
        path.to_str().unwrap(),
        "--soc",
        "rk3576",
        "--project",
        "rk3576-8g",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let p = projected(&v);
    assert_eq!(p["alternatives"].as_array().unwrap().len(), 17, "{p}");
    assert!(p["cpu"]["cores"]["fit"]
        .as_str()
        .unwrap()
        .starts_with("unfitted"));
    // A MoE (8 experts, 2 per token) on the Raspberry Pi 5: no NPU, the CPU alone.
    let moe = dir.path().join("moe.gguf");
    let small = ork_board::Dims {
        n_layer: 2,
        d_model: 256,
        ffn: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        vocab: 512,
    };
    write_sparse_typed(&moe, &small, sparse_type("Q4_K").unwrap(), None, (8, 2)).unwrap();
    let o = run(&[
        "plan",
        "--model",
        moe.to_str().unwrap(),
        "--project",
        "pi5-16g",
        "--json",
    ]);
    let v = json(&o);
    let p = projected(&v);
    let alts = p["alternatives"].as_array().unwrap();
    assert_eq!(alts.len(), 1, "{p}");
    assert_eq!(p["engines"]["prefill"], "cpu");
    assert!(p["split_decode"].is_null(), "{p}");
    let (file, active) = (
        f(&p["cpu"], "file_bytes"),
        f(&p["cpu"], "active_bytes_per_token"),
    );
    assert!(active < file * 0.7, "{p}");
}

/// With `--project` and neither `--domains` nor `--budget-mb`, a model whose int8 weights exceed
/// one budget (3 GiB) is resident across domains on a board whose RAM holds it (Phi-3's shape:
/// two domains); a given budget keeps one domain, as before.
#[test]
fn plan_with_project_uses_as_many_domains_as_the_weights_need() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("phi3.gguf");
    ork_testkit::sparse::write_sparse_llama(&path, &ork_board::fit::FIT_ROWS[2].dims).unwrap();
    let p = path.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let mut a = vec!["plan", "--model", p, "--json"];
        a.extend_from_slice(extra);
        json(&run(&a))
    };
    let v = plan(&["--project", "orangepi5-16g"]);
    assert_eq!(v["mode"], "resident", "{v}");
    assert!(v["domains_used"].as_u64().unwrap() >= 2, "{v}");
    // Without --project, or with a budget given, one domain: streamed.
    assert_eq!(plan(&[])["mode"], "streamed");
    let v = plan(&["--project", "orangepi5-16g", "--budget-mb", "3072"]);
    assert_eq!(v["mode"], "streamed", "{v}");
}
