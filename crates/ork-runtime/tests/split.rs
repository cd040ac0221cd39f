//! The decode row split (`--decode-device split`, docs/architecture.md, "Engines per phase"):
//! each decode matmul's rows `0..r` on the emulated NPU, `r..n` on the CPU engine, at once.
//!
//! The bound. A split decode step mixes the two engines' numbers row by row, so it equals
//! neither single-engine run. What is checked exactly:
//! - every row is computed once, by the engine the split names: the split's output is, bit for
//!   bit, the device's own matmul on rows `0..r` and the CPU engine's own matmul on rows
//!   `r..n` (every value written: the output starts as NaN), for one activation row and for
//!   several (a batched step), one weight and several at once (q/k/v);
//! - the prefill (on the emulator, or on the CPU engine with `--prefill-device cpu`) is bit for
//!   bit that engine's single-engine run's;
//! - with shares per weight (`--split-rows auto`), each weight's device rows are its own
//!   share's;
//! - the run is deterministic.
//!
//! Against the single-engine runs the greedy tokens agree up to the engines' numerics, the
//! bound of `tests/phases.rs`: the split run parts from the prefill engine's single-engine
//! run's tokens only at a step where that run's own top-2 logit margin is below twice the
//! largest difference between the two engines' prefill logits, measured in the same test.

mod common;

use std::path::Path;

use common::{margin, tokens};

use ork_exec::{Linear, Session, WeightId};
use ork_runtime::SplitRows::{self, All, PerWeight};
use ork_runtime::{DeviceWeights, Engine, EngineConfig, PhaseEngine, PhaseEngines};
use ork_testkit::model_path;

const DECODE: usize = 12;

/// [`common::config`] with the split's shares `share`.
fn config(
    model: &Path,
    pack: &Path,
    engines: PhaseEngines,
    share: Option<SplitRows>,
) -> EngineConfig {
    let mut c = common::config(model, pack, engines);
    c.split_rows = share;
    c
}

const SPLIT: PhaseEngines = PhaseEngines {
    prefill: PhaseEngine::Device,
    decode: PhaseEngine::Split,
};

/// Greedy: the prefill's logits, then `DECODE` decode steps; every step's logits.
fn greedy(session: &mut Session, prompt: &[u32]) -> Vec<Vec<f32>> {
    common::greedy_logits(session, prompt, DECODE)
}

/// The decode split's rows of `ws` against each engine's own matmul of them, bit for bit.
fn rows_are_each_engines(split: &Engine, ws: &[(WeightId, usize, usize)], m: usize, seed: u32) {
    common::rows_are_each_engines(split, split.split_linear().unwrap(), ws, m, seed);
}

/// Every row once, by its engine, at a share that splits every weight and at one that leaves
/// the narrow weights (k/v: 192 rows) wholly on the CPU.
#[test]
fn a_split_computes_every_row_once_on_the_engine_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    for share in [0.5, 0.03] {
        let split = Engine::open(config(&model_path(), &pack, SPLIT, Some(All(share)))).unwrap();
        let manifest = split.manifest();
        let block0: Vec<_> = manifest
            .weights()
            .iter()
            .filter(|w| w.layer == Some(0) || w.layer.is_none())
            .map(|w| (w.id, w.k, w.n))
            .collect();
        assert!(block0.len() >= 8, "{block0:?}");
        for (i, w) in block0.iter().enumerate() {
            rows_are_each_engines(&split, &[*w], 1, i as u32);
            rows_are_each_engines(&split, &[*w], 3, i as u32);
        }
        // q/k/v together (the same K), as the forward pass asks for them.
        let qkv: Vec<_> = block0
            .iter()
            .filter(|w| w.1 == block0[0].1)
            .take(3)
            .copied()
            .collect();
        rows_are_each_engines(&split, &qkv, 1, 7);
        rows_are_each_engines(&split, &qkv, 2, 8);
        let st = split.split_linear().unwrap().stats();
        assert!(st.split_calls > 0, "{st:?}");
        if share < 0.1 {
            assert!(st.cpu_calls > 0, "k/v stay on the CPU at 3%: {st:?}");
        }
        let rows: u64 = block0.iter().map(|w| (w.2 * 4) as u64).sum::<u64>()
            + qkv.iter().map(|w| (w.2 * 3) as u64).sum::<u64>();
        assert_eq!(st.device_rows + st.cpu_rows, rows, "{st:?}");
    }
}

#[test]
fn a_split_decode_gives_the_single_engines_tokens_up_to_their_numerics() {
    split_agrees(&model_path(), "SmolLM2", PhaseEngine::Device, All(0.5));
}

/// The CPU prefills and the decode splits (`--prefill-device cpu --decode-device split`): the
/// same bound, against the CPU-only run.
#[test]
fn a_split_decode_after_a_cpu_prefill_gives_the_cpu_runs_tokens_up_to_the_numerics() {
    split_agrees(
        &model_path(),
        "SmolLM2, cpu prefill",
        PhaseEngine::Cpu,
        All(0.5),
    );
}

/// A MoE model: the dense weights split, every expert slice wholly on the CPU.
#[test]
fn a_split_decode_on_a_moe_fixture_keeps_the_experts_on_the_cpu() {
    let model = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Perturbed);
    let st = split_agrees(&model, "MoE perturbed", PhaseEngine::Device, All(0.5));
    assert!(st.cpu_calls > 0, "the experts' calls: {st:?}");
}

/// The split `--device auto` chooses for a MoE whose pack would not be resident: the CPU
/// prefills, the decode splits, and the device holds only the dense weights
/// (`DeviceWeights::Dense`): its plan places no expert, no expert is loaded into its cache, an
/// expert asked of it is refused; the tokens are within the bound of the CPU-only run's.
#[test]
fn a_dense_only_split_on_a_moe_fixture_holds_no_expert_on_the_device() {
    let model = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    let st = split_agrees_on(
        &model,
        "qwen3moe, dense-only device",
        (PhaseEngine::Cpu, DeviceWeights::Dense),
        All(0.5),
    );
    assert!(st.cpu_calls > 0, "the experts' calls: {st:?}");
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let engines = PhaseEngines {
        prefill: PhaseEngine::Cpu,
        decode: PhaseEngine::Split,
    };
    let mut c = config(&model, &pack, engines, Some(All(0.5)));
    c.device_weights = DeviceWeights::Dense;
    let split = Engine::open(c.clone()).unwrap();
    let manifest = split.manifest();
    let plan = split.plan().unwrap();
    let dense = manifest.weights().iter().filter(|w| w.expert.is_none());
    assert_eq!(plan.placement.len(), dense.count());
    assert_eq!(plan.expert_bytes, 0, "{plan:?}");
    // A decode: every expert stays off the device.
    let prompt = split.tokenizer().encode("Paris is", true, false).unwrap();
    greedy(&mut split.session(), &prompt);
    let cache = split.cache().unwrap();
    let experts: Vec<_> = manifest
        .weights()
        .iter()
        .filter(|w| w.expert.is_some())
        .collect();
    assert!(!experts.is_empty());
    for w in &experts {
        assert!(
            !cache.is_resident(w.id),
            "{} loaded on the device",
            w.tensor
        );
    }
    let device = split.linear().unwrap();
    let e = experts[0];
    let mut y = vec![0.0; e.n];
    assert!(matches!(
        device.matmul(e.id, &vec![0.1; e.k], 1, &mut y),
        Err(ork_exec::ExecError::Backend { .. })
    ));
    drop(split);
    // A phase wholly on a dense-only device would need the experts: refused at open.
    c.phases = Some(PhaseEngines {
        prefill: PhaseEngine::Device,
        decode: PhaseEngine::Split,
    });
    assert!(matches!(
        Engine::open(c).map(|_| ()),
        Err(ork_runtime::RuntimeError::Phases { .. })
    ));
}

/// Shares per weight (`--split-rows auto`): each weight's device rows are its own share's, on
/// whole tiles; every row once, on its engine; the tokens within the bound.
#[test]
fn per_weight_shares_split_each_weight_at_its_own_share() {
    let model = model_path();
    let gguf = ork_gguf::GgufFile::open(&model).unwrap();
    let manifest = ork_manifest::Manifest::from_gguf(&gguf).unwrap();
    // A share per weight that differs by its size: the wide (FFN) weights 3/4, the square
    // ones 1/4, the narrow k/v on the CPU alone, the output head on the device alone.
    let d = manifest.weights()[0].k;
    let share = |w: &ork_manifest::Weight| match (w.layer, w.n) {
        (None, _) => 1.0,
        (_, n) if n > d => 0.75,
        (_, n) if n == d => 0.25,
        _ => 0.0,
    };
    let mut shares = vec![0.0; manifest.weights().len()];
    for w in manifest.weights() {
        shares[w.id.index()] = share(w);
    }
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let split = Engine::open(config(
        &model,
        &pack,
        SPLIT,
        Some(PerWeight(shares.clone())),
    ))
    .unwrap();
    let s = split.split_linear().unwrap();
    for w in manifest.weights() {
        let (r, n) = s.rows_of(w.id).unwrap();
        assert_eq!(r, ork_runtime::split_row(n, share(w), 32), "{}", w.tensor);
    }
    let block0: Vec<_> = manifest
        .weights()
        .iter()
        .filter(|w| w.layer == Some(0) || w.layer.is_none())
        .map(|w| (w.id, w.k, w.n))
        .collect();
    for (i, w) in block0.iter().enumerate() {
        rows_are_each_engines(&split, &[*w], 1, i as u32);
    }
    let st = s.stats();
    assert!(
        st.split_calls > 0 && st.cpu_calls > 0 && st.device_calls > 0,
        "{st:?}"
    );
    drop(split);
    let name = split_agrees(
        &model,
        "SmolLM2, per weight",
        PhaseEngine::Device,
        PerWeight(shares),
    );
    assert!(name.cpu_calls > 0 && name.device_calls > 0, "{name:?}");
    // Shares made for another model are refused when the engine opens.
    let short = Engine::open(config(&model, &pack, SPLIT, Some(PerWeight(vec![0.5; 3]))));
    assert!(matches!(
        short.map(|_| ()),
        Err(ork_runtime::RuntimeError::Phases { .. })
    ));
}

/// The split's checks of the module documentation on `model`, the prefill on `prefill` (the
/// emulator or the CPU engine), the decode split at `shares`; its counters.
fn split_agrees(
    model: &Path,
    what: &str,
    prefill: PhaseEngine,
    shares: SplitRows,
) -> ork_runtime::SplitStats {
    split_agrees_on(model, what, (prefill, DeviceWeights::All), shares)
}

/// [`split_agrees`] with the device holding `held`.
fn split_agrees_on(
    model: &Path,
    what: &str,
    (prefill, held): (PhaseEngine, DeviceWeights),
    shares: SplitRows,
) -> ork_runtime::SplitStats {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let one = |e| Engine::open(config(model, &pack, PhaseEngines::one(e), None)).unwrap();
    let (emu, cpu) = (one(PhaseEngine::Device), one(PhaseEngine::Cpu));
    let engines = PhaseEngines {
        prefill,
        decode: PhaseEngine::Split,
    };
    let described = shares.describe();
    let mut c = config(model, &pack, engines, Some(shares));
    c.device_weights = held;
    let split = Engine::open(c).unwrap();
    let name = split.compute_name();
    assert!(
        name.contains("decode split (emulated")
            && name.ends_with(&format!("{described}, cpu the rest)")),
        "{name}"
    );
    let prompt = split
        .tokenizer()
        .encode("The capital of France is", true, false)
        .unwrap();
    let logits = greedy(&mut split.session(), &prompt);
    let emu_logits = greedy(&mut emu.session(), &prompt);
    let cpu_logits = greedy(&mut cpu.session(), &prompt);
    // The reference: the single-engine run of the prefill's engine.
    let (reference, on) = match prefill {
        PhaseEngine::Cpu => (&cpu_logits, "cpu"),
        _ => (&emu_logits, "emulator"),
    };
    assert_eq!(logits[0], reference[0], "{what}: prefill on the {on}");
    let run = tokens(&logits);
    assert_eq!(
        run,
        tokens(&greedy(&mut split.session(), &prompt)),
        "{what}: deterministic"
    );
    let st = split.split_linear().unwrap().stats();
    assert!(
        st.split_calls > 0 && st.device_rows > 0 && st.cpu_rows > 0,
        "{st:?}"
    );
    let spread = emu_logits[0]
        .iter()
        .zip(&cpu_logits[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let ref_run = tokens(reference);
    if let Some(i) = run.iter().zip(&ref_run).position(|(a, b)| a != b) {
        let m = margin(&reference[i]);
        assert!(
            m < 2.0 * spread,
            "{what}: split {run:?} and {on}-only {ref_run:?} part at step {i}, margin {m} ≥ {}",
            2.0 * spread
        );
    }
    eprintln!("{what}: split {run:?}, {on}-only {ref_run:?}, engines' spread {spread}, {st:?}");
    st
}

/// A decode split without a share that splits, a decode share without a decode split (the
/// last: the prefill splits, the decode's share is no prefill share), refused before opening.
#[test]
fn a_split_without_its_share_or_a_share_without_its_split_is_refused_before_opening() {
    let model = model_path();
    let pack = Path::new("/nonexistent/m.orkpack");
    for (engines, share) in [
        (SPLIT, None),
        (SPLIT, Some(All(1.0))),
        (SPLIT, Some(All(0.0))),
        (SPLIT, Some(PerWeight(vec![0.0; 4]))),
        (MIXED_CPU, Some(All(0.5))),
        (
            PhaseEngines {
                prefill: PhaseEngine::Split,
                decode: PhaseEngine::Cpu,
            },
            Some(All(0.5)),
        ),
    ] {
        let err = Engine::load(config(&model, pack, engines, share)).unwrap_err();
        assert!(
            matches!(err, ork_runtime::RuntimeError::Phases { .. }),
            "{err}"
        );
    }
}

const MIXED_CPU: PhaseEngines = PhaseEngines {
    prefill: PhaseEngine::Device,
    decode: PhaseEngine::Cpu,
};
