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
    c.phases = engines.mixed().then_some(engines);
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
