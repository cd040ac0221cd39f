//! Model hyper-parameters read from GGUF metadata (`{arch}.*` keys, as llama.cpp names them).
use crate::ExecError;
use ork_gguf::{GgufFile, MetaValue};

/// The model families ork-exec runs and how RoPE pairs values: the manifest's, one row per
/// architecture (`ork_manifest::SUPPORTED`).
pub use ork_manifest::{Arch, RopeStyle};

/// The architecture named by `general.architecture`.
///
/// # Errors
/// [`ExecError::UnsupportedArchitecture`] for one ork does not run.
pub fn arch_from_name(name: &str) -> Result<Arch, ExecError> {
    Arch::from_name(name).ok_or_else(|| ExecError::UnsupportedArchitecture {
        arch: name.to_owned(),
    })
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
    /// Feed-forward inner size (`feed_forward_length`; 0 when a MoE architecture's file has
    /// none).
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
    /// `rope.scaling.attn_factor` (1.0 when absent): multiplies every RoPE cos and sin, as
    /// llama.cpp's `attn_factor`.
    pub rope_attn_factor: f32,
    /// `rope.scaling.original_context_length` (default `context_length`): LongRoPE uses its
    /// long factors in sessions of a larger context.
    pub rope_original_context: usize,
    /// `rope.scaling.type` is `longrope` (llama reads LongRoPE factors instead of
    /// `rope_freqs` then, as llama.cpp).
    pub rope_longrope: bool,
    /// Context length the model was trained with.
    pub context_length: usize,
    /// Vocabulary size (number of rows of the embedding).
    pub vocab_size: usize,
    /// Mixture-of-Experts parameters; `None` for a dense feed-forward.
    pub moe: Option<MoeConfig>,
    /// Gemma 3's sliding-window layers, local RoPE base, attention scale and soft-cap
    /// (`Some` exactly for [`Arch::Gemma3`]).
    pub gemma3: Option<crate::Gemma3Config>,
}

/// Mixture-of-Experts hyper-parameters (`{arch}.expert_*` keys) and routing, as llama.cpp
/// computes it (docs/moe.md): softmax over all experts, the top `n_expert_used`, their weights
/// renormalized to sum 1 when [`MoeConfig::renormalize`], then scaled by
/// [`MoeConfig::weights_scale`].
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per block (`expert_count`).
    pub n_expert: usize,
    /// Experts used per token (`expert_used_count`), `1..=n_expert`.
    pub n_expert_used: usize,
    /// Inner size of one expert's FFN (`expert_feed_forward_length`; llama uses
    /// `feed_forward_length`).
    pub n_ff_exp: usize,
    /// Inner size of the shared expert (qwen2moe: `expert_shared_feed_forward_length`, else
    /// `feed_forward_length`); `None` without a shared expert.
    pub n_ff_shexp: Option<usize>,
    /// Renormalize the chosen experts' weights to sum 1. Fixed per architecture in llama.cpp, not
    /// read from the file: on for llama (Mixtral) and qwen3moe, off for qwen2moe.
    pub renormalize: bool,
    /// `expert_weights_scale` when present and non-zero: multiplies every routing weight.
    pub weights_scale: Option<f32>,
}

impl MoeConfig {
    /// Read the MoE keys of `arch` (prefix `p`). `None` for a dense model: a non-MoE
    /// architecture, or `llama` whose `expert_count` is absent or 0.
    fn from_gguf(gguf: &GgufFile, arch: Arch, n_ff: usize) -> Result<Option<MoeConfig>, ExecError> {
        let p = arch.name();
        let key = |suffix: &str| format!("{p}.{suffix}");
        let count_key = key("expert_count");
        let n_expert = match (arch, opt_usize(gguf, &count_key)?) {
            (Arch::Llama, None | Some(0)) => return Ok(None),
            (Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Gemma3, _) => return Ok(None),
            (_, None) => return Err(missing(&count_key)),
            (_, Some(0)) => return Err(invalid(&count_key, "a MoE model needs at least 1 expert")),
            (_, Some(n)) => n,
        };
        // Sizes per-token routing buffers; checked against the expert tensors' dims at load.
        const MAX_EXPERTS: usize = 1 << 16;
        if n_expert > MAX_EXPERTS {
            return Err(invalid(
                &count_key,
                &format!("{n_expert} experts exceed the cap {MAX_EXPERTS}"),
            ));
        }
        let used_key = key("expert_used_count");
        let n_expert_used = meta_usize(gguf, &used_key)?;
        if n_expert_used == 0 || n_expert_used > n_expert {
            return Err(invalid(
                &used_key,
                &format!("{n_expert_used} must be between 1 and expert_count {n_expert}"),
            ));
        }
        let ff_key = key("expert_feed_forward_length");
        let n_ff_exp = match arch {
            Arch::Llama => n_ff,
            Arch::Qwen2Moe => match opt_usize(gguf, &ff_key)? {
                Some(v) => v,
                None => n_ff / n_expert_used,
            },
            _ => meta_usize(gguf, &ff_key)?,
        };
        let width = |k: &str, v: usize| -> Result<usize, ExecError> {
            if v == 0 || v > MAX_WIDTH {
                Err(invalid(k, &format!("{v} is not in 1..={MAX_WIDTH}")))
            } else {
                Ok(v)
            }
        };
        let n_ff_exp = width(
            if arch == Arch::Llama {
                "feed_forward_length"
            } else {
                &ff_key
            },
            n_ff_exp,
        )?;
        let n_ff_shexp = if arch == Arch::Qwen2Moe {
            let k = key("expert_shared_feed_forward_length");
            Some(width(&k, opt_usize(gguf, &k)?.unwrap_or(n_ff))?)
        } else {
            None
        };
        let scale_key = key("expert_weights_scale");
        let weights_scale = match opt_f32(gguf, &scale_key)? {
            None => None,
            // As llama.cpp's hyper-parameter: 0 means "not set".
            Some(0.0) => None,
            Some(f) if f.is_finite() => Some(f),
            Some(_) => return Err(invalid(&scale_key, "not a finite number")),
        };
        let gating_key = key("expert_gating_func");
        match opt_usize(gguf, &gating_key)? {
            None | Some(1) => {}
            Some(other) => {
                return Err(invalid(
                    &gating_key,
                    &format!("gating function {other} is not supported (1 = softmax is)"),
                ))
            }
        }
        Ok(Some(MoeConfig {
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
            renormalize: arch != Arch::Qwen2Moe,
            weights_scale,
        }))
    }
}

/// Widths are capped like the pack format's dimensions.
const MAX_WIDTH: usize = 1 << 24;

impl ModelConfig {
    /// Read the configuration of the model in `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ModelConfig, ExecError> {
        let arch_name = meta_str(gguf, "general.architecture")?;
        let arch = arch_from_name(arch_name)?;
        let p = arch.name();
        let key = |suffix: &str| format!("{p}.{suffix}");
        let w = Widths::read(gguf, arch, &key)?;
        w.check(gguf, arch, &key)?;
        let (head_dim_k, head_dim_v, n_rot) = head_dims(gguf, &w, &key)?;
        let rms_eps = w.rms_eps;
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(invalid(
                &key("attention.layer_norm_rms_epsilon"),
                "not a finite non-negative number",
            ));
        }
        let rope = Rope::read(gguf, arch, &w, &key)?;
        let vocab_size = vocab_size(gguf, &key)?;
        let moe = MoeConfig::from_gguf(gguf, arch, w.n_ff)?;
        let mut config = ModelConfig {
            gemma3: None,
            moe,
            arch,
            n_layer: w.n_layer,
            n_embd: w.n_embd,
            n_ff: w.n_ff,
            n_head: w.n_head,
            n_head_kv: w.n_head_kv,
            head_dim_k,
            head_dim_v,
            n_rot,
            rms_eps,
            rope_base: rope.base,
            rope_freq_scale: rope.freq_scale,
            rope_attn_factor: rope.attn_factor,
            rope_original_context: rope.original_context,
            rope_longrope: rope.longrope,
            context_length: w.context_length,
            vocab_size,
        };
        if arch == Arch::Gemma3 {
            config.gemma3 = Some(crate::Gemma3Config::from_gguf(gguf, &config)?);
        }
        Ok(config)
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

/// The counts and widths of a model's metadata, its norm epsilon and rope base, as
/// [`ModelConfig::from_gguf`] reads them first (in this order, so that the first missing key
/// is the one reported).
struct Widths {
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    rms_eps: f32,
    rope_base: f32,
    context_length: usize,
}

impl Widths {
    fn read(
        gguf: &GgufFile,
        arch: Arch,
        key: &dyn Fn(&str) -> String,
    ) -> Result<Widths, ExecError> {
        let n_layer = meta_usize(gguf, &key("block_count"))?;
        let n_embd = meta_usize(gguf, &key("embedding_length"))?;
        // A MoE architecture may leave the dense width out (its experts have their own).
        let n_ff = if arch.is_moe() {
            opt_usize(gguf, &key("feed_forward_length"))?.unwrap_or(0)
        } else {
            meta_usize(gguf, &key("feed_forward_length"))?
        };
        let n_head = meta_usize(gguf, &key("attention.head_count"))?;
        Ok(Widths {
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv: opt_usize(gguf, &key("attention.head_count_kv"))?.unwrap_or(n_head),
            rms_eps: meta_f32(gguf, &key("attention.layer_norm_rms_epsilon"))?,
            rope_base: opt_f32(gguf, &key("rope.freq_base"))?.unwrap_or(10_000.0),
            context_length: meta_usize(gguf, &key("context_length"))?,
        })
    }

    /// Counts size allocations (per-layer weights and KV cache, activations): refuse absurd
    /// ones before anything is allocated. Every block has tensors of its own, so a file cannot
    /// describe more blocks than it has tensors; widths are capped like the pack format's
    /// dimensions.
    fn check(
        &self,
        gguf: &GgufFile,
        arch: Arch,
        key: &dyn Fn(&str) -> String,
    ) -> Result<(), ExecError> {
        let w = self;
        if w.n_ff == 0 && !arch.is_moe() {
            return Err(invalid(&key("feed_forward_length"), "must be positive"));
        }
        for (name, v) in [
            ("block_count", w.n_layer),
            ("embedding_length", w.n_embd),
            ("attention.head_count", w.n_head),
            ("attention.head_count_kv", w.n_head_kv),
            ("context_length", w.context_length),
        ] {
            if v == 0 {
                return Err(invalid(&key(name), "must be positive"));
            }
        }
        let n_tensors = gguf.tensors().len();
        if w.n_layer > n_tensors {
            return Err(invalid(
                &key("block_count"),
                &format!(
                    "{} blocks, but the file has only {n_tensors} tensors",
                    w.n_layer
                ),
            ));
        }
        for (name, v) in [
            ("embedding_length", w.n_embd),
            ("feed_forward_length", w.n_ff),
            ("attention.head_count", w.n_head),
            ("attention.head_count_kv", w.n_head_kv),
        ] {
            if v > MAX_WIDTH {
                return Err(invalid(
                    &key(name),
                    &format!("{v} exceeds the cap {MAX_WIDTH}"),
                ));
            }
        }
        if !w.n_head.is_multiple_of(w.n_head_kv) {
            return Err(invalid(
                &key("attention.head_count_kv"),
                &format!("{} does not divide head_count {}", w.n_head_kv, w.n_head),
            ));
        }
        Ok(())
    }
}

/// The key and value head sizes (default: `n_embd / n_head`) and the rotated dims (default:
/// the key head size), checked.
fn head_dims(
    gguf: &GgufFile,
    w: &Widths,
    key: &dyn Fn(&str) -> String,
) -> Result<(usize, usize, usize), ExecError> {
    let default_head = if w.n_embd.is_multiple_of(w.n_head) {
        Some(w.n_embd / w.n_head)
    } else {
        None
    };
    let head_dim = |suffix: &str| -> Result<usize, ExecError> {
        match opt_usize(gguf, &key(suffix))? {
            Some(v) => Ok(v),
            None => default_head.ok_or_else(|| {
                invalid(
                    &key("attention.head_count"),
                    "does not divide embedding_length",
                )
            }),
        }
    };
    let head_dim_k = head_dim("attention.key_length")?;
    let head_dim_v = head_dim("attention.value_length")?;
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
    if n_rot == 0 || n_rot > head_dim_k || n_rot % 2 != 0 {
        return Err(invalid(
            &key("rope.dimension_count"),
            &format!("{n_rot} must be even, positive and at most the head size {head_dim_k}"),
        ));
    }
    Ok((head_dim_k, head_dim_v, n_rot))
}

/// The rope's base and scaling, checked.
struct Rope {
    base: f32,
    freq_scale: f32,
    longrope: bool,
    attn_factor: f32,
    original_context: usize,
}

impl Rope {
    fn read(
        gguf: &GgufFile,
        arch: Arch,
        w: &Widths,
        key: &dyn Fn(&str) -> String,
    ) -> Result<Rope, ExecError> {
        let (base, context_length) = (w.rope_base, w.context_length);
        if !(base.is_finite() && base > 0.0) {
            return Err(invalid(
                &key("rope.freq_base"),
                "not a finite positive number",
            ));
        }
        let (freq_scale, longrope) = rope_scale(gguf, arch)?;
        let attn_key = key("rope.scaling.attn_factor");
        let attn_factor = match opt_f32(gguf, &attn_key)? {
            None => 1.0,
            Some(f) if f.is_finite() && f > 0.0 => f,
            Some(_) => return Err(invalid(&attn_key, "not a finite positive number")),
        };
        let orig_key = key("rope.scaling.original_context_length");
        let original_context = match opt_usize(gguf, &orig_key)? {
            None | Some(0) => context_length,
            Some(n) => n,
        };
        Ok(Rope {
            base,
            freq_scale,
            longrope,
            attn_factor,
            original_context,
        })
    }
}

/// The vocabulary size: the tokenizer's token count, or `{arch}.vocab_size` without one.
fn vocab_size(gguf: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<usize, ExecError> {
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
    Ok(vocab_size)
}

/// RoPE linear scaling, as llama.cpp reads it (`rope.scaling.type`, `rope.scaling.factor`,
/// legacy `rope.scale_linear`), and whether the type is `longrope` (which llama.cpp reads like
/// linear, its factors being tensors). Other schemes (`yarn`) change the rotation itself and are
/// refused rather than ignored.
fn rope_scale(gguf: &GgufFile, arch: Arch) -> Result<(f32, bool), ExecError> {
    let p = arch.name();
    let type_key = format!("{p}.rope.scaling.type");
    let mut longrope = false;
    if let Some(v) = gguf.metadata(&type_key) {
        let ty = v
            .as_str()
            .ok_or_else(|| invalid(&type_key, "not a string"))?;
        match ty {
            "none" => return Ok((1.0, false)),
            "linear" => {}
            "longrope" if matches!(arch, Arch::Llama | Arch::Phi3) => longrope = true,
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
        return Ok((1.0, longrope));
    };
    if f == 0.0 {
        // llama.cpp: a factor of 0 means "not set".
        Ok((1.0, longrope))
    } else if f.is_finite() && f > 0.0 {
        Ok((1.0 / f, longrope))
    } else {
        Err(invalid(&k, "not a finite positive number"))
    }
}

pub(crate) fn invalid(key: &str, what: &str) -> ExecError {
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

pub(crate) fn opt_f32(gguf: &GgufFile, key: &str) -> Result<Option<f32>, ExecError> {
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
            assert_eq!(arch_from_name(a.name()).unwrap(), a);
        }
        match arch_from_name("mamba") {
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
