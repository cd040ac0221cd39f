//! Engines per phase (docs/architecture.md, "Engines per phase"): the emulated NPU prefills,
//! the CPU engine decodes, one session and one KV cache.
//!
//! The bound. The two engines compute different numbers: the emulator at w8a8 (int8 weights
//! per channel, int8 activations per token), the CPU engine at the file's bits (Q4_1 here,
//! activations at q8 as ggml's CPU backend). So a mixed run is not compared to a single-engine
//! run for equality of its logits, but to what the composition says it is, exactly:
//! - its prefill logits are bit for bit the emulator-only run's (same engine, same input);
//! - its decode steps are bit for bit a CPU-only session's decode steps fed the same KV cache
//!   (the mixed session's cache after the prefill, moved with `save_kv`/`load_kv`), token for
//!   token;
//! - it is deterministic (two runs, the same tokens).
//!
//! Against the single-engine runs the tokens agree up to the engines' numerics: the mixed
//! run's first token is the emulator run's, and it parts from the CPU-only run's tokens only at
//! a step where the CPU-only run's own top-2 logit margin is below twice the largest difference
//! between the two engines' prefill logits measured in the same test (a margin that the two
//! engines' rounding can overturn).

mod common;

use std::path::Path;

use common::{argmax, config, margin, tokens};

use ork_exec::{Phase, Session};
use ork_runtime::{Engine, PackChoice, PhaseEngine, PhaseEngines};
use ork_testkit::model_path;
use ork_testkit::moe::{moe_fixture, MoeFixture};

/// Tokens decoded after the prompt.
const DECODE: usize = 12;

const MIXED: PhaseEngines = PhaseEngines {
    prefill: PhaseEngine::Device,
    decode: PhaseEngine::Cpu,
};

/// Greedy: the prefill's logits, then `DECODE` decode steps; every step's logits.
fn greedy(session: &mut Session, prompt: &[u32]) -> Vec<Vec<f32>> {
    common::greedy_logits(session, prompt, DECODE)
}

/// Every check of the module's documentation on `model`.
fn mixed_agrees(model: &Path, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let emu = Engine::open(config(model, &pack, PhaseEngines::one(PhaseEngine::Device))).unwrap();
    let cpu = Engine::open(config(model, &pack, PhaseEngines::one(PhaseEngine::Cpu))).unwrap();
    let mixed = Engine::open(config(model, &pack, MIXED)).unwrap();
    let name = mixed.compute_name();
    assert!(
        name.starts_with("prefill emulated") && name.ends_with(", decode cpu"),
        "{name}"
    );
    let prompt = mixed
        .tokenizer()
        .encode("The capital of France is", true, false)
        .unwrap();

    // The composition, exactly: the prefill on the emulator ...
    let mut s = mixed.session();
    let first = s.prefill(&prompt).unwrap();
    let emu_first = emu.session().prefill(&prompt).unwrap();
    assert_eq!(first, emu_first, "{what}: prefill logits = the emulator's");
    // ... the decode steps on the CPU engine, from the emulator's KV cache.
    let kv = s.save_kv();
    let mut reference = cpu.session();
    reference.load_kv(&kv).unwrap();
    let mut next = argmax(&first);
    for step in 0..DECODE {
        let a = s.decode(next).unwrap();
        let b = reference.decode(next).unwrap();
        assert_eq!(
            a, b,
            "{what}: decode step {step} = the CPU engine's on the same KV"
        );
        next = argmax(&a);
    }

    // Deterministic.
    let run = tokens(&greedy(&mut mixed.session(), &prompt));
    assert_eq!(
        run,
        tokens(&greedy(&mut mixed.session(), &prompt)),
        "{what}"
    );

    // Against the single engines, up to their numerics.
    assert_eq!(
        run[0],
        argmax(&emu_first),
        "{what}: first token = the emulator's"
    );
    let cpu_logits = greedy(&mut cpu.session(), &prompt);
    let cpu_run = tokens(&cpu_logits);
    let spread = emu_first
        .iter()
        .zip(&cpu_logits[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let near_tie = 2.0 * spread;
    if let Some(i) = run.iter().zip(&cpu_run).position(|(a, b)| a != b) {
        let m = margin(&cpu_logits[i]);
        assert!(
            m < near_tie,
            "{what}: mixed {run:?} and CPU-only {cpu_run:?} part at step {i}, where the CPU's \
             margin is {m} (≥ {near_tie}, twice the engines' prefill-logit spread)"
        );
    }
    eprintln!("{what}: mixed {run:?}, cpu-only {cpu_run:?}, engines' spread {spread}");
}

#[test]
fn emu_prefill_cpu_decode_on_smollm2_is_the_composition_of_the_two_engines() {
    mixed_agrees(&model_path(), "SmolLM2");
}

#[test]
fn emu_prefill_cpu_decode_on_a_moe_fixture_is_the_composition_of_the_two_engines() {
    mixed_agrees(&moe_fixture(MoeFixture::Perturbed), "MoE perturbed");
}

/// A server's batched step: two sequences, one decoding and one prefilling, each part on its
/// phase's engine, give the tokens of each sequence run alone on the mixed engine.
#[test]
fn a_batched_step_runs_each_phase_on_its_engine() {
    use ork_exec::BatchPart;
    let dir = tempfile::tempdir().unwrap();
    let mixed = Engine::open(config(&model_path(), &dir.path().join("m.orkpack"), MIXED)).unwrap();
    let tok = |p: &str| mixed.tokenizer().encode(p, true, false).unwrap();
    let (pa, pb) = (tok("The capital of France is"), tok("Water boils at"));
    let alone_a = tokens(&greedy(&mut mixed.session(), &pa));
    let alone_b = tokens(&greedy(&mut mixed.session(), &pb));
    // a prefills alone, then decodes while b's prompt is prefilled in the same step.
    let (mut a, mut b) = (mixed.session(), mixed.session());
    let mut out_a = vec![argmax(&a.prefill(&pa).unwrap())];
    let mut out_b = Vec::new();
    for _ in 0..DECODE {
        let la = [*out_a.last().unwrap()];
        let lb = [*out_b.last().unwrap_or(&0)];
        let mut parts = vec![BatchPart {
            session: &mut a,
            tokens: &la,
            logits: ork_exec::Logits::Last,
            phase: Phase::Decode,
        }];
        parts.push(BatchPart {
            session: &mut b,
            tokens: if out_b.is_empty() { &pb } else { &lb },
            logits: ork_exec::Logits::Last,
            phase: if out_b.is_empty() {
                Phase::Prefill
            } else {
                Phase::Decode
            },
        });
        let out = Session::step(&mut parts).unwrap();
        out_a.push(argmax(out[0].as_ref().unwrap()));
        out_b.push(argmax(out[1].as_ref().unwrap()));
    }
    assert_eq!(out_a, alone_a);
    assert_eq!(out_b, alone_b[..DECODE]);
}

/// Where the pack and the GGUF would not fit the RAM beside the CPU engine, the device's
/// weights are packed from the GGUF as they are needed (stream-by-pack): no `.orkpack` is
/// written, and the tokens are those of the run from the pack (the same int8 weights).
#[test]
fn stream_by_pack_when_pack_and_gguf_overflow_the_ram() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let model = model_path();
    let from_pack = Engine::open(config(&model, &pack, MIXED)).unwrap();
    let w = from_pack.npu_weight_source().unwrap();
    assert_eq!(w.source, ork_runtime::NpuWeights::Pack, "{}", w.why);
    let prompt = from_pack
        .tokenizer()
        .encode("Water boils at", true, false)
        .unwrap();
    let expected = tokens(&greedy(&mut from_pack.session(), &prompt));

    // The default pack (an explicit one is kept as named), here: the only test of this binary
    // that reads `ORK_PERSIST` (the others name their pack).
    let other = dir.path().join("other.orkpack");
    std::env::set_var("ORK_PERSIST", &other);
    let mut c = config(&model, &other, MIXED);
    c.pack = PackChoice::Default;
    let gguf = std::fs::metadata(&model).unwrap().len();
    c.ram_bytes = Some(gguf); // the GGUF alone fills it
    let streamed = Engine::open(c).unwrap();
    let w = streamed.npu_weight_source().unwrap();
    assert_eq!(w.source, ork_runtime::NpuWeights::StreamByPack, "{}", w.why);
    assert_eq!((w.gguf_bytes, w.ram_bytes), (gguf, Some(gguf)));
    assert!(streamed.pack_path().is_none() && !other.exists());
    assert_eq!(tokens(&greedy(&mut streamed.session(), &prompt)), expected);
}
