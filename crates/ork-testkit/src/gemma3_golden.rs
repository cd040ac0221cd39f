//! llama.cpp's numbers for the real Gemma 3 270M, as `scripts/gemma3_golden.py` recorded them
//! in `crates/ork-exec/tests/golden/gemma3_logits.json` (tokens as ids), for the tests of
//! ork-exec (f32 reference) and ork-runtime (the device's quantizations).

use serde::Deserialize;

/// The real model's part of the golden file.
#[derive(Debug, Deserialize)]
pub struct Gemma3Golden {
    /// SHA-256 (hex) of the GGUF the numbers were computed on.
    pub sha256: String,
    /// A fixed text's tokens (BOS first).
    pub tokens: Vec<u32>,
    /// llama.cpp's five best tokens at every position of `tokens`.
    pub top5: Vec<Top>,
    /// Three prompts and llama.cpp's greedy continuations.
    pub greedy: Vec<Greedy>,
    /// The GPL-3 perplexity run.
    pub perplexity: Perplexity,
}

/// A position's five best tokens and their logits.
#[derive(Debug, Deserialize)]
pub struct Top {
    /// Token ids, best first.
    pub ids: Vec<u32>,
    /// Their logits.
    pub logits: Vec<f32>,
}

/// A prompt and llama.cpp's greedy tokens after it.
#[derive(Debug, Deserialize)]
pub struct Greedy {
    /// The prompt text.
    pub prompt: String,
    /// Its tokens as llama.cpp tokenizes it (BOS first).
    pub tokens: Vec<u32>,
    /// The greedy continuation.
    pub greedy: Vec<u32>,
    /// At each greedy step, the gap between llama.cpp's two best logits.
    pub gaps: Vec<f32>,
}

/// llama-perplexity's protocol over a text: chunks of `n_ctx`, BOS replacing each chunk's first
/// token, the second half of each chunk scored.
#[derive(Debug, Deserialize)]
pub struct Perplexity {
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// The whole text's tokens.
    pub tokens: Vec<u32>,
    /// Per chunk, the summed negative log-likelihood of its scored tokens.
    pub chunk_nll: Vec<f64>,
    /// Tokens scored per chunk.
    pub scored_per_chunk: usize,
}

impl Perplexity {
    /// llama.cpp's perplexity over the first `chunks` chunks.
    pub fn first_chunks(&self, chunks: usize) -> f64 {
        let nll: f64 = self.chunk_nll[..chunks].iter().sum();
        (nll / (chunks * self.scored_per_chunk) as f64).exp()
    }
}

#[derive(Deserialize)]
struct File {
    model: Gemma3Golden,
}

/// Read the golden file.
///
/// # Panics
/// If it is missing or malformed.
pub fn gemma3_golden() -> Gemma3Golden {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ork-exec/tests/golden/gemma3_logits.json"
    );
    let text = std::fs::read_to_string(path).expect("the gemma3 golden file");
    let file: File = serde_json::from_str(&text).expect("the gemma3 golden JSON");
    file.model
}
