//! Helpers shared by ork-runtime's test binaries.
use ork_exec::{generate, GenerateOptions, Sampler, Session};

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
