//! Sparse GGUF fixtures: a llama-shaped model of any size whose tensor data is all zeros and
//! never written (a hole in the file), so a 30B model's shapes cost no disk. Only shapes matter
//! to `ork plan` and the board clock (`docs/board-model.md`).

use std::io::Write;
use std::path::Path;

use ork_gguf::writer::GgufBuilder;
use ork_gguf::MetaValue;

/// A llama-shaped model's dimensions (the board clock's [`ork_board::Dims`]).
pub use ork_board::Dims as LlamaShape;

const F32: u32 = 0;
const F16: u32 = 1;
const ALIGN: u64 = 32;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Write `shape` as a GGUF v3 `llama` model at `path`: f16 matmul weights (an untied
/// `output.weight`), f32 norms, a byte-level vocabulary of `shape.vocab` placeholder tokens with
/// no merges (so the model opens as `run` opens it: `plan` validates models exactly as `run`
/// does, tokenizer included); the data region is a hole. The header is written to a temporary file in the same directory, which is
/// then extended, synced and renamed over `path`.
pub fn write_sparse_llama(path: &Path, shape: &LlamaShape) -> std::io::Result<()> {
    let u = |v: usize| MetaValue::U32(v as u32);
    // The metadata, serialized by ork-gguf's writer; its last value is a string ending in a
    // non-zero byte, so the padding after it can be cut off exactly.
    let meta = GgufBuilder::new()
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
        .kv("tokenizer.ggml.eos_token_id", u(1))
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
    let mut tensors: Vec<(String, Vec<usize>, u32)> =
        vec![("token_embd.weight".into(), vec![d, shape.vocab], F16)];
    for i in 0..shape.n_layer {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        tensors.extend([
            (b("attn_norm"), vec![d], F32),
            (b("attn_q"), vec![d, q], F16),
            (b("attn_k"), vec![d, kv], F16),
            (b("attn_v"), vec![d, kv], F16),
            (b("attn_output"), vec![q, d], F16),
            (b("ffn_norm"), vec![d], F32),
            (b("ffn_gate"), vec![d, shape.ffn], F16),
            (b("ffn_up"), vec![d, shape.ffn], F16),
            (b("ffn_down"), vec![shape.ffn, d], F16),
        ]);
    }
    tensors.push(("output_norm.weight".into(), vec![d], F32));
    tensors.push(("output.weight".into(), vec![d, shape.vocab], F16));
    out[8..16].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
    let mut rel = 0u64;
    for (name, dims, ty) in &tensors {
        put_str(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for &x in dims {
            out.extend_from_slice(&(x as u64).to_le_bytes());
        }
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&rel.to_le_bytes());
        let elems: u64 = dims.iter().map(|&x| x as u64).product();
        let bytes = elems * if *ty == F32 { 4 } else { 2 };
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
