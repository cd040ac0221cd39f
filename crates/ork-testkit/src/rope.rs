//! Small random-weight models for the RoPE frequency factor and phi3 goldens
//! (scripts/rope_golden.py computes llama.cpp's logits on these files;
//! `crates/ork-exec/tests/ork_exec/rope_golden.rs` compares ork's). All tensors F32, so that
//! llama.cpp's products are exact f32 ones, as ork's reference; the weights come from the
//! SplitMix64 [`Rng`] with a fixed seed per fixture, so the Rust test rebuilds the same bytes the
//! script read (the golden records the file size as a check).
//!
//! - [`RopeFixture::LlamaRopeFreqs`]: a 2-block `llama` with `rope_freqs.weight` (factors far
//!   from 1, and a low `rope.freq_base` so that every pair turns visibly within 16 positions).
//! - [`RopeFixture::Phi3`]: a 2-block `phi3` as Phi-3-mini-4k is converted: fused `attn_qkv`,
//!   fused gate-up `ffn_up` `[n_embd, 2·n_ff]`, `output.weight`, NEOX RoPE over 12 of 16 head
//!   dims, `attention.sliding_window = 4` (shorter than the sequence: llama.cpp 0.3.36 does not
//!   apply it) and `rope.scaling.original_context_length` equal to the context length.
//! - [`RopeFixture::Phi3LongRope`]: as Phi-4-mini is converted: the same shapes with tied
//!   embeddings, `rope_factors_long`/`rope_factors_short`, `rope.scaling.attn_factor` and an
//!   original context of 512 (llama.cpp picks the long factors for a context above it).
//!
//! Changing what a fixture contains must change its [`RopeFixture::file_name`].
use crate::Rng;
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, MetaValue};
use std::path::{Path, PathBuf};

/// Vocabulary size of every fixture (`<unk>`, `<s>`, `</s>`, then plain tokens).
pub const VOCAB: usize = 64;

/// Which model to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeFixture {
    /// `llama` with Llama 3.x-style RoPE frequency factors.
    LlamaRopeFreqs,
    /// `phi3` like Phi-3-mini-4k.
    Phi3,
    /// `phi3` with LongRoPE factors like Phi-4-mini.
    Phi3LongRope,
}

impl RopeFixture {
    /// Every fixture.
    pub const ALL: [RopeFixture; 3] = [
        RopeFixture::LlamaRopeFreqs,
        RopeFixture::Phi3,
        RopeFixture::Phi3LongRope,
    ];

    /// The file's name (with the generator's version).
    pub fn file_name(self) -> &'static str {
        match self {
            RopeFixture::LlamaRopeFreqs => "llama-rope-freqs.v1.gguf",
            RopeFixture::Phi3 => "phi3.v1.gguf",
            RopeFixture::Phi3LongRope => "phi3-longrope.v1.gguf",
        }
    }

    /// A short name (`llama-rope-freqs`, `phi3`, `phi3-longrope`).
    pub fn name(self) -> &'static str {
        match self {
            RopeFixture::LlamaRopeFreqs => "llama-rope-freqs",
            RopeFixture::Phi3 => "phi3",
            RopeFixture::Phi3LongRope => "phi3-longrope",
        }
    }
}

/// The llama fixture's frequency factors (one per rotated pair of its 8-wide heads).
pub const LLAMA_FACTORS: [f32; 4] = [1.0, 2.5, 0.4, 8.0];
/// The LongRoPE fixture's short factors (6 pairs: 12 rotated dims).
pub const PHI3_SHORT_FACTORS: [f32; 6] = [1.0, 1.5, 0.7, 3.0, 1.2, 5.0];
/// The LongRoPE fixture's long factors.
pub const PHI3_LONG_FACTORS: [f32; 6] = [2.0, 0.5, 4.0, 1.1, 6.0, 0.9];
/// The LongRoPE fixture's `rope.scaling.original_context_length`.
pub const PHI3_ORIGINAL_CONTEXT: usize = 512;

/// The fixture's builder, leaving out the tensors named in `skip` and setting the extra keys
/// `extra` (for negative tests and the "factors matter" check).
pub fn builder(kind: RopeFixture, skip: &[&str], extra: &[(&str, MetaValue)]) -> GgufBuilder {
    let phi3 = kind != RopeFixture::LlamaRopeFreqs;
    let a = if phi3 { "phi3" } else { "llama" };
    // phi3 in llama.cpp needs n_head · head_dim = n_embd (its attn_output is [n_embd, n_embd]).
    let (n_embd, n_head, n_head_kv, head, n_rot, n_ff) = if phi3 {
        (48, 3, 1, 16, 12, 64)
    } else {
        (32, 4, 2, 8, 8, 48)
    };
    let context = if phi3 { 4096 } else { 256 };
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    tokens.extend((3..VOCAB).map(|i| format!("t{i}")));
    let mut b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String(a.into()))
        .kv(format!("{a}.block_count"), u32v(2))
        .kv(format!("{a}.context_length"), u32v(context))
        .kv(format!("{a}.embedding_length"), u32v(n_embd))
        .kv(format!("{a}.feed_forward_length"), u32v(n_ff))
        .kv(format!("{a}.attention.head_count"), u32v(n_head))
        .kv(format!("{a}.attention.head_count_kv"), u32v(n_head_kv))
        .kv(format!("{a}.rope.dimension_count"), u32v(n_rot))
        .kv(format!("{a}.rope.freq_base"), MetaValue::F32(100.0))
        .kv(
            format!("{a}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        )
        .kv("tokenizer.ggml.model", MetaValue::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        )
        .kv(
            "tokenizer.ggml.scores",
            MetaValue::Array((0..VOCAB).map(|i| MetaValue::F32(-(i as f32))).collect()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                (0..VOCAB)
                    .map(|i| {
                        MetaValue::I32(match i {
                            0 => 2,
                            1 | 2 => 3,
                            _ => 1,
                        })
                    })
                    .collect(),
            ),
        )
        .kv("tokenizer.ggml.bos_token_id", u32v(1))
        .kv("tokenizer.ggml.eos_token_id", u32v(2))
        .kv("tokenizer.ggml.unknown_token_id", u32v(0));
    match kind {
        RopeFixture::LlamaRopeFreqs => {}
        RopeFixture::Phi3 => {
            b = b.kv(format!("{a}.attention.sliding_window"), u32v(4)).kv(
                format!("{a}.rope.scaling.original_context_length"),
                u32v(context),
            );
        }
        RopeFixture::Phi3LongRope => {
            b = b
                .kv(format!("{a}.attention.sliding_window"), u32v(0))
                .kv(
                    format!("{a}.rope.scaling.original_context_length"),
                    u32v(PHI3_ORIGINAL_CONTEXT),
                )
                .kv(format!("{a}.rope.scaling.attn_factor"), MetaValue::F32(1.2));
        }
    }
    for (k, v) in extra {
        b = b.kv(*k, v.clone());
    }
    let seed = match kind {
        RopeFixture::LlamaRopeFreqs => 0x10_0e,
        RopeFixture::Phi3 => 0x9403,
        RopeFixture::Phi3LongRope => 0x9104,
    };
    let mut rng = Rng::new(seed);
    let add = |b: GgufBuilder, name: String, dims: &[usize], values: Vec<f32>| {
        if skip.contains(&name.as_str()) {
            return b;
        }
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        b.tensor_f32(name, &dims, GgmlType::F32, &values)
            .expect("fixture tensor")
    };
    let mut rand = |dims: &[usize], scale: f32, offset: f32| -> Vec<f32> {
        let n: usize = dims.iter().product();
        rng.vec(n, scale).into_iter().map(|v| v + offset).collect()
    };
    let ws = |k: usize| 1.5 / (k as f32).sqrt();
    let (q_dim, kv_dim) = (n_head * head, n_head_kv * head);
    let d = n_embd;
    b = add(
        b,
        "token_embd.weight".into(),
        &[d, VOCAB],
        rand(&[d, VOCAB], 1.0, 0.0),
    );
    if kind == RopeFixture::LlamaRopeFreqs {
        b = add(
            b,
            "rope_freqs.weight".into(),
            &[n_rot / 2],
            LLAMA_FACTORS.to_vec(),
        );
    }
    if kind == RopeFixture::Phi3LongRope {
        b = add(
            b,
            "rope_factors_long.weight".into(),
            &[n_rot / 2],
            PHI3_LONG_FACTORS.to_vec(),
        );
        b = add(
            b,
            "rope_factors_short.weight".into(),
            &[n_rot / 2],
            PHI3_SHORT_FACTORS.to_vec(),
        );
    }
    for i in 0..2 {
        let t = |s: &str| format!("blk.{i}.{s}");
        b = add(b, t("attn_norm.weight"), &[d], rand(&[d], 0.2, 1.0));
        if phi3 {
            let n = q_dim + 2 * kv_dim;
            b = add(b, t("attn_qkv.weight"), &[d, n], rand(&[d, n], ws(d), 0.0));
        } else {
            b = add(
                b,
                t("attn_q.weight"),
                &[d, q_dim],
                rand(&[d, q_dim], ws(d), 0.0),
            );
            b = add(
                b,
                t("attn_k.weight"),
                &[d, kv_dim],
                rand(&[d, kv_dim], ws(d), 0.0),
            );
            b = add(
                b,
                t("attn_v.weight"),
                &[d, kv_dim],
                rand(&[d, kv_dim], ws(d), 0.0),
            );
        }
        b = add(
            b,
            t("attn_output.weight"),
            &[q_dim, d],
            rand(&[q_dim, d], ws(q_dim), 0.0),
        );
        b = add(b, t("ffn_norm.weight"), &[d], rand(&[d], 0.2, 1.0));
        if phi3 {
            b = add(
                b,
                t("ffn_up.weight"),
                &[d, 2 * n_ff],
                rand(&[d, 2 * n_ff], ws(d), 0.0),
            );
        } else {
            b = add(
                b,
                t("ffn_gate.weight"),
                &[d, n_ff],
                rand(&[d, n_ff], ws(d), 0.0),
            );
            b = add(
                b,
                t("ffn_up.weight"),
                &[d, n_ff],
                rand(&[d, n_ff], ws(d), 0.0),
            );
        }
        b = add(
            b,
            t("ffn_down.weight"),
            &[n_ff, d],
            rand(&[n_ff, d], ws(n_ff), 0.0),
        );
    }
    b = add(b, "output_norm.weight".into(), &[d], rand(&[d], 0.2, 1.0));
    if kind != RopeFixture::Phi3LongRope {
        b = add(
            b,
            "output.weight".into(),
            &[d, VOCAB],
            rand(&[d, VOCAB], ws(d), 0.0),
        );
    }
    b
}

/// Write fixture `kind` (atomically, through the builder) into `dir`; returns its path.
///
/// # Panics
/// If the file cannot be written.
pub fn write_fixture(kind: RopeFixture, dir: &Path) -> PathBuf {
    let path = dir.join(kind.file_name());
    builder(kind, &[], &[])
        .write(&path)
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}
