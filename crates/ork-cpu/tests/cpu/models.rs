//! Whole models on the CPU engine against the f32 reference: the fixtures in each type, the
//! MoE fixture, and the real SmolLM2.
//!
//! Bounds: the engine quantizes every matmul's activations to 8 bits per block (ggml's
//! scheme); each product is then within [`super::matmul`]'s bound of the exact one, about
//! 0.4 % of the block's largest activation per value. Through a few blocks these relative errors
//! add up to about a percent of the logits' spread on SmolLM2: the tests allow 3 % of the spread
//! (max − min of the reference's logits at that step), and require the same greedy token
//! wherever the reference's top two logits are at least 0.5 apart (ties within the error may go
//! either way, as between llama.cpp's backends).

use std::sync::Arc;

use ork_exec::{CpuF32Linear, Linear, Model, Session};
use ork_gguf::GgmlType;

use super::fixtures::{open, qwen3moe_in, smollm2_in};
use super::matmul::TYPES;

/// Fraction of the logits' spread a dense model may differ by.
const SPREAD: f32 = 6e-2;
/// Fraction of the logits' spread a MoE model may differ by.
const SPREAD_MOE: f32 = 15e-2;
/// Top-two margin above which the greedy token must be the reference's.
const MARGIN: f32 = 0.5;

fn argmax_margin(l: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &v) in l.iter().enumerate() {
        if v > best.1 {
            second = best.1;
            best = (i, v);
        } else if v > second {
            second = v;
        }
    }
    (best.0 as u32, best.1 - second)
}

/// The reference decodes `steps` greedy tokens after `prompt`; the engine is fed the same
/// tokens (teacher forcing) and its logits are compared at every step. Returns the tokens.
pub fn compare(
    model: &Arc<Model>,
    cpu: Arc<dyn Linear>,
    reference: Arc<CpuF32Linear>,
    prompt: &[u32],
    steps: usize,
    what: &str,
) -> Vec<u32> {
    let spread = if model.moe_stats().is_some() {
        SPREAD_MOE
    } else {
        SPREAD
    };
    let mut r = Session::new(Arc::clone(model), reference);
    let mut c = Session::new(Arc::clone(model), cpu);
    let (mut lr, mut lc) = (r.prefill(prompt).unwrap(), c.prefill(prompt).unwrap());
    let mut tokens = Vec::new();
    for step in 0..steps {
        let lo = lr.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = lr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let err = lr
            .iter()
            .zip(&lc)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            err <= spread * (hi - lo),
            "{what} step {step}: logits differ by {err}, spread {}",
            hi - lo
        );
        let (tok, margin) = argmax_margin(&lr);
        if margin >= MARGIN {
            assert_eq!(
                argmax_margin(&lc).0,
                tok,
                "{what} step {step}: margin {margin}"
            );
        }
        tokens.push(tok);
        lr = r.decode(tok).unwrap();
        lc = c.decode(tok).unwrap();
    }
    tokens
}

fn prompt(model: &std::path::Path) -> Vec<u32> {
    let gguf = ork_gguf::GgufFile::open(model).unwrap();
    let tok = ork_exec::Tokenizer::from_gguf(&gguf).unwrap();
    tok.encode("The capital of France is", true, false).unwrap()
}

#[test]
fn fixtures_in_every_type_follow_the_reference() {
    for ty in TYPES {
        let path = smollm2_in(ty);
        let (model, cpu, reference) = open(&path, 2);
        compare(
            &model,
            cpu,
            reference,
            &prompt(&path),
            8,
            &format!("smollm2 {ty}"),
        );
    }
}

#[test]
fn moe_experts_are_computed_in_place() {
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        let path = qwen3moe_in(ty);
        let (model, cpu, reference) = open(&path, 2);
        let experts = model
            .matmul_weights()
            .iter()
            .filter(|s| s.name.contains('#'))
            .count();
        assert_eq!(
            experts,
            ork_testkit::moe::QWEN_LAYERS * ork_testkit::moe::N_EXPERT * 3
        );
        // Every expert's bytes are its own slice of the 3-D tensor.
        let counts = cpu.type_counts();
        let gguf = ork_gguf::GgufFile::open(&path).unwrap();
        let exps: u64 = gguf
            .tensors()
            .iter()
            .filter(|t| t.name.contains("_exps"))
            .map(|t| t.size)
            .sum();
        assert!(counts.iter().map(|c| c.bytes).sum::<u64>() >= exps);
        compare(
            &model,
            cpu,
            reference,
            &prompt(&path),
            8,
            &format!("qwen3moe {ty}"),
        );
    }
}

#[test]
fn smollm2_greedy_32_tokens_follow_the_reference() {
    let path = ork_testkit::model_path();
    let (model, cpu, reference) = open(&path, 2);
    let tokens = compare(&model, cpu, reference, &prompt(&path), 32, "SmolLM2 Q4_1");
    assert_eq!(tokens.len(), 32);
}

#[test]
fn one_and_two_threads_give_the_same_bits() {
    let path = smollm2_in(GgmlType::Q4_1);
    let run = |threads| {
        let (model, cpu, _) = open(&path, threads);
        let mut s = Session::new(model, cpu);
        let mut l = s.prefill(&prompt(&path)).unwrap();
        let mut bits = Vec::new();
        for _ in 0..4 {
            bits.extend(l.iter().map(|v| v.to_bits()));
            let t = argmax_margin(&l).0;
            l = s.decode(t).unwrap();
        }
        bits
    };
    assert_eq!(run(1), run(2));
}
