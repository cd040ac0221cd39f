//! Model hyper-parameters read from GGUF metadata (`{arch}.*` keys, as llama.cpp names them).
use crate::ExecError;
use ork_gguf::{GgufFile, MetaValue};

/// The model families ork-exec runs. All are pre-norm decoder-only transformers with RMSNorm,
/// RoPE, grouped-query attention and a SwiGLU feed-forward; they differ in small ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arch {
    /// `llama` (also SmolLM2, Mistral-style dense models converted as llama).
    Llama,
    /// `qwen2`: adds biases to the q/k/v projections.
    Qwen2,
    /// `qwen3`: no q/k/v biases; per-head RMSNorm of q and k before RoPE.
    Qwen3,
}

impl Arch {
    /// Parse `general.architecture`.
    pub fn from_name(name: &str) -> Result<Arch, ExecError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            other => Err(ExecError::UnsupportedArchitecture {
                arch: other.to_owned(),
            }),
        }
    }

    /// The GGUF key prefix / architecture string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// How this architecture pairs head values for RoPE, per llama.cpp's
    /// `llama_model_rope_type()` (src/llama-model.cpp): LLAMA is `LLAMA_ROPE_TYPE_NORM`
    /// (convert_hf_to_gguf.py permutes HF llama q/k rows so that consecutive pairs rotate),
    /// QWEN2 and QWEN3 are `LLAMA_ROPE_TYPE_NEOX`.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Interleaved,
            Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Neox,
        }
    }
}

/// Which head values RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// ggml "normal" rope: pairs `(2i, 2i+1)`.
    Interleaved,
    /// ggml NEOX rope: pairs `(i, i + n_rot/2)`.
    Neox,
}

/// Hyper-parameters of a supported model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Hidden size (`embedding_length`).
    pub n_embd: usize,
    /// Feed-forward inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention: `n_head % n_head_kv == 0`).
    pub n_head_kv: usize,
    /// Per-head size of q and k (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim_k: usize,
    /// Per-head size of v (`attention.value_length`, default `n_embd / n_head`).
    pub head_dim_v: usize,
    /// Leading dims of each q/k head that RoPE rotates (`rope.dimension_count`).
    pub n_rot: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RoPE position scale (1 / linear scaling factor; 1.0 without scaling).
    pub rope_freq_scale: f32,
    /// Context length the model was trained with.
    pub context_length: usize,
    /// Vocabulary size (number of rows of the embedding).
    pub vocab_size: usize,
}

impl ModelConfig {
    /// Read the configuration of the model in `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ModelConfig, ExecError> {
        let arch_name = meta_str(gguf, "general.architecture")?;
        let arch = Arch::from_name(arch_name)?;
        let p = arch.name();
        let key = |suffix: &str| format!("{p}.{suffix}");

        let n_layer = meta_usize(gguf, &key("block_count"))?;
        let n_embd = meta_usize(gguf, &key("embedding_length"))?;
        let n_ff = meta_usize(gguf, &key("feed_forward_length"))?;
        let n_head = meta_usize(gguf, &key("attention.head_count"))?;
        let n_head_kv = opt_usize(gguf, &key("attention.head_count_kv"))?.unwrap_or(n_head);
        let rms_eps = meta_f32(gguf, &key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = opt_f32(gguf, &key("rope.freq_base"))?.unwrap_or(10_000.0);
        let context_length = meta_usize(gguf, &key("context_length"))?;

        for (name, v) in [
            ("block_count", n_layer),
            ("embedding_length", n_embd),
            ("feed_forward_length", n_ff),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
            ("context_length", context_length),
        ] {
            if v == 0 {
                return Err(invalid(&key(name), "must be positive"));
            }
        }
        // Counts size allocations (per-layer weights and KV cache, activations): refuse absurd
        // ones before anything is allocated. Every block has tensors of its own, so a file
        // cannot describe more blocks than it has tensors; widths are capped like the pack
        // format's dimensions.
        let n_tensors = gguf.tensors().len();
        if n_layer > n_tensors {
            return Err(invalid(
                &key("block_count"),
                &format!("{n_layer} blocks, but the file has only {n_tensors} tensors"),
            ));
        }
        const MAX_WIDTH: usize = 1 << 24;
        for (name, v) in [
            ("embedding_length", n_embd),
            ("feed_forward_length", n_ff),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if v > MAX_WIDTH {
                return Err(invalid(
                    &key(name),
                    &format!("{v} exceeds the cap {MAX_WIDTH}"),
                ));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(invalid(
                &key("attention.head_count_kv"),
                &format!("{n_head_kv} does not divide head_count {n_head}"),
            ));
        }
        let default_head = if n_embd % n_head == 0 {
            Some(n_embd / n_head)
        } else {
            None
        };
        let head_dim_k = match opt_usize(gguf, &key("attention.key_length"))? {
            Some(v) => v,
            None => default_head.ok_or_else(|| {
                invalid(
                    &key("attention.head_count"),
                    "does not divide embedding_length",
                )
            })?,
        };
        let head_dim_v = match opt_usize(gguf, &key("attention.value_length"))? {
            Some(v) => v,
            None => default_head.ok_or_else(|| {
                invalid(
                    &key("attention.head_count"),
                    "does not divide embedding_length",
                )
            })?,
        };
        let n_rot = opt_usize(gguf, &key("rope.dimension_count"))?.unwrap_or(head_dim_k);
        if head_dim_k > MAX_WIDTH || head_dim_v > MAX_WIDTH {
            return Err(invalid(
                &key("attention.key_length"),
                &format!("head size exceeds the cap {MAX_WIDTH}"),
            ));
        }
        if head_dim_k == 0 || head_dim_v == 0 {
            return Err(invalid(
                &key("attention.key_length"),
                "head size must be positive",
            ));
        }
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(invalid(
                &key("rope.dimension_count"),
                &format!("{n_rot} must be even and at most the head size {head_dim_k}"),
            ));
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(invalid(
                &key("attention.layer_norm_rms_epsilon"),
                "not a finite non-negative number",
            ));
        }
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(invalid(
                &key("rope.freq_base"),
                "not a finite positive number",
            ));
        }
        let rope_freq_scale = rope_scale(gguf, p)?;

        let vocab_size = match gguf.metadata("tokenizer.ggml.tokens") {
            Some(v) => v
                .as_array()
                .ok_or_else(|| invalid("tokenizer.ggml.tokens", "not an array"))?
                .len(),
            None => meta_usize(gguf, &key("vocab_size"))?,
        };
        if vocab_size == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "empty vocabulary"));
        }

        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_rot,
            rms_eps,
            rope_base,
            rope_freq_scale,
            context_length,
            vocab_size,
        })
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of the concatenated key heads.
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Width of the concatenated value heads.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Width of the attention output before `attn_output` (all query heads' values).
    pub fn attn_out_dim(&self) -> usize {
        self.n_head * self.head_dim_v
    }
}

/// RoPE linear scaling, as llama.cpp reads it (`rope.scaling.type`, `rope.scaling.factor`,
/// legacy `rope.scale_linear`). Scaling schemes other than linear change the rotation itself and
/// are refused rather than ignored.
fn rope_scale(gguf: &GgufFile, p: &str) -> Result<f32, ExecError> {
    let type_key = format!("{p}.rope.scaling.type");
    if let Some(v) = gguf.metadata(&type_key) {
        let ty = v
            .as_str()
            .ok_or_else(|| invalid(&type_key, "not a string"))?;
        match ty {
            "none" => return Ok(1.0),
            "linear" => {}
            other => {
                return Err(invalid(
                    &type_key,
                    &format!("rope scaling '{other}' is not supported"),
                ))
            }
        }
    }
    let factor_key = format!("{p}.rope.scaling.factor");
    let legacy_key = format!("{p}.rope.scale_linear");
    let factor = match opt_f32(gguf, &factor_key)? {
        Some(f) => Some((factor_key, f)),
        None => opt_f32(gguf, &legacy_key)?.map(|f| (legacy_key, f)),
    };
    let Some((k, f)) = factor else {
        return Ok(1.0);
    };
    if f == 0.0 {
        // llama.cpp: a factor of 0 means "not set".
        Ok(1.0)
    } else if f.is_finite() && f > 0.0 {
        Ok(1.0 / f)
    } else {
        Err(invalid(&k, "not a finite positive number"))
    }
}

fn invalid(key: &str, what: &str) -> ExecError {
    ExecError::InvalidMetadata {
        key: key.to_owned(),
        what: what.to_owned(),
    }
}

fn missing(key: &str) -> ExecError {
    ExecError::MissingMetadata {
        key: key.to_owned(),
    }
}

/// A required string value.
pub(crate) fn meta_str<'g>(gguf: &'g GgufFile, key: &str) -> Result<&'g str, ExecError> {
    gguf.metadata(key)
        .ok_or_else(|| missing(key))?
        .as_str()
        .ok_or_else(|| invalid(key, "not a string"))
}

/// A required non-negative integer that fits in usize.
pub(crate) fn meta_usize(gguf: &GgufFile, key: &str) -> Result<usize, ExecError> {
    opt_usize(gguf, key)?.ok_or_else(|| missing(key))
}

/// An optional non-negative integer that fits in usize.
pub(crate) fn opt_usize(gguf: &GgufFile, key: &str) -> Result<Option<usize>, ExecError> {
    match gguf.metadata(key) {
        None => Ok(None),
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| invalid(key, "not a non-negative integer"))?;
            usize::try_from(n)
                .map(Some)
                .map_err(|_| invalid(key, "too large"))
        }
    }
}

fn meta_f32(gguf: &GgufFile, key: &str) -> Result<f32, ExecError> {
    opt_f32(gguf, key)?.ok_or_else(|| missing(key))
}

fn opt_f32(gguf: &GgufFile, key: &str) -> Result<Option<f32>, ExecError> {
    match gguf.metadata(key) {
        None => Ok(None),
        Some(v) => v
            .as_f32()
            .map(Some)
            .ok_or_else(|| invalid(key, "not a number")),
    }
}

/// An optional boolean.
pub(crate) fn opt_bool(gguf: &GgufFile, key: &str) -> Result<Option<bool>, ExecError> {
    match gguf.metadata(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(invalid(key, "not a boolean")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_round_trip_and_unknown_is_named() {
        for a in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
            assert_eq!(Arch::from_name(a.name()).unwrap(), a);
        }
        match Arch::from_name("mamba") {
            Err(ExecError::UnsupportedArchitecture { arch }) => assert_eq!(arch, "mamba"),
            other => panic!("expected UnsupportedArchitecture, got {other:?}"),
        }
    }

    #[test]
    fn rope_styles_follow_llama_cpp() {
        assert_eq!(Arch::Llama.rope_style(), RopeStyle::Interleaved);
        assert_eq!(Arch::Qwen2.rope_style(), RopeStyle::Neox);
        assert_eq!(Arch::Qwen3.rope_style(), RopeStyle::Neox);
    }
}
