//! Perplexity of a text file under llama.cpp's `llama-perplexity` protocol, with the CPU f32
//! reference or the w8a8 quantization reference.
//!
//! `cargo run -p ork-exec --profile test --example perplexity -- MODEL.gguf TEXT_FILE [N_CTX] [f32|w8a8] [MAX_CHUNKS]`
use ork_exec::{perplexity, CpuF32Linear, CpuW8A8Linear, KvType, Linear, Model, Tokenizer};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model_path, text_path, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: perplexity MODEL.gguf TEXT_FILE [N_CTX] [f32|w8a8] [MAX_CHUNKS]".into(),
        );
    };
    let n_ctx: usize = rest.first().map_or(Ok(512), |s| s.parse())?;
    let kind = rest.get(1).map_or("f32", String::as_str);
    let max_chunks: Option<usize> = rest.get(2).map(|s| s.parse()).transpose()?;

    let gguf = std::sync::Arc::new(ork_gguf::GgufFile::open(std::path::Path::new(model_path))?);
    let model = std::sync::Arc::new(Model::load(&gguf)?);
    let tok = Tokenizer::from_gguf(&gguf)?;
    let text = std::fs::read_to_string(text_path)?;
    // As llama-perplexity: tokenize with BOS if the vocabulary adds it, no special parsing.
    let mut tokens = tok.encode(&text, true, false)?;
    if let Some(c) = max_chunks {
        tokens.truncate(c * n_ctx);
    }
    let linear: std::sync::Arc<dyn Linear> = match kind {
        "f32" => std::sync::Arc::new(CpuF32Linear::from_gguf(&gguf, model.matmul_weights())?),
        "w8a8" => std::sync::Arc::new(CpuW8A8Linear::from_gguf(&gguf, model.matmul_weights())?),
        other => return Err(format!("unknown linear '{other}' (f32 or w8a8)").into()),
    };
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let t = Instant::now();
    let r = perplexity(&model, &linear, &tokens, n_ctx, bos, KvType::default())?;
    let secs = t.elapsed().as_secs_f64();
    for (i, p) in r.running.iter().enumerate() {
        print!("[{}]{p:.4},", i + 1);
    }
    println!();
    println!(
        "{kind}: PPL = {:.4} +/- {:.5} over {} chunks of {} ({} scored tokens), {:.1} s, {:.1} tok/s",
        r.ppl,
        r.ppl_error,
        r.chunks,
        r.n_ctx,
        r.scored,
        secs,
        (r.chunks * r.n_ctx) as f64 / secs
    );
    Ok(())
}
