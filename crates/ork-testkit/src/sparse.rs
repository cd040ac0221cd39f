//! Sparse GGUF fixtures: a llama-shaped model of any size whose tensor data is all zeros and
//! never written (a hole in the file), so a 30B model's shapes cost no disk. Only shapes matter
//! to `ork plan` and the board clock (`docs/board-model.md`).

use std::io::Write;
use std::path::Path;

use ork_gguf::writer::GgufBuilder;
use ork_gguf::MetaValue;

/// A llama-shaped model's dimensions (the board clock's [`ork_board::Dims`]).
pub use ork_board::Dims as LlamaShape;

/// A llama shape from its seven dimensions in [`LlamaShape`]'s order: blocks, width, FFN width,
/// heads, KV heads, head dimension, vocabulary.
pub const fn llama_shape(n: [usize; 7]) -> LlamaShape {
    LlamaShape {
        n_layer: n[0],
        d_model: n[1],
        ffn: n[2],
        n_head: n[3],
        n_head_kv: n[4],
        head_dim: n[5],
        vocab: n[6],
    }
}

const F32: u32 = 0;
const ALIGN: u64 = 32;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A GGUF weight type a sparse model's matmul weights may have: (ggml type id, weights per
/// block, bytes per block), ggml's block layouts.
pub type SparseType = (u32, usize, u64);

/// ggml's F16.
pub const SPARSE_F16: SparseType = (1, 1, 2);

/// The types by ggml name ork reads: F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K.
pub fn sparse_type(name: &str) -> Option<SparseType> {
    Some(match name {
        "F16" => SPARSE_F16,
        "Q4_0" => (2, 32, 18),
        "Q4_1" => (3, 32, 20),
        "Q5_0" => (6, 32, 22),
        "Q5_1" => (7, 32, 24),
        "Q8_0" => (8, 32, 34),
        "Q2_K" => (10, 256, 84),
        "Q3_K" => (11, 256, 110),
        "Q4_K" => (12, 256, 144),
        "Q5_K" => (13, 256, 176),
        "Q6_K" => (14, 256, 210),
        _ => return None,
    })
}

/// The type a weight of `k` columns takes: `ty` when `k` is a multiple of its block, else the
/// fallback llama.cpp's quantizer uses (`llama-quant.cpp` `tensor_type_fallback`: Q4_K → Q5_0,
/// Q5_K → Q5_1, Q6_K → Q8_0; Q2_K and Q3_K → IQ4_NL there. ork's CPU engine and the board
/// clock read IQ4_NL, but its GGUF decoder, which the NPU's `.orkpack` conversion uses, does
/// not (`GgmlType::is_decodable`): Q4_0 here, the same 18-byte block of 32 weights).
fn fitting(ty: SparseType, k: usize) -> SparseType {
    if k.is_multiple_of(ty.1) {
        return ty;
    }
    match ty.0 {
        12 => (6, 32, 22),
        13 => (7, 32, 24),
        14 => (8, 32, 34),
        _ => (2, 32, 18),
    }
}

/// Write `shape` as a GGUF v3 `llama` model at `path`: f16 matmul weights (an untied
/// `output.weight`), f32 norms: [`write_sparse_typed`] with F16 throughout.
pub fn write_sparse_llama(path: &Path, shape: &LlamaShape) -> std::io::Result<()> {
    write_sparse_typed(path, shape, SPARSE_F16, Some(SPARSE_F16), (0, 0))
}

/// Write `shape` as a GGUF v3 `llama` model at `path`: block matmul weights of `ty` (a weight
/// whose width is not a multiple of `ty`'s block takes llama.cpp's fallback type), the output of
/// `output` (`None`: tied to the token embedding), f32 norms; with `experts` = (E, K), E > 0, a
/// `llama` mixture of experts (E experts of FFN width `shape.ffn` per block, K per token, an f32
/// router) instead of the dense FFN, a byte-level vocabulary of `shape.vocab` placeholder tokens with
/// no merges (so the model opens as `run` opens it: `plan` validates models exactly as `run`
/// does, tokenizer included); the data region is a hole. The header is written to a temporary file in the same directory, which is
/// then extended, synced and renamed over `path`.
pub fn write_sparse_typed(
    path: &Path,
    shape: &LlamaShape,
    ty: SparseType,
    output: Option<SparseType>,
    experts: (usize, usize),
) -> std::io::Result<()> {
    let u = |v: usize| MetaValue::U32(v as u32);
    // The metadata, serialized by ork-gguf's writer; its last value is a string ending in a
    // non-zero byte, so the padding after it can be cut off exactly.
    let mut meta = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("llama.block_count", u(shape.n_layer))
        .kv("llama.context_length", u(4096))
        .kv("llama.embedding_length", u(shape.d_model))
        .kv("llama.feed_forward_length", u(shape.ffn))
        .kv("llama.attention.head_count", u(shape.n_head))
        .kv("llama.attention.head_count_kv", u(shape.n_head_kv))
        .kv("llama.attention.key_length", u(shape.head_dim))
        .kv("llama.attention.value_length", u(shape.head_dim))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-6),
        )
        .kv("llama.rope.freq_base", MetaValue::F32(10000.0))
        .kv("llama.vocab_size", u(shape.vocab))
        .kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", MetaValue::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..shape.vocab)
                    .map(|i| MetaValue::String(format!("t{i}")))
                    .collect(),
            ),
        )
        .kv("tokenizer.ggml.merges", MetaValue::Array(Vec::new()))
        .kv("tokenizer.ggml.bos_token_id", u(0))
        .kv("tokenizer.ggml.eos_token_id", u(1));
    if experts.0 > 0 {
        meta = meta
            .kv("llama.expert_count", u(experts.0))
            .kv("llama.expert_used_count", u(experts.1));
    }
    let meta = meta
        .kv("general.name", MetaValue::String("sparse fixture".into()))
        .to_bytes()
        .map_err(std::io::Error::other)?;
    let end = meta.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut out = meta[..end].to_vec();

    let (d, q, kv) = (
        shape.d_model,
        shape.n_head * shape.head_dim,
        shape.n_head_kv * shape.head_dim,
    );
    // The token embedding takes the file's type, as llama.cpp's quantizer gives it.
    let mut tensors: Vec<(String, Vec<usize>, SparseType)> = vec![(
        "token_embd.weight".into(),
        vec![d, shape.vocab],
        fitting(ty, d),
    )];
    let t = |k: usize| fitting(ty, k);
    let norm: SparseType = (F32, 1, 4);
    for i in 0..shape.n_layer {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        tensors.extend([
            (b("attn_norm"), vec![d], norm),
            (b("attn_q"), vec![d, q], t(d)),
            (b("attn_k"), vec![d, kv], t(d)),
            (b("attn_v"), vec![d, kv], t(d)),
            (b("attn_output"), vec![q, d], t(q)),
            (b("ffn_norm"), vec![d], norm),
        ]);
        if experts.0 > 0 {
            let e = experts.0;
            tensors.extend([
                (b("ffn_gate_inp"), vec![d, e], norm),
                (b("ffn_gate_exps"), vec![d, shape.ffn, e], t(d)),
                (b("ffn_up_exps"), vec![d, shape.ffn, e], t(d)),
                (b("ffn_down_exps"), vec![shape.ffn, d, e], t(shape.ffn)),
            ]);
        } else {
            tensors.extend([
                (b("ffn_gate"), vec![d, shape.ffn], t(d)),
                (b("ffn_up"), vec![d, shape.ffn], t(d)),
                (b("ffn_down"), vec![shape.ffn, d], t(shape.ffn)),
            ]);
        }
    }
    tensors.push(("output_norm.weight".into(), vec![d], norm));
    if let Some(o) = output {
        tensors.push(("output.weight".into(), vec![d, shape.vocab], fitting(o, d)));
    }
    out[8..16].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
    let mut rel = 0u64;
    for (name, dims, ty) in &tensors {
        put_str(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for &x in dims {
            out.extend_from_slice(&(x as u64).to_le_bytes());
        }
        out.extend_from_slice(&ty.0.to_le_bytes());
        out.extend_from_slice(&rel.to_le_bytes());
        let rows: u64 = dims[1..].iter().map(|&x| x as u64).product();
        let bytes = rows * dims[0].div_ceil(ty.1) as u64 * ty.2;
        rel = (rel + bytes).next_multiple_of(ALIGN);
    }
    out.resize((out.len() as u64).next_multiple_of(ALIGN) as usize, 0);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(&out)?;
    tmp.as_file().set_len(out.len() as u64 + rel)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}
