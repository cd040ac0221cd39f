//! Write a sparse llama-shaped GGUF of given dimensions (tensor data a hole: no disk), for
//! `ork plan --project` on a published model's shapes without downloading it
//! (`scripts/board_catalogue.py`, docs/board-model.md "Will it run on my board?").
//!
//! `cargo run -p ork-testkit --example sparse_model -- OUT.gguf N_LAYER D_MODEL FFN N_HEAD
//! N_HEAD_KV HEAD_DIM VOCAB [TYPE [OUTPUT_TYPE|tied [EXPERTS:TOP_K]]]` — TYPE (default F16) for
//! the block weights, OUTPUT_TYPE for the output projection (default TYPE; `tied`: none, the
//! token embedding serves), EXPERTS:TOP_K for a mixture of experts of FFN width FFN each.
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: sparse_model OUT.gguf N_LAYER D_MODEL FFN N_HEAD N_HEAD_KV HEAD_DIM VOCAB \
                 [TYPE [OUTPUT_TYPE|tied [EXPERTS:TOP_K]]]";
    if !(8..=11).contains(&args.len()) {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    let mut n = Vec::new();
    for (a, what) in args[1..8].iter().zip([
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
    let shape = ork_testkit::sparse::llama_shape([n[0], n[1], n[2], n[3], n[4], n[5], n[6]]);
    let ty_arg = args.get(8).map_or("F16", String::as_str);
    let Some(ty) = ork_testkit::sparse::sparse_type(ty_arg) else {
        eprintln!("error: TYPE {ty_arg:?} is not one of F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K\n{usage}");
        return ExitCode::from(2);
    };
    let output = match args.get(9).map(String::as_str) {
        None => Some(ty),
        Some("tied") => None,
        Some(o) => match ork_testkit::sparse::sparse_type(o) {
            Some(t) => Some(t),
            None => {
                eprintln!("error: OUTPUT_TYPE {o:?} is not a type sparse_model writes\n{usage}");
                return ExitCode::from(2);
            }
        },
    };
    let experts = match args.get(10).map(|a| a.split_once(':')) {
        None => (0, 0),
        Some(Some((e, k))) => {
            match (e.parse::<usize>(), k.parse::<usize>()) {
                (Ok(e), Ok(k)) if e > 0 && k > 0 && k <= e => (e, k),
                _ => {
                    eprintln!("error: EXPERTS:TOP_K must be two positive integers, TOP_K <= EXPERTS\n{usage}");
                    return ExitCode::from(2);
                }
            }
        }
        Some(None) => {
            eprintln!("error: EXPERTS:TOP_K must be two integers joined by ':'\n{usage}");
            return ExitCode::from(2);
        }
    };
    let path = std::path::Path::new(&args[0]);
    match ork_testkit::sparse::write_sparse_typed(path, &shape, ty, output, experts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}: {e}", args[0]);
            ExitCode::FAILURE
        }
    }
}
