//! Perplexity with llama.cpp's `llama-perplexity` protocol (tools/perplexity/perplexity.cpp,
//! `perplexity()`), so figures are comparable with llama.cpp's:
//!
//! - the token stream (tokenized with BOS if the vocabulary adds one) is cut into
//!   `tokens.len() / n_ctx` chunks of `n_ctx` tokens; the tail is dropped; at least two chunks;
//! - each chunk is evaluated from an empty KV cache, its first token replaced by BOS when the
//!   vocabulary adds BOS;
//! - only the second half is scored: the logits at positions `n_ctx/2 ..= n_ctx-2` predict the
//!   next token (`n_ctx - n_ctx/2 - 1` tokens per chunk);
//! - `log p = (l_tok - max) - ln Σ exp(l - max)` with the sum in double; `ppl = exp(mean NLL)`;
//!   the ± is llama.cpp's `sqrt(var(NLL) / (count - 1)) · ppl`.
use crate::linear::Linear;
use crate::model::Model;
use crate::session::{KvType, Session};
use crate::ExecError;
use rayon::prelude::*;
use std::sync::Arc;

/// Result of [`perplexity`].
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityReport {
    /// `exp(mean NLL)`.
    pub ppl: f64,
    /// llama.cpp's uncertainty estimate of `ppl` (the `+/-` of its final line).
    pub ppl_error: f64,
    /// Mean negative log-likelihood (nats per token).
    pub mean_nll: f64,
    /// Window size.
    pub n_ctx: usize,
    /// Chunks evaluated.
    pub chunks: usize,
    /// Tokens scored.
    pub scored: usize,
    /// Running perplexity after each chunk (llama.cpp prints these as `[i]ppl`).
    pub running: Vec<f64>,
}

/// Perplexity of `tokens` in windows of `n_ctx`. `bos` is the BOS id if the vocabulary adds BOS
/// (then every chunk starts with it), `None` otherwise. `kv_type` is the KV cache's type
/// (llama.cpp's `llama-perplexity` keeps an f16 cache by default).
pub fn perplexity(
    model: &Arc<Model>,
    linear: &Arc<dyn Linear>,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
) -> Result<PerplexityReport, ExecError> {
    let first = n_ctx / 2;
    if n_ctx < 3 {
        return Err(ExecError::InvalidContext {
            context: n_ctx,
            what: "perplexity scores n_ctx - n_ctx/2 - 1 tokens per chunk; need n_ctx ≥ 3"
                .to_owned(),
        });
    }
    // One whole window is enough (llama-perplexity insists on two; `ork perplexity --chunks 1`
    // asks for exactly one).
    let needed = n_ctx;
    if tokens.len() < needed {
        return Err(ExecError::NotEnoughTokens {
            needed,
            context: n_ctx,
            got: tokens.len(),
        });
    }
    let vocab = model.config().vocab_size;
    let chunks = tokens.len() / n_ctx;
    let mut session =
        Session::with_context(Arc::clone(model), Arc::clone(linear), n_ctx)?.with_kv_type(kv_type);
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(chunks);
    let mut chunk = vec![0u32; n_ctx];
    for c in 0..chunks {
        chunk.copy_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        session.reset();
        // The first half only builds context: its logits are never scored.
        session.prefill(&chunk[..first])?;
        let logits = session.forward_all(&chunk[first..])?;
        // Row j holds the logits at position first + j, predicting chunk[first + j + 1].
        let (s, s2) = (0..n_ctx - first - 1)
            .into_par_iter()
            .map(|j| {
                let row = &logits[j * vocab..(j + 1) * vocab];
                let v = -log_softmax(row, chunk[first + j + 1] as usize);
                (v, v * v)
            })
            .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        nll += s;
        nll2 += s2;
        count += n_ctx - first - 1;
        running.push((nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let ppl_error = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PerplexityReport {
        ppl,
        ppl_error,
        mean_nll: mean,
        n_ctx,
        chunks,
        scored: count,
        running,
    })
}

/// `log softmax(logits)[tok]` as llama.cpp computes it.
fn log_softmax(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(logits[tok] - max) - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_uniform() {
        let v = log_softmax(&[1.0; 4], 2);
        assert!((v - (0.25f64).ln()).abs() < 1e-9);
    }
}
