//! The engine on the real model: sessions on several threads agree with one at a time; errors
//! are typed.

mod common;
use common::run_greedy;
use ork_runtime::{DeviceKind, Engine, EngineConfig, PackChoice, RuntimeError};

use ork_testkit::model_path;

fn config(pack: &std::path::Path, budget_mb: u64) -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.pack = PackChoice::Path(pack.to_path_buf());
    c.budget_bytes = Some(budget_mb << 20);
    c.device = DeviceKind::Emu;
    c
}

fn greedy(engine: &Engine, prompt: &str, n: usize) -> Vec<u32> {
    let tokens = engine.tokenizer().encode(prompt, true, false).unwrap();
    run_greedy(engine.session(), &tokens, n)
}

#[test]
fn sessions_on_two_threads_match_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = ["The capital of France is", "Water boils at"];
    // Streamed (a third of the model): both threads share the cache and its budget.
    for budget_mb in [1024, 48] {
        let engine = Engine::open(config(&dir.path().join("m.orkpack"), budget_mb)).unwrap();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&engine, p, 8)).collect();
        let together: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let engine = &engine;
                    s.spawn(move || greedy(engine, p, 8))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(alone, together, "budget {budget_mb} MiB");
        assert!(
            engine
                .device_budget()
                .expect("a device engine")
                .used(ork_device::DomainId(0))
                <= budget_mb << 20
        );
    }
}

/// A session is owned (`Send + 'static`): it moves into a plain (not scoped) thread and runs
/// there after the engine that made it is dropped, keeping the model, cache, device and
/// prefetcher alive through its `Arc`s.
#[test]
fn an_owned_session_runs_on_a_spawned_thread_after_the_engine_is_dropped() {
    fn assert_send_static<T: Send + 'static>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    // Streamed, so the prefetcher is running while the session moves.
    let engine = Engine::open(config(&dir.path().join("m.orkpack"), 48)).unwrap();
    let prompt = "The capital of France is";
    let here = greedy(&engine, prompt, 8);
    let tokens = engine.tokenizer().encode(prompt, true, false).unwrap();
    let session = engine.session();
    assert_send_static(&session);
    // An announcement through the executor's hook reaches the prefetcher; it is a hint only.
    let id = |name: &str| engine.manifest().id(name).unwrap();
    session
        .linear()
        .upcoming(&[id("blk.29.ffn_down.weight"), id("blk.0.attn_q.weight")]);
    drop(engine);
    let there = std::thread::spawn(move || run_greedy(session, &tokens, 8))
        .join()
        .unwrap();
    assert_eq!(here, there);
}

#[test]
fn a_budget_below_the_largest_weight_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    match Engine::open(config(&dir.path().join("m.orkpack"), 8)) {
        Err(RuntimeError::BudgetTooSmall {
            weight, min_mib, ..
        }) => {
            assert_eq!(weight, "token_embd.weight");
            assert_eq!(min_mib, 27);
        }
        other => panic!("expected BudgetTooSmall, got {other:?}"),
    }
    let mut c = config(&dir.path().join("m.orkpack"), 1024);
    c.model = dir.path().join("missing.gguf");
    assert!(matches!(Engine::open(c), Err(RuntimeError::Gguf(_))));
}

/// On the RK3588 the lm head (N = 49152) runs as twelve N-chunks of 4096 and nothing beyond the
/// chip's limits reaches the device; the RK3576 (no documented N limit) runs it whole. Both
/// compute int8 × int8 with the same kernel, so the greedy tokens are the same.
#[test]
fn the_lm_head_runs_in_chip_sized_chunks_with_unchanged_greedy_text() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = "The capital of France is";
    let mut runs = Vec::new();
    for (soc, chunks, max_n) in [
        (ork_device::Soc::Rk3588, 12, 4096),
        (ork_device::Soc::Rk3576, 1, 49152),
    ] {
        let mut c = config(&dir.path().join(format!("{soc}.orkpack")), 1024);
        c.soc = soc;
        let engine = Engine::open(c).unwrap();
        assert_eq!(
            engine.device().expect("a device engine").info().soc,
            Some(soc)
        );
        assert_eq!(
            engine
                .cache()
                .expect("a device engine")
                .parts("token_embd.weight")
                .unwrap()
                .len(),
            chunks
        );
        let tokens = greedy(&engine, prompt, 8);
        let (k, n) = engine
            .linear()
            .expect("a device engine")
            .device_matmul()
            .max_submitted();
        assert_eq!((k, n), (1536, max_n), "{soc}: largest K and N submitted");
        runs.push(tokens);
    }
    assert_eq!(runs[0], runs[1]);
}

/// Continuous batching: four prompts run through [`ork_exec::Session::step`] — admitted one
/// step apart, their prompts prefilled in chunks of 3 tokens riding beside the others' decode
/// tokens — give each the greedy tokens it gives alone, resident and at a quarter budget.
#[test]
fn batched_steps_give_each_sequence_its_greedy_tokens_alone() {
    use ork_exec::{ops::argmax, BatchPart, Session};
    const N: usize = 8;
    const CHUNK: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "Once upon a time, in a small village by the sea, there lived",
        "1, 2, 3, 4,",
    ];
    for budget_mb in [1024, 33] {
        let engine = Engine::open(config(&dir.path().join("m.orkpack"), budget_mb)).unwrap();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&engine, p, N)).collect();

        struct Seq {
            session: Session,
            prompt: Vec<u32>,
            fed: usize,
            out: Vec<u32>,
        }
        let mut seqs: Vec<Seq> = prompts
            .iter()
            .map(|p| Seq {
                session: engine.session(),
                prompt: engine.tokenizer().encode(p, true, false).unwrap(),
                fed: 0,
                out: Vec::new(),
            })
            .collect();
        let mut step = 0;
        let mut widest = 0;
        while seqs.iter().any(|s| s.out.len() < N) {
            // Sequence i joins at step i; the unfinished ones each bring a chunk or a token.
            let active: Vec<usize> = (0..seqs.len().min(step + 1))
                .filter(|&i| seqs[i].out.len() < N)
                .collect();
            let inputs: Vec<(Vec<u32>, bool)> = active
                .iter()
                .map(|&i| {
                    let s = &seqs[i];
                    if s.fed < s.prompt.len() {
                        let end = (s.fed + CHUNK).min(s.prompt.len());
                        (s.prompt[s.fed..end].to_vec(), end == s.prompt.len())
                    } else {
                        (vec![*s.out.last().unwrap()], true)
                    }
                })
                .collect();
            let mut refs: Vec<&mut Seq> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| active.contains(i))
                .map(|(_, s)| s)
                .collect();
            let mut parts: Vec<BatchPart<'_, '_>> = refs
                .iter_mut()
                .zip(&inputs)
                .map(|(s, (tokens, logits))| BatchPart {
                    session: &mut s.session,
                    tokens,
                    logits: if *logits {
                        ork_exec::Logits::Last
                    } else {
                        ork_exec::Logits::None
                    },
                    phase: if s.fed < s.prompt.len() {
                        ork_exec::Phase::Prefill
                    } else {
                        ork_exec::Phase::Decode
                    },
                })
                .collect();
            widest = widest.max(parts.len());
            let logits = Session::step(&mut parts).unwrap();
            drop(parts);
            for ((s, (tokens, _)), l) in refs.iter_mut().zip(&inputs).zip(logits) {
                if s.fed < s.prompt.len() {
                    s.fed += tokens.len();
                }
                if let Some(l) = l {
                    s.out.push(argmax(&l).unwrap() as u32);
                }
            }
            step += 1;
        }
        assert_eq!(widest, prompts.len(), "all four ran in one step");
        let batched: Vec<Vec<u32>> = seqs.into_iter().map(|s| s.out).collect();
        assert_eq!(alone, batched, "budget {budget_mb} MiB");
    }
}

/// A batched step refuses a part beyond its context and leaves every session unchanged.
#[test]
fn a_batched_step_with_an_overflowing_part_changes_no_session() {
    use ork_exec::{BatchPart, ExecError, Session};
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(&dir.path().join("m.orkpack"), 1024)).unwrap();
    let mut a = engine.session();
    let mut b = engine.session_with_context(4).unwrap();
    let tokens = [1u32, 2, 3];
    let five = [1u32, 2, 3, 4, 5];
    let mut parts = [
        BatchPart {
            session: &mut a,
            tokens: &tokens,
            logits: ork_exec::Logits::Last,
            phase: ork_exec::Phase::Prefill,
        },
        BatchPart {
            session: &mut b,
            tokens: &five,
            logits: ork_exec::Logits::Last,
            phase: ork_exec::Phase::Prefill,
        },
    ];
    assert!(matches!(
        Session::step(&mut parts),
        Err(ExecError::ContextOverflow {
            needed: 5,
            context: 4
        })
    ));
    assert_eq!((a.position(), b.position()), (0, 0));
}

/// A MoE model (the qwen3moe fixture of `ork_testkit::moe`) through the engine: streamed with
/// experts loaded as routers pick them, with and without speculative expert prefetch, gives the
/// resident run's greedy tokens; the expert figures are reported.
#[test]
fn a_moe_model_streams_its_experts_with_the_resident_tokens() {
    let path = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    let run = |budget_mb: u64, speculation: Option<usize>| {
        let mut c = EngineConfig::new(&path);
        c.pack = PackChoice::None;
        c.budget_bytes = Some(budget_mb << 20);
        c.device = DeviceKind::Emu;
        c.expert_speculation = speculation;
        let engine = Engine::open(c).unwrap();
        let tokens = greedy(&engine, "The capital of France is", 6);
        (
            tokens,
            engine.plan().expect("a device engine").clone(),
            engine.expert_stats().unwrap(),
        )
    };
    let (resident, plan, _) = run(1024, Some(1));
    assert_eq!(plan.mode, ork_residency::Mode::Resident);
    let (streamed, plan, spec) = run(40, Some(1));
    assert_eq!(plan.mode, ork_residency::Mode::Streamed);
    assert!(plan.expert_bytes > plan.pinned_expert_bytes);
    let (on_demand, _, plain) = run(40, None);
    assert_eq!(streamed, resident);
    assert_eq!(on_demand, resident);
    // 5 decode steps × 5 predicted blocks × (2 + 1) experts.
    assert_eq!(spec.predictions, 5 * 5 * 3);
    assert!(spec.recall.is_some_and(|r| (0.0..=1.0).contains(&r)));
    assert_eq!((plain.predictions, plain.recall), (0, None));
    // Every token runs 2 experts in each of 6 blocks (prefill groups tokens per expert).
    assert!(spec.expert_matmuls >= 5 * 6 * 2 * 3);
    assert!(spec.expert_hits <= spec.expert_matmuls);
}

/// A quant the chip lacks (w4a16, w4a16-g32 on the RK3588) is refused with a hint naming the
/// chip that has it, before anything is converted; an unknown name does not parse.
#[test]
fn a_quant_the_chip_or_emulator_lacks_is_refused_before_converting() {
    use ork_runtime::Quant;
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q.orkpack");
    let mut c = config(&pack, 1024);
    c.set_quant(Quant::W4a16);
    assert_eq!(c.quant(), Some(Quant::W4a16));
    match Engine::open(c.clone()) {
        Err(RuntimeError::Chip { hint, .. }) => assert!(hint.contains("rk3576"), "{hint}"),
        other => panic!("expected a chip refusal, got {:?}", other.err()),
    }
    c.set_quant(Quant::W4a16G(32));
    match Engine::open(c) {
        Err(RuntimeError::Chip { hint, .. }) => assert!(hint.contains("rk3576"), "{hint}"),
        other => panic!("expected a chip refusal, got {:?}", other.err()),
    }
    assert!(!pack.exists(), "nothing converted");
    assert!("w8a8-g64".parse::<Quant>().is_err());
    assert_eq!("w8a8-g128".parse::<Quant>(), Ok(Quant::W8a8G(128)));
}

/// RK3576 w4a16-g32: every weight but the lm head (int8 per channel) is packed as int4 with an
/// affine group (step and offset) per 32 k, stored so in the `.orkpack`; a second open reuses that pack untouched, and streamed at a
/// small budget it gives the resident greedy tokens. A pack made with symmetric int4 groups (as
/// w4a16-g32 packed before affine groups) is rebuilt with a reason, never read as affine.
#[test]
fn w4a16_g32_packs_affine_int4_and_runs_from_the_pack() {
    use ork_pack::ScaleGroup;
    use ork_runtime::Quant;
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("w4.orkpack");
    let mut c = config(&pack, 1024);
    c.soc = ork_device::Soc::Rk3576;
    c.set_quant(Quant::W4a16G(32));
    let mut old = c.clone();
    old.group = ScaleGroup::Group(32);
    let engine = Engine::open(old).unwrap();
    assert_eq!(
        engine
            .cache()
            .expect("a device engine")
            .group("blk.0.attn_q.weight")
            .unwrap(),
        ScaleGroup::Group(32)
    );
    drop(engine);
    let engine = Engine::open(c.clone()).unwrap();
    let report = engine.convert_report().expect("a convert report");
    assert!(report.rewritten);
    // Every entry is repacked; the reason named first is the head's dtype (int4 then, int8 per
    // channel now), the others' groups (`OtherGroup`, tested in ork-store) come after it.
    assert_eq!((report.packed, report.reused), (211, 0));
    assert!(
        matches!(
            &report.rebuild,
            Some(ork_store::RebuildReason::OtherDtype {
                found: ork_pack::PackDtype::I4,
                wanted: ork_pack::PackDtype::I8
            })
        ),
        "{:?}",
        report.rebuild
    );
    for name in ["blk.0.attn_q.weight", "blk.3.ffn_down.weight"] {
        assert_eq!(
            engine
                .cache()
                .expect("a device engine")
                .group(name)
                .unwrap(),
            ScaleGroup::Affine(32),
            "{name}"
        );
    }
    // The lm head (tied to the embedding) stays int8 per channel (fp16 × int8, docs/chip.md).
    assert_eq!(
        engine
            .cache()
            .expect("a device engine")
            .group("token_embd.weight")
            .unwrap(),
        ScaleGroup::PerChannel
    );
    assert_eq!(
        engine
            .cache()
            .expect("a device engine")
            .layout("token_embd.weight")
            .unwrap()
            .dtype,
        ork_pack::PackDtype::I8
    );
    let resident = greedy(&engine, "The capital of France is", 6);
    drop(engine);
    // Streamed: the int8 head alone is 27 MiB.
    c.budget_bytes = Some(32 << 20);
    let engine = Engine::open(c).unwrap();
    assert!(
        engine
            .convert_report()
            .is_some_and(|r| !r.rewritten && r.packed == 0),
        "the pack is reused: {:?}",
        engine.convert_report()
    );
    assert_eq!(
        engine
            .cache()
            .expect("a device engine")
            .group("blk.0.attn_k.weight")
            .unwrap(),
        ScaleGroup::Affine(32)
    );
    assert_eq!(greedy(&engine, "The capital of France is", 6), resident);
}

#[test]
fn a_missing_empty_or_non_utf8_calibration_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let binary = dir.path().join("binary.txt");
    std::fs::write(&binary, [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
    let missing = dir.path().join("missing.txt");
    for path in [missing, empty, binary] {
        let mut c = config(&dir.path().join("m.orkpack"), 1024);
        c.smooth = Some(ork_runtime::Smoothing {
            alpha: 0.5,
            calib: path.clone(),
            targets: ork_exec::SmoothTargets::ALL,
        });
        match Engine::load(c) {
            Err(RuntimeError::Calibration { path: p, .. }) => assert_eq!(p, path),
            Err(e) => panic!("{}: wrong error {e:?}", path.display()),
            Ok(_) => panic!("{}: accepted", path.display()),
        }
    }
}

/// Smoothing changes the packed weights; the pack records the factors and their parameters, so
/// a second load with the same parameters takes them from the pack (no calibration pass) and
/// reuses it untouched, while other parameters (another α, another calibration text, or none)
/// rebuild it with the reason.
#[test]
fn smoothing_is_stored_in_the_pack_and_other_parameters_rebuild_it() {
    use ork_exec::SmoothTargets;
    use ork_runtime::{Smoothing, SmoothingOrigin};
    use ork_store::RebuildReason;
    let dir = tempfile::tempdir().unwrap();
    let calib = dir.path().join("calib.txt");
    std::fs::write(
        &calib,
        // Above ork_runtime::CALIB_MIN_TOKENS (about 15 tokens a sentence).
        "A short calibration text about rivers, mountains and the weather in spring. ".repeat(6),
    )
    .unwrap();
    let other_text = dir.path().join("other.txt");
    std::fs::write(
        &other_text,
        "Another text, about ships and harbours at night. ".repeat(8),
    )
    .unwrap();
    let pack = dir.path().join("m.orkpack");
    let plain = Engine::open(config(&pack, 1024)).unwrap();
    assert_eq!(plain.smoothing_origin(), None);
    let with_targets = |alpha: f32, calib: &std::path::Path, targets: SmoothTargets| {
        let mut c = config(&pack, 1024);
        c.smooth = Some(Smoothing {
            alpha,
            calib: calib.to_path_buf(),
            targets,
        });
        Engine::open(c).unwrap()
    };
    let with =
        |alpha: f32, calib: &std::path::Path| with_targets(alpha, calib, SmoothTargets::NORM);
    let rebuild = |e: &Engine| e.convert_report().and_then(|r| r.rebuild.clone());
    let smoothed = with(0.5, &calib);
    assert_eq!(
        smoothed.smoothing_origin(),
        Some(SmoothingOrigin::Calibrated)
    );
    // The pack made without smoothing is rebuilt, saying why; its unsmoothed entries
    // (token_embd, attn_output, ffn_down) are carried over, q/k/v and gate/up repacked.
    assert!(
        matches!(
            rebuild(&smoothed),
            Some(RebuildReason::OtherSmoothing {
                found: None,
                wanted: Some(_)
            })
        ),
        "{:?}",
        rebuild(&smoothed)
    );
    assert_eq!(smoothed.convert_report().unwrap().packed, 5 * 30);
    let stored = ork_store::Orkpack::open(&pack)
        .unwrap()
        .smoothing()
        .cloned()
        .unwrap();
    assert_eq!((stored.alpha, stored.blocks.len()), (0.5, 30));
    let a = plain.session().prefill(&[1, 2, 3]).unwrap();
    let b = smoothed.session().prefill(&[1, 2, 3]).unwrap();
    assert_ne!(a, b, "the smoothed weights are quantized differently");
    drop((plain, smoothed));

    // Same parameters: the factors come from the pack, nothing is repacked, same logits.
    let again = with(0.5, &calib);
    assert_eq!(again.smoothing_origin(), Some(SmoothingOrigin::FromPack));
    let report = again.convert_report().unwrap();
    assert!(!report.rewritten && report.packed == 0, "{report:?}");
    assert_eq!(again.session().prefill(&[1, 2, 3]).unwrap(), b);
    drop(again);

    // Other targets (v → o and up → down as well): rebuilt with the reason naming both sets;
    // q/k and gate keep their factors and are carried over, v, up, attn_output and ffn_down
    // are repacked. The same targets again take the factors from the pack.
    let all = with_targets(0.5, &calib, SmoothTargets::ALL);
    match rebuild(&all) {
        Some(RebuildReason::OtherSmoothing {
            found: Some(found),
            wanted: Some(wanted),
        }) => assert!(
            found.contains("targets norm ") && wanted.contains("targets all "),
            "{found} / {wanted}"
        ),
        other => panic!("expected OtherSmoothing, got {other:?}"),
    }
    assert_eq!(all.smoothing_origin(), Some(SmoothingOrigin::Calibrated));
    assert_eq!(all.convert_report().unwrap().packed, 4 * 30);
    let stored = ork_store::Orkpack::open(&pack)
        .unwrap()
        .smoothing()
        .cloned()
        .unwrap();
    assert!(stored.v_to_o && stored.up_to_down);
    assert!(stored
        .blocks
        .iter()
        .all(|b| b.vo.as_ref().is_some_and(|v| v.len() == 3 * 64)
            && b.down.as_ref().is_some_and(|v| v.len() == 1536)));
    let c = all.session().prefill(&[1, 2, 3]).unwrap();
    assert_ne!(b, c, "o and down are quantized from other weights");
    drop(all);
    let all = with_targets(0.5, &calib, SmoothTargets::ALL);
    assert_eq!(all.smoothing_origin(), Some(SmoothingOrigin::FromPack));
    assert_eq!(all.convert_report().unwrap().packed, 0);
    assert_eq!(all.session().prefill(&[1, 2, 3]).unwrap(), c);
    drop(all);

    // Another α, another text, no smoothing: each rebuilds the pack with the reason.
    for (engine, found_alpha) in [
        (with(0.8, &calib), "alpha 0.5"),
        (with(0.8, &other_text), "alpha 0.8"),
        (Engine::open(config(&pack, 1024)).unwrap(), "alpha 0.8"),
    ] {
        match rebuild(&engine) {
            Some(RebuildReason::OtherSmoothing {
                found: Some(found), ..
            }) => assert!(found.contains(found_alpha), "{found}"),
            other => panic!("expected OtherSmoothing, got {other:?}"),
        }
        assert_ne!(engine.smoothing_origin(), Some(SmoothingOrigin::FromPack));
    }
    assert!(ork_store::Orkpack::open(&pack)
        .unwrap()
        .smoothing()
        .is_none());
}

/// phi3's fused q/k/v and gate-up weights and LongRoPE factors run on the emulated device as
/// they do on the CPU reference (docs/models.md, "phi3"): the fixtures of
/// `ork_testkit::rope` (whose CPU logits match llama.cpp's, ork-exec's rope_golden.rs), fp16
/// weights and activations, every logit of 16 positions within fp16 rounding.
#[test]
fn phi3_fused_weights_and_longrope_run_on_the_device_as_on_the_cpu() {
    use ork_gguf::{GgufFile, MetaValue};
    use ork_testkit::rope::{write_fixture, RopeFixture};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let tokens = [1u32, 5, 17, 33, 60, 9, 9, 42, 3, 27, 51, 14, 8, 63, 30, 22];
    for (kind, contexts) in [
        (RopeFixture::Phi3, &[256][..]),
        (RopeFixture::Phi3LongRope, &[256, 1024][..]),
    ] {
        // The engine's tokenizer needs a byte-level BPE vocabulary; the ids are given directly.
        let src = write_fixture(kind, dir.path());
        let path = dir.path().join(format!("bpe-{}", kind.file_name()));
        ork_gguf::writer::GgufBuilder::from_file(
            &GgufFile::open(&src).unwrap(),
            |_| true,
            &[
                ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
                ("tokenizer.ggml.pre", MetaValue::String("smollm".into())),
                ("tokenizer.ggml.merges", MetaValue::Array(Vec::new())),
            ],
        )
        .write(&path)
        .unwrap();
        let mut c = EngineConfig::new(&path);
        c.pack = PackChoice::None;
        c.device = DeviceKind::Emu;
        c.set_quant(ork_runtime::Quant::W16a16);
        c.kv_cache = ork_exec::KvType::F32;
        let engine = Engine::open(c).unwrap();
        let g = Arc::clone(engine.model().gguf());
        let cpu: Arc<dyn ork_exec::Linear> = Arc::new(
            ork_exec::CpuF32Linear::from_gguf(&g, engine.model().matmul_weights()).unwrap(),
        );
        for &n_ctx in contexts {
            let want = ork_exec::Session::with_context(
                Arc::clone(engine.model()),
                Arc::clone(&cpu),
                n_ctx,
            )
            .unwrap()
            .with_kv_type(ork_exec::KvType::F32)
            .forward_all(&tokens)
            .unwrap();
            let got = engine
                .session_with_context(n_ctx)
                .unwrap()
                .forward_all(&tokens)
                .unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0.0f32, f32::max);
            eprintln!(
                "{} n_ctx {n_ctx}: device w16a16 vs CPU f32, worst {worst:.2e}",
                kind.name()
            );
            assert!(worst < 2e-2, "{} n_ctx {n_ctx}: {worst}", kind.name());
        }
    }
}
