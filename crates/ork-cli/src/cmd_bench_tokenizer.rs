//! `ork bench tokenizer`: build, encode and decode speed of each model's tokenizer on one text,
//! as ratios to the first model's, measured in the same run (docs/models.md, Tokenizers).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use ork_exec::Tokenizer;
use ork_gguf::GgufFile;
use serde::Serialize;

use crate::cmd_pack::print_json;

#[derive(Serialize)]
struct TokenizerCase {
    model: PathBuf,
    /// `tokenizer.ggml.model`.
    kind: String,
    vocab: usize,
    build_seconds: f64,
    text_bytes: usize,
    tokens: usize,
    /// Median over the rounds, special-token parsing on (as chat prompts are encoded).
    encode_seconds: f64,
    encode_mb_s: f64,
    decode_seconds: f64,
    decode_mb_s: f64,
    /// This model's encode time over the first model's (same run).
    encode_time_ratio: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `ork bench tokenizer --model A.gguf [--model B.gguf …] --file TEXT [--rounds N] [--json]`.
pub fn bench_tokenizer(
    models: &[PathBuf],
    file: &Path,
    rounds: usize,
    json: bool,
) -> Result<ExitCode> {
    let text = crate::input::read_text(file, "--file")?;
    let mut cases: Vec<TokenizerCase> = Vec::new();
    for path in models {
        let gguf = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        let kind = gguf
            .metadata("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_owned();
        let t0 = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).with_context(|| path.display().to_string())?;
        let build_seconds = t0.elapsed().as_secs_f64();
        let (mut enc, mut dec) = (Vec::new(), Vec::new());
        let mut ids = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            ids = tok
                .encode(&text, false, true)
                .with_context(|| format!("encoding {} with {}", file.display(), path.display()))?;
            enc.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let back = tok.decode(&ids, true)?;
            dec.push(t.elapsed().as_secs_f64());
            std::hint::black_box(back);
        }
        let (encode_seconds, decode_seconds) = (median(enc), median(dec));
        let mb = text.len() as f64 / 1e6;
        let first = cases.first().map_or(encode_seconds, |c| c.encode_seconds);
        cases.push(TokenizerCase {
            model: path.clone(),
            kind,
            vocab: tok.vocab_size(),
            build_seconds,
            text_bytes: text.len(),
            tokens: ids.len(),
            encode_seconds,
            encode_mb_s: mb / encode_seconds,
            decode_seconds,
            decode_mb_s: mb / decode_seconds,
            encode_time_ratio: encode_seconds / first,
        });
    }
    if json {
        print_json(&cases)?;
    } else {
        println!(
            "{:<40} {:>6} {:>7} {:>8} {:>9} {:>10} {:>10} {:>8}",
            "model", "kind", "vocab", "build s", "tokens", "enc MB/s", "dec MB/s", "enc ×"
        );
        for c in &cases {
            let name = c.model.file_name().map_or_else(
                || c.model.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            println!(
                "{:<40} {:>6} {:>7} {:>8.3} {:>9} {:>10.2} {:>10.1} {:>8.2}",
                name,
                c.kind,
                c.vocab,
                c.build_seconds,
                c.tokens,
                c.encode_mb_s,
                c.decode_mb_s,
                c.encode_time_ratio
            );
        }
        println!(
            "({} bytes, median of {rounds} rounds; enc × = encode time over the first model's)",
            text.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
