//! CPU reference throughput on a GGUF model: prefill and decode tokens per second with
//! `CpuF32Linear` and `CpuW8A8Linear`.
//!
//! `cargo run -p ork-exec --profile test --example cpu_speed -- [MODEL.gguf] [PROMPT_TOKENS] [DECODE_TOKENS]`
use ork_exec::{CpuF32Linear, CpuW8A8Linear, Linear, Model, Session, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| ".cache/SmolLM2-135M-Instruct.Q4_1.gguf".to_owned());
    let n_prompt: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let n_decode: usize = args.next().map_or(Ok(32), |s| s.parse())?;

    let gguf = std::sync::Arc::new(ork_gguf::GgufFile::open(std::path::Path::new(&path))?);
    let model = Arc::new(Model::load(&gguf)?);
    let tok = Tokenizer::from_gguf(&gguf)?;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(n_prompt);
    let prompt: Vec<u32> = tok
        .encode(&text, true, false)?
        .into_iter()
        .take(n_prompt)
        .collect();

    let t = Instant::now();
    let f32_linear: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&gguf, model.matmul_weights())?);
    println!("dequantize to f32: {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let w8a8: Arc<dyn Linear> = Arc::new(CpuW8A8Linear::from_gguf(&gguf, model.matmul_weights())?);
    println!("quantize to w8a8: {:.2} s", t.elapsed().as_secs_f64());

    for (name, linear) in [("f32", f32_linear), ("w8a8", w8a8)] {
        let mut session = Session::new(Arc::clone(&model), linear);
        let t = Instant::now();
        let mut logits = session.prefill(&prompt)?;
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..n_decode {
            let next = ork_exec::ops::argmax(&logits).unwrap_or(0) as u32;
            logits = session.decode(next)?;
        }
        let decode = t.elapsed().as_secs_f64();
        println!(
            "{name:5} prefill {} tok: {:.1} tok/s | decode {n_decode} tok: {:.1} tok/s ({} threads)",
            prompt.len(),
            prompt.len() as f64 / prefill,
            n_decode as f64 / decode,
            rayon::current_num_threads()
        );
    }
    Ok(())
}
