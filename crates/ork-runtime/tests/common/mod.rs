//! Helpers shared by ork-runtime's test binaries.
use std::path::Path;

use ork_exec::{generate, GenerateOptions, Sampler, Session};
use ork_runtime::{DeviceKind, EngineConfig, PackChoice, PhaseEngine, PhaseEngines};

/// `model` on the emulator (pack `pack`, a 1 GiB budget) for the engines `engines`; the CPU
/// engine, where a phase uses it, on 2 workers: the engines-per-phase tests' setup.
#[allow(dead_code)]
pub fn config(model: &Path, pack: &Path, engines: PhaseEngines) -> EngineConfig {
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
    c.phases = engines.per_phase().then_some(engines);
    c
}

/// Greedy generation of `n` tokens after `tokens` (no stop token), the tokens generated.
#[allow(dead_code)]
pub fn run_greedy(mut session: Session, tokens: &[u32], n: usize) -> Vec<u32> {
    let options = GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
    };
    generate(
        &mut session,
        tokens,
        &options,
        &mut Sampler::greedy(),
        |_| Ok(()),
    )
    .unwrap()
    .tokens
}

/// The highest logit's token.
#[allow(dead_code)]
pub fn argmax(l: &[f32]) -> u32 {
    ork_exec::ops::argmax(l).unwrap() as u32
}

/// Top-1 minus top-2 of `l`.
#[allow(dead_code)]
pub fn margin(l: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in l {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Greedy: the prefill's logits, then `n` decode steps; every step's logits.
#[allow(dead_code)]
pub fn greedy_logits(session: &mut Session, prompt: &[u32], n: usize) -> Vec<Vec<f32>> {
    let mut logits = vec![session.prefill(prompt).unwrap()];
    for _ in 0..n {
        let next = argmax(logits.last().unwrap());
        logits.push(session.decode(next).unwrap());
    }
    logits
}

/// Each step's greedy token.
#[allow(dead_code)]
pub fn tokens(logits: &[Vec<f32>]) -> Vec<u32> {
    logits.iter().map(|l| argmax(l)).collect()
}

/// `m × k` activations, deterministic and varied.
#[allow(dead_code)]
pub fn acts(m: usize, k: usize, seed: u32) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32 / 1000.0
                - 1.0
        })
        .collect()
}

/// The rows `s` (a split of `split`'s) computes of `ws` against each engine's own matmul of
/// them, bit for bit: every value written (the output starts as NaN), rows `0..r` the device's,
/// `r..n` the CPU engine's.
#[allow(dead_code)]
pub fn rows_are_each_engines(
    split: &ork_runtime::Engine,
    s: &ork_runtime::SplitLinear,
    ws: &[(ork_exec::WeightId, usize, usize)],
    m: usize,
    seed: u32,
) {
    use ork_exec::Linear;
    let device = split.linear().unwrap();
    let cpu = split.cpu_linear().unwrap();
    let k = ws[0].1;
    let x = acts(m, k, seed);
    let mut ys: Vec<Vec<f32>> = ws.iter().map(|&(_, _, n)| vec![f32::NAN; m * n]).collect();
    let ids: Vec<ork_exec::WeightId> = ws.iter().map(|w| w.0).collect();
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
