//! The engine on the real model: sessions on several threads agree with one at a time; errors
//! are typed.

use ork_exec::{generate, GenerateOptions, Sampler, SamplerOptions};
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

fn run_greedy(mut session: ork_exec::Session, tokens: &[u32], n: usize) -> Vec<u32> {
    let mut sampler = Sampler::new(SamplerOptions::default()).unwrap();
    let options = GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
    };
    generate(&mut session, tokens, &options, &mut sampler, |_| Ok(()))
        .unwrap()
        .tokens
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
        assert!(engine.device_budget().used(ork_device::DomainId(0)) <= budget_mb << 20);
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
    session
        .linear()
        .upcoming(&["blk.29.ffn_down.weight", "blk.0.attn_q.weight"]);
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
        assert_eq!(engine.device().info().soc, Some(soc));
        assert_eq!(
            engine.cache().parts("token_embd.weight").unwrap().len(),
            chunks
        );
        let tokens = greedy(&engine, prompt, 8);
        let (k, n) = engine.linear().device_matmul().max_submitted();
        assert_eq!((k, n), (1536, max_n), "{soc}: largest K and N submitted");
        runs.push(tokens);
    }
    assert_eq!(runs[0], runs[1]);
}

/// A quant the chip lacks is refused with a hint before anything is converted; a per-group
/// fp16 mode the emulator has no kernel for is refused too; an unknown name does not parse.
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
    c.soc = ork_device::Soc::Rk3576;
    c.set_quant(Quant::W4a16G(32));
    assert!(matches!(
        Engine::open(c),
        Err(RuntimeError::Device { source: None, .. })
    ));
    assert!(!pack.exists(), "nothing converted");
    assert!("w8a8-g64".parse::<Quant>().is_err());
    assert_eq!("w8a8-g128".parse::<Quant>(), Ok(Quant::W8a8G(128)));
}
