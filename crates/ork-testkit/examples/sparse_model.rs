//! Write a sparse llama-shaped GGUF of given dimensions (tensor data a hole: no disk), for
//! `ork plan --project` on a published model's shapes without downloading it
//! (`scripts/board_catalogue.py`, docs/board-model.md "Will it run on my board?").
//!
//! `cargo run -p ork-testkit --example sparse_model -- OUT.gguf N_LAYER D_MODEL FFN N_HEAD
//! N_HEAD_KV HEAD_DIM VOCAB`
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: sparse_model OUT.gguf N_LAYER D_MODEL FFN N_HEAD N_HEAD_KV HEAD_DIM VOCAB";
    if args.len() != 8 {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    let mut n = Vec::new();
    for (a, what) in args[1..].iter().zip([
        "N_LAYER",
        "D_MODEL",
        "FFN",
        "N_HEAD",
        "N_HEAD_KV",
        "HEAD_DIM",
        "VOCAB",
    ]) {
        match a.parse::<usize>() {
            Ok(v) if v > 0 => n.push(v),
            _ => {
                eprintln!("error: {what} must be a positive integer, got {a:?}\n{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let shape = ork_testkit::sparse::LlamaShape {
        n_layer: n[0],
        d_model: n[1],
        ffn: n[2],
        n_head: n[3],
        n_head_kv: n[4],
        head_dim: n[5],
        vocab: n[6],
    };
    match ork_testkit::sparse::write_sparse_llama(std::path::Path::new(&args[0]), &shape) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}: {e}", args[0]);
            ExitCode::FAILURE
        }
    }
}
