//! Helpers shared by ork-runtime's test binaries.
use ork_exec::{generate, GenerateOptions, Sampler, Session};

/// Greedy generation of `n` tokens after `tokens` (no stop token), the tokens generated.
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
