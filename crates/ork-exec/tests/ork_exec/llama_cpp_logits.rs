//! SmolLM2 logits and perplexity against llama.cpp (scripts/exec_logits_golden.py).
//!
//! llama.cpp multiplies the Q4_1 weights with Q8_1-quantized activations while ork's reference
//! dequantizes to f32, so logits differ by quantization noise: the test bounds that noise and
//! requires the same top-1 token almost everywhere and the same perplexity within 1 %.
use super::real_model::{f32_linear, model, tokenizer};
use ork_exec::{perplexity, KvType, Session};

#[derive(serde::Deserialize)]
struct Golden {
    add_bos: bool,
    tokens: Vec<u32>,
    top5: Vec<Top>,
    perplexity: Ppl,
}

#[derive(serde::Deserialize)]
struct Top {
    ids: Vec<u32>,
    logits: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Ppl {
    n_ctx: usize,
    chunks: usize,
    scored: usize,
    ppl: f64,
}

fn golden() -> Golden {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/smollm2_logits.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("golden JSON")
}

#[test]
fn logits_and_perplexity_match_llama_cpp() {
    let g = golden();
    let (model, linear) = (model(), f32_linear());
    assert_eq!(g.add_bos, tokenizer().add_bos());

    let logits = Session::new(std::sync::Arc::clone(model), std::sync::Arc::clone(linear))
        .forward_all(&g.tokens)
        .unwrap();
    let v = model.config().vocab_size;
    let (mut agree, mut worst) = (0, 0.0f32);
    for (i, top) in g.top5.iter().enumerate() {
        let row = &logits[i * v..(i + 1) * v];
        if ork_exec::ops::argmax(row) == Some(top.ids[0] as usize) {
            agree += 1;
        }
        for (&id, &l) in top.ids.iter().zip(&top.logits) {
            worst = worst.max((row[id as usize] - l).abs());
        }
    }
    eprintln!(
        "top-1 agreement with llama.cpp {agree}/{}; worst top-5 logit difference {worst:.3}",
        g.top5.len()
    );
    assert!(
        agree * 100 >= g.top5.len() * 95,
        "top-1 agreement {agree}/{}",
        g.top5.len()
    );
    assert!(
        worst < 1.0,
        "top-5 logits differ from llama.cpp by up to {worst}"
    );

    let bos = tokenizer().add_bos().then(|| tokenizer().bos()).flatten();
    let r = perplexity(
        model,
        linear,
        &g.tokens,
        g.perplexity.n_ctx,
        bos,
        KvType::F16,
    )
    .unwrap();
    eprintln!(
        "perplexity ork {:.4} ± {:.4}, llama.cpp {:.4}",
        r.ppl, r.ppl_error, g.perplexity.ppl
    );
    assert_eq!(
        (r.chunks, r.scored),
        (g.perplexity.chunks, g.perplexity.scored)
    );
    assert!(
        (r.ppl / g.perplexity.ppl - 1.0).abs() < 0.01,
        "ppl {} vs llama.cpp {}",
        r.ppl,
        g.perplexity.ppl
    );
}
