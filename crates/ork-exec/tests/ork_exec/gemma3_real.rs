//! The real Gemma 3 270M (Q4_K_M) on ork's f32 reference against llama.cpp
//! (scripts/gemma3_golden.py; tokens as ids, so no tokenizer is involved).
//!
//! llama.cpp multiplies the K-quant weights with 8-bit-quantized activations and keeps an f16 KV
//! cache, while the reference dequantizes the weights to f32: logits differ by that noise, so the
//! tests bound it. The device quantizations (w16a16, w8a8) are checked in ork-runtime's tests.
use super::gemma3::sha256_hex;
use ork_exec::{perplexity, CpuF32Linear, KvType, Linear, Model, Session};
use ork_gguf::GgufFile;
use ork_testkit::gemma3_golden::gemma3_golden as golden;
use std::sync::{Arc, OnceLock};

fn model() -> &'static (Arc<Model>, Arc<dyn Linear>) {
    static M: OnceLock<(Arc<Model>, Arc<dyn Linear>)> = OnceLock::new();
    M.get_or_init(|| {
        let gguf = Arc::new(GgufFile::open(&ork_testkit::gemma3_path()).expect("open Gemma 3"));
        let model = Arc::new(Model::load(&gguf).expect("load Gemma 3"));
        let linear: Arc<dyn Linear> =
            Arc::new(CpuF32Linear::from_gguf(&gguf, model.matmul_weights()).expect("weights"));
        (model, linear)
    })
}

#[test]
fn config_matches_the_file() {
    let c = model().0.config();
    assert_eq!(c.arch, ork_exec::Arch::Gemma3);
    assert_eq!((c.n_layer, c.n_embd, c.n_ff), (18, 640, 2048));
    assert_eq!((c.n_head, c.n_head_kv, c.head_dim_k), (4, 1, 256));
    assert_eq!((c.rope_base, c.vocab_size), (1_000_000.0, 262_144));
    let g = c.gemma3.as_ref().unwrap();
    assert_eq!(g.window, Some(512));
    let global: Vec<usize> = (0..18).filter(|&i| !g.local[i]).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(g.rope_base_local, 10_000.0);
    assert_eq!(g.attn_scale, 1.0 / 16.0);
    // The tied output head: the embedding, 262,144 rows.
    let m = &model().0;
    assert_eq!(m.manifest().get(m.output_weight()).key, "token_embd.weight");
}

/// Logits of a 50-token text at every position: the same top-1 token as llama.cpp almost
/// everywhere and top-5 logits within quantization noise.
#[test]
fn logits_match_llama_cpp() {
    let g = golden();
    let bytes = std::fs::read(ork_testkit::gemma3_path()).unwrap();
    assert_eq!(
        sha256_hex(&bytes),
        g.sha256,
        "not the file the golden was made from"
    );
    let (model, linear) = model();
    let logits = Session::new(Arc::clone(model), Arc::clone(linear))
        .forward_all(&g.tokens)
        .unwrap();
    let v = model.config().vocab_size;
    let (mut agree, mut worst, mut sum) = (0, 0.0f32, 0.0f32);
    for (i, top) in g.top5.iter().enumerate() {
        let row = &logits[i * v..(i + 1) * v];
        if ork_exec::ops::argmax(row) == Some(top.ids[0] as usize) {
            agree += 1;
        }
        for (&id, &l) in top.ids.iter().zip(&top.logits) {
            let d = (row[id as usize] - l).abs();
            worst = worst.max(d);
            sum += d;
        }
    }
    let mean = sum / (5 * g.top5.len()) as f32;
    eprintln!(
        "top-1 agreement with llama.cpp {agree}/{}; top-5 logit difference worst {worst:.3}, \
         mean {mean:.3}",
        g.top5.len()
    );
    assert!(agree * 100 >= g.top5.len() * 95, "top-1 {agree}");
    assert!(worst < 1.0 && mean < 0.25, "worst {worst}, mean {mean}");
}

/// The first chunk of the GPL-3 perplexity run (n_ctx 512, the second half scored) within 1.5 %
/// of llama.cpp's on the same chunk (measured: ork 12.87, llama.cpp 12.99; llama.cpp's 8-bit
/// activations cost it the 0.9 %; with llama.cpp's f16 GeLU table mimicked ork gave 12.87 too).
/// The whole text: docs/models.md.
#[test]
fn first_perplexity_chunk_matches_llama_cpp() {
    let g = golden().perplexity;
    let (model, linear) = model();
    let n = g.n_ctx;
    let r = perplexity(model, linear, &g.tokens[..n], n, Some(2), KvType::F16).unwrap();
    let theirs = g.first_chunks(1);
    eprintln!("GPL-3 chunk 1: ork f32 {:.4}, llama.cpp {theirs:.4}", r.ppl);
    assert!(
        (r.ppl / theirs - 1.0).abs() < 0.015,
        "{} vs {theirs}",
        r.ppl
    );
}
