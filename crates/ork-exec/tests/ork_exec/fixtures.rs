//! Tiny random-weight GGUF models built in memory with `ork_gguf::writer`.
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile, MetaValue};

/// Shape of a fixture model.
#[derive(Clone, Debug)]
pub struct TinySpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// `attention.key_length` / `value_length` when set (otherwise n_embd / n_head).
    pub head_dim: Option<usize>,
    pub vocab: usize,
    pub context: usize,
    /// No `output.weight`: the embedding is the output projection.
    pub tied: bool,
    /// Store the embedding as Q8_0 (like SmolLM2) instead of F32.
    pub embd_q8: bool,
    pub seed: u64,
    /// Experts per block (0: a dense FFN).
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// Expert FFN width.
    pub n_ff_exp: usize,
    /// Shared expert width (qwen2moe).
    pub n_ff_shexp: usize,
}

impl TinySpec {
    pub fn new(arch: &'static str) -> TinySpec {
        TinySpec {
            arch,
            n_layer: 2,
            n_embd: 32,
            n_ff: 48,
            n_head: 4,
            n_head_kv: 2,
            head_dim: if arch.starts_with("qwen3") || arch == "gemma3" {
                Some(16)
            } else {
                None
            },
            vocab: 40,
            context: 32,
            tied: false,
            embd_q8: false,
            seed: 0x5eed ^ arch.len() as u64,
            n_expert: if arch.ends_with("moe") { 4 } else { 0 },
            n_expert_used: 2,
            n_ff_exp: 16,
            n_ff_shexp: 24,
        }
    }

    /// A llama-arch MoE (Mixtral layout): 4 experts, top-2.
    pub fn mixtral() -> TinySpec {
        TinySpec {
            n_expert: 4,
            seed: 0x313,
            ..TinySpec::new("llama")
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head)
    }
}

/// The shared SplitMix64 fixture generator (its `f32` is the uniform [-1, 1) this file used).
pub use ork_testkit::Rng;

/// The fixture's GGUF builder, leaving out the tensor named `skip` (for negative tests).
pub fn builder(spec: &TinySpec, skip: Option<&str>) -> GgufBuilder {
    let a = spec.arch;
    let hd = spec.head_dim();
    let (q_dim, kv_dim) = (spec.n_head * hd, spec.n_head_kv * hd);
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let mut b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String(a.into()))
        .kv(format!("{a}.block_count"), u32v(spec.n_layer))
        .kv(format!("{a}.context_length"), u32v(spec.context))
        .kv(format!("{a}.embedding_length"), u32v(spec.n_embd))
        .kv(format!("{a}.feed_forward_length"), u32v(spec.n_ff))
        .kv(format!("{a}.attention.head_count"), u32v(spec.n_head))
        .kv(format!("{a}.attention.head_count_kv"), u32v(spec.n_head_kv))
        .kv(format!("{a}.rope.freq_base"), MetaValue::F32(10_000.0))
        .kv(
            format!("{a}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        )
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..spec.vocab)
                    .map(|i| MetaValue::String(format!("t{i}")))
                    .collect(),
            ),
        );
    if spec.n_expert > 0 {
        b = b
            .kv(format!("{a}.expert_count"), u32v(spec.n_expert))
            .kv(format!("{a}.expert_used_count"), u32v(spec.n_expert_used));
        if a != "llama" {
            b = b.kv(
                format!("{a}.expert_feed_forward_length"),
                u32v(spec.n_ff_exp),
            );
        }
        if a == "qwen2moe" {
            b = b.kv(
                format!("{a}.expert_shared_feed_forward_length"),
                u32v(spec.n_ff_shexp),
            );
        }
    }
    if let Some(h) = spec.head_dim {
        b = b
            .kv(format!("{a}.attention.key_length"), u32v(h))
            .kv(format!("{a}.attention.value_length"), u32v(h));
    }
    let mut rng = Rng::new(spec.seed);
    let mut add =
        |b: GgufBuilder, name: String, dims: &[usize], scale: f32, offset: f32, ty: GgmlType| {
            let n: usize = dims.iter().product();
            let values: Vec<f32> = rng.vec(n, scale).into_iter().map(|v| v + offset).collect();
            if skip == Some(name.as_str()) {
                return b;
            }
            let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
            b.tensor_f32(name, &dims, ty, &values)
                .expect("fixture tensor")
        };
    let f32t = GgmlType::F32;
    let (d, ff) = (spec.n_embd, spec.n_ff);
    let embd_ty = if spec.embd_q8 { GgmlType::Q8_0 } else { f32t };
    b = add(
        b,
        "token_embd.weight".into(),
        &[d, spec.vocab],
        1.0,
        0.0,
        embd_ty,
    );
    let ws = |k: usize| 1.5 / (k as f32).sqrt();
    for i in 0..spec.n_layer {
        let t = |s: &str| format!("blk.{i}.{s}");
        b = add(b, t("attn_norm.weight"), &[d], 0.2, 1.0, f32t);
        b = add(b, t("attn_q.weight"), &[d, q_dim], ws(d), 0.0, f32t);
        b = add(b, t("attn_k.weight"), &[d, kv_dim], ws(d), 0.0, f32t);
        b = add(b, t("attn_v.weight"), &[d, kv_dim], ws(d), 0.0, f32t);
        if a == "qwen2" || a == "qwen2moe" {
            b = add(b, t("attn_q.bias"), &[q_dim], 0.3, 0.0, f32t);
            b = add(b, t("attn_k.bias"), &[kv_dim], 0.3, 0.0, f32t);
            b = add(b, t("attn_v.bias"), &[kv_dim], 0.3, 0.0, f32t);
        }
        if a == "qwen3" || a == "qwen3moe" || a == "gemma3" {
            b = add(b, t("attn_q_norm.weight"), &[hd], 0.2, 1.0, f32t);
            b = add(b, t("attn_k_norm.weight"), &[hd], 0.2, 1.0, f32t);
        }
        b = add(
            b,
            t("attn_output.weight"),
            &[q_dim, d],
            ws(q_dim),
            0.0,
            f32t,
        );
        if a == "gemma3" {
            b = add(b, t("post_attention_norm.weight"), &[d], 0.2, 1.0, f32t);
            b = add(b, t("post_ffw_norm.weight"), &[d], 0.2, 1.0, f32t);
        }
        b = add(b, t("ffn_norm.weight"), &[d], 0.2, 1.0, f32t);
        if spec.n_expert == 0 {
            b = add(b, t("ffn_gate.weight"), &[d, ff], ws(d), 0.0, f32t);
            b = add(b, t("ffn_up.weight"), &[d, ff], ws(d), 0.0, f32t);
            b = add(b, t("ffn_down.weight"), &[ff, d], ws(ff), 0.0, f32t);
            continue;
        }
        let (e, fe) = (spec.n_expert, if a == "llama" { ff } else { spec.n_ff_exp });
        b = add(b, t("ffn_gate_inp.weight"), &[d, e], 1.0, 0.0, f32t);
        if a == "qwen2moe" {
            let sf = spec.n_ff_shexp;
            b = add(b, t("ffn_gate_inp_shexp.weight"), &[d], 0.5, 0.0, f32t);
            b = add(b, t("ffn_gate_shexp.weight"), &[d, sf], ws(d), 0.0, f32t);
            b = add(b, t("ffn_up_shexp.weight"), &[d, sf], ws(d), 0.0, f32t);
            b = add(b, t("ffn_down_shexp.weight"), &[sf, d], ws(sf), 0.0, f32t);
        }
        b = add(b, t("ffn_gate_exps.weight"), &[d, fe, e], ws(d), 0.0, f32t);
        b = add(b, t("ffn_up_exps.weight"), &[d, fe, e], ws(d), 0.0, f32t);
        b = add(b, t("ffn_down_exps.weight"), &[fe, d, e], ws(fe), 0.0, f32t);
    }
    b = add(b, "output_norm.weight".into(), &[d], 0.2, 1.0, f32t);
    if !spec.tied {
        b = add(
            b,
            "output.weight".into(),
            &[d, spec.vocab],
            ws(d),
            0.0,
            f32t,
        );
    }
    b
}

/// The fixture as an open GGUF.
pub fn build(spec: &TinySpec) -> std::sync::Arc<GgufFile> {
    from_builder(builder(spec, None))
}

pub fn from_builder(b: GgufBuilder) -> std::sync::Arc<GgufFile> {
    std::sync::Arc::new(
        GgufFile::from_bytes("fixture.gguf", b.to_bytes().expect("fixture bytes"))
            .expect("fixture parses"),
    )
}
