//! The prefill row split (`--prefill-device split`, docs/architecture.md, "Engines per
//! phase"): each prefill matmul's rows `0..r` on the emulated NPU, `r..n` on the CPU engine, at
//! once, at the prefill's own shares.
//!
//! The bound, as for the decode split (`tests/split.rs`): every row is computed once, by the
//! engine the split names, bit for bit that engine's own matmul of those rows (the output
//! starts as NaN), for the many activation rows of a prompt pass; the run is deterministic; and
//! its greedy tokens part from the decode engine's single-engine run's only at a step where that
//! run's own top-2 logit margin is below twice the largest difference between the two engines'
//! prefill logits, measured in the same test.

mod common;

use std::path::Path;

use common::{margin, tokens};

use ork_runtime::SplitRows::{self, All};
use ork_runtime::{Engine, EngineConfig, PhaseEngine, PhaseEngines};
use ork_testkit::model_path;

const DECODE: usize = 10;

/// [`common::config`] with the prefill split's shares `prefill` and the decode split's `decode`.
fn config(
    model: &Path,
    pack: &Path,
    engines: PhaseEngines,
    (prefill, decode): (Option<SplitRows>, Option<SplitRows>),
) -> EngineConfig {
    let mut c = common::config(model, pack, engines);
    c.prefill_split_rows = prefill;
    c.split_rows = decode;
    c
}

/// Split prefill, `decode` decodes.
fn split_then(decode: PhaseEngine) -> PhaseEngines {
    PhaseEngines {
        prefill: PhaseEngine::Split,
        decode,
    }
}

/// Every row of a prompt pass (several activation rows) once, by its engine, at a share that
/// splits every weight and at one that leaves the narrow weights wholly on the CPU.
#[test]
fn a_prefill_split_computes_every_row_once_on_the_engine_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    for share in [0.5, 0.03] {
        let c = config(
            &model_path(),
            &pack,
            split_then(PhaseEngine::Device),
            (Some(All(share)), None),
        );
        let split = Engine::open(c).unwrap();
        let s = split.prefill_split_linear().unwrap();
        assert!(split.split_linear().is_none(), "decode does not split");
        let block0: Vec<_> = split
            .manifest()
            .weights()
            .iter()
            .filter(|w| w.layer == Some(0) || w.layer.is_none())
            .map(|w| (w.id, w.k, w.n))
            .collect();
        for (i, w) in block0.iter().enumerate() {
            common::rows_are_each_engines(&split, s, &[*w], 7, i as u32);
        }
        let qkv: Vec<_> = block0
            .iter()
            .filter(|w| w.1 == block0[0].1)
            .take(3)
            .copied()
            .collect();
        common::rows_are_each_engines(&split, s, &qkv, 16, 9);
        let st = s.stats();
        assert!(st.split_calls > 0, "{st:?}");
        if share < 0.1 {
            assert!(st.cpu_calls > 0, "k/v stay on the CPU at 3%: {st:?}");
        }
        let rows: u64 = block0.iter().map(|w| (w.2 * 7) as u64).sum::<u64>()
            + qkv.iter().map(|w| (w.2 * 16) as u64).sum::<u64>();
        assert_eq!(st.device_rows + st.cpu_rows, rows, "{st:?}");
    }
}

#[test]
fn a_prefill_split_gives_the_single_engines_tokens_up_to_their_numerics() {
    let st = prefill_split_agrees(
        &model_path(),
        "SmolLM2, split/npu",
        split_then(PhaseEngine::Device),
        (All(0.5), None),
    );
    assert_eq!(st.1, None);
    // Both phases split, each at its own share.
    let (p, d) = prefill_split_agrees(
        &model_path(),
        "SmolLM2, split/split",
        PhaseEngines::one(PhaseEngine::Split),
        (All(0.25), Some(All(0.75))),
    );
    assert!(d.is_some_and(|d| d.split_calls > 0), "{d:?}");
    assert!(p.device_rows > 0 && p.cpu_rows > 0, "{p:?}");
}

/// A MoE model: the dense weights split, every expert slice wholly on the CPU.
#[test]
fn a_prefill_split_on_a_moe_fixture_keeps_the_experts_on_the_cpu() {
    let model = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Perturbed);
    let (st, _) = prefill_split_agrees(
        &model,
        "MoE perturbed, split/cpu",
        split_then(PhaseEngine::Cpu),
        (All(0.5), None),
    );
    assert!(st.cpu_calls > 0, "the experts' calls: {st:?}");
}

/// The checks of the module documentation on `model` with `engines` (the prefill split at
/// `shares.0`, a decode split at `shares.1`); the prefill split's and decode split's counters.
fn prefill_split_agrees(
    model: &Path,
    what: &str,
    engines: PhaseEngines,
    shares: (SplitRows, Option<SplitRows>),
) -> (ork_runtime::SplitStats, Option<ork_runtime::SplitStats>) {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let one = |e| Engine::open(common::config(model, &pack, PhaseEngines::one(e))).unwrap();
    let (emu, cpu) = (one(PhaseEngine::Device), one(PhaseEngine::Cpu));
    let described = shares.0.describe();
    let split = Engine::open(config(model, &pack, engines, (Some(shares.0), shares.1))).unwrap();
    let name = split.compute_name();
    assert!(
        name.starts_with("prefill split (emulated")
            && name.contains(&format!("{described}, cpu the rest), decode")),
        "{name}"
    );
    let prompt = split
        .tokenizer()
        .encode("The capital of France is", true, false)
        .unwrap();
    let greedy = |e: &Engine| common::greedy_logits(&mut e.session(), &prompt, DECODE);
    let logits = greedy(&split);
    let (emu_logits, cpu_logits) = (greedy(&emu), greedy(&cpu));
    let run = tokens(&logits);
    assert_eq!(run, tokens(&greedy(&split)), "{what}: deterministic");
    let st = split.prefill_split_linear().unwrap().stats();
    assert!(
        st.split_calls > 0 && st.device_rows > 0 && st.cpu_rows > 0,
        "{st:?}"
    );
    let spread = emu_logits[0]
        .iter()
        .zip(&cpu_logits[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // The reference: the single-engine run of the decode's engine (the emulator for a split).
    let (reference, on) = match engines.decode {
        PhaseEngine::Cpu => (&cpu_logits, "cpu"),
        _ => (&emu_logits, "emulator"),
    };
    // The split prefill's logits lie between the engines': within their spread of either.
    let off = logits[0]
        .iter()
        .zip(&reference[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(off <= 2.0 * spread, "{what}: prefill logits {off} off");
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
    (st, split.split_linear().map(|s| s.stats()))
}

#[test]
fn a_prefill_split_without_its_share_is_refused_before_opening() {
    let model = model_path();
    let pack = Path::new("/nonexistent/m.orkpack");
    for (engines, shares) in [
        (split_then(PhaseEngine::Device), (None, None)),
        (split_then(PhaseEngine::Device), (Some(All(1.0)), None)),
        (split_then(PhaseEngine::Cpu), (None, Some(All(0.5)))),
        (
            PhaseEngines::one(PhaseEngine::Split),
            (Some(All(0.5)), None),
        ),
        (
            PhaseEngines {
                prefill: PhaseEngine::Device,
                decode: PhaseEngine::Cpu,
            },
            (Some(All(0.5)), None),
        ),
    ] {
        let err = Engine::load(config(&model, pack, engines, shares)).unwrap_err();
        assert!(
            matches!(err, ork_runtime::RuntimeError::Phases { .. }),
            "{err}"
        );
    }
}
