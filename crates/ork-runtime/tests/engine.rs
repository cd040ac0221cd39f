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
            engine.plan().clone(),
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
