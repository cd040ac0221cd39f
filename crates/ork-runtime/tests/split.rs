//! The decode row split (`--decode-device split`, docs/architecture.md, "Engines per phase"):
//! each decode matmul's rows `0..r` on the emulated NPU, `r..n` on the CPU engine, at once.
//!
//! The bound. A split decode step mixes the two engines' numbers row by row, so it equals
//! neither single-engine run. What is checked exactly:
//! - every row is computed once, by the engine the split names: the split's output is, bit for
//!   bit, the device's own matmul on rows `0..r` and the CPU engine's own matmul on rows
//!   `r..n` (every value written: the output starts as NaN), for one activation row and for
//!   several (a batched step), one weight and several at once (q/k/v);
//! - the prefill (on the emulator) is bit for bit the emulator-only run's;
//! - the run is deterministic.
//!
//! Against the single-engine runs the greedy tokens agree up to the engines' numerics, the
//! bound of `tests/phases.rs`: the split run parts from the emulator-only run's tokens only at
//! a step where that run's own top-2 logit margin is below twice the largest difference between
//! the two engines' prefill logits, measured in the same test.

mod common;

use std::path::Path;

use common::{margin, tokens};

use ork_exec::{Linear, Session, WeightId};
use ork_runtime::{DeviceKind, Engine, EngineConfig, PackChoice, PhaseEngine, PhaseEngines};
use ork_testkit::model_path;

const DECODE: usize = 12;

fn config(model: &Path, pack: &Path, engines: PhaseEngines, share: Option<f64>) -> EngineConfig {
    let mut c = EngineConfig::new(model);
    c.pack = PackChoice::Path(pack.to_path_buf());
    c.budget_bytes = Some(1024 << 20);
    c.device = DeviceKind::Emu;
    if engines.uses(PhaseEngine::Cpu) {
        c.cpu = Some(ork_cpu::CpuOptions {
            threads: Some(2),
            cpus: None,
            ..Default::default()
        });
    }
    c.phases = engines.mixed().then_some(engines);
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

/// `m × k` activations, deterministic and varied.
fn acts(m: usize, k: usize, seed: u32) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32 / 1000.0
                - 1.0
        })
        .collect()
}

/// The split's rows of `ws` against each engine's own matmul of them, bit for bit.
fn rows_are_each_engines(split: &Engine, ws: &[(WeightId, usize, usize)], m: usize, seed: u32) {
    let s = split.split_linear().unwrap();
    let device = split.linear().unwrap();
    let cpu = split.cpu_linear().unwrap();
    let k = ws[0].1;
    let x = acts(m, k, seed);
    let mut ys: Vec<Vec<f32>> = ws.iter().map(|&(_, _, n)| vec![f32::NAN; m * n]).collect();
    let ids: Vec<WeightId> = ws.iter().map(|w| w.0).collect();
    let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
    s.matmul_many(&ids, &x, m, &mut outs).unwrap();
    for (&(id, _, n), y) in ws.iter().zip(&ys) {
        let (r, n2) = s.rows_of(id).unwrap();
        assert_eq!(n, n2);
        let (mut yd, mut yc) = (vec![0.0; m * n], vec![0.0; m * n]);
        device.matmul(id, &x, m, &mut yd).unwrap();
        cpu.matmul(id, &x, m, &mut yc).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want = if j < r { yd[i * n + j] } else { yc[i * n + j] };
                assert_eq!(
                    y[i * n + j].to_bits(),
                    want.to_bits(),
                    "weight {id} (r {r} of {n}), m {m}, row {i}, column {j}: {} vs {want}",
                    y[i * n + j]
                );
            }
        }
    }
}

/// Every row once, by its engine, at a share that splits every weight and at one that leaves
/// the narrow weights (k/v: 192 rows) wholly on the CPU.
#[test]
fn a_split_computes_every_row_once_on_the_engine_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    for share in [0.5, 0.03] {
        let split = Engine::open(config(&model_path(), &pack, SPLIT, Some(share))).unwrap();
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
    split_agrees(&model_path(), "SmolLM2");
}

/// A MoE model: the dense weights split, every expert slice wholly on the CPU.
#[test]
fn a_split_decode_on_a_moe_fixture_keeps_the_experts_on_the_cpu() {
    let model = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Perturbed);
    let st = split_agrees(&model, "MoE perturbed");
    assert!(st.cpu_calls > 0, "the experts' calls: {st:?}");
}

/// The split's checks of the module documentation on `model`; its counters.
fn split_agrees(model: &Path, what: &str) -> ork_runtime::SplitStats {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    let emu = Engine::open(config(
        model,
        &pack,
        PhaseEngines::one(PhaseEngine::Device),
        None,
    ))
    .unwrap();
    let cpu = Engine::open(config(
        model,
        &pack,
        PhaseEngines::one(PhaseEngine::Cpu),
        None,
    ))
    .unwrap();
    let split = Engine::open(config(model, &pack, SPLIT, Some(0.5))).unwrap();
    let name = split.compute_name();
    assert!(
        name.contains("decode split (emulated") && name.ends_with("rows 50%, cpu the rest)"),
        "{name}"
    );
    let prompt = split
        .tokenizer()
        .encode("The capital of France is", true, false)
        .unwrap();
    let logits = greedy(&mut split.session(), &prompt);
    let emu_logits = greedy(&mut emu.session(), &prompt);
    assert_eq!(logits[0], emu_logits[0], "{what}: prefill on the emulator");
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
    let cpu_first = cpu.session().prefill(&prompt).unwrap();
    let spread = emu_logits[0]
        .iter()
        .zip(&cpu_first)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let emu_run = tokens(&emu_logits);
    if let Some(i) = run.iter().zip(&emu_run).position(|(a, b)| a != b) {
        let m = margin(&emu_logits[i]);
        assert!(
            m < 2.0 * spread,
            "{what}: split {run:?} and emulator-only {emu_run:?} part at step {i}, margin {m} ≥ {}",
            2.0 * spread
        );
    }
    eprintln!("{what}: split {run:?}, emulator-only {emu_run:?}, engines' spread {spread}, {st:?}");
    st
}

#[test]
fn a_split_without_its_share_or_on_prefill_is_refused_before_opening() {
    let model = model_path();
    let pack = Path::new("/nonexistent/m.orkpack");
    for (engines, share) in [
        (SPLIT, None),
        (SPLIT, Some(1.0)),
        (SPLIT, Some(0.0)),
        (MIXED_CPU, Some(0.5)),
        (
            PhaseEngines {
                prefill: PhaseEngine::Split,
                decode: PhaseEngine::Cpu,
            },
            Some(0.5),
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
