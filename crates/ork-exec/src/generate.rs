//! The generation loop: prefill the prompt, then sample and decode until a stop.
use crate::sample::Sampler;
use crate::session::Session;
use crate::ExecError;
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Tokens that end generation (e.g. [`crate::Tokenizer::end_of_generation`]); the stop
    /// token is not decoded and not returned.
    pub stop_tokens: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token was sampled.
    EndOfGeneration(u32),
    /// `max_tokens` were generated.
    MaxTokens,
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated tokens, without the stop token.
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Wall time of the prefill.
    pub prefill_time: Duration,
    /// Wall time of all decode steps.
    pub decode_time: Duration,
    /// Decode steps run (tokens evaluated after the prompt).
    pub decode_steps: usize,
}

/// Prefill `prompt` into `session`, then generate up to `options.max_tokens` tokens, calling
/// `on_token` with each one as soon as it is chosen.
///
/// Fails up front with [`ExecError::ContextOverflow`] when the cached positions, the prompt and
/// `max_tokens` together exceed the session's context, and with [`ExecError::EmptyPrompt`] for an
/// empty prompt.
pub fn generate(
    session: &mut Session,
    prompt: &[u32],
    options: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> Result<(), ExecError>,
) -> Result<Generation, ExecError> {
    if prompt.is_empty() {
        return Err(ExecError::EmptyPrompt);
    }
    let needed = session.position() + prompt.len() + options.max_tokens;
    if needed > session.context() {
        return Err(ExecError::ContextOverflow {
            needed,
            context: session.context(),
        });
    }
    let t0 = Instant::now();
    let mut logits = session.prefill(prompt)?;
    let prefill_time = t0.elapsed();

    let mut tokens = Vec::new();
    let mut decode_time = Duration::ZERO;
    let mut decode_steps = 0;
    let stop = loop {
        if tokens.len() == options.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits)?;
        if options.stop_tokens.contains(&next) {
            break StopReason::EndOfGeneration(next);
        }
        tokens.push(next);
        on_token(next)?;
        if tokens.len() == options.max_tokens {
            break StopReason::MaxTokens;
        }
        let t = Instant::now();
        logits = session.decode(next)?;
        decode_time += t.elapsed();
        decode_steps += 1;
    };
    Ok(Generation {
        tokens,
        stop,
        prompt_tokens: prompt.len(),
        prefill_time,
        decode_time,
        decode_steps,
    })
}
