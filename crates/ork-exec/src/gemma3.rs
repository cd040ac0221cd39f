//! Gemma 3 (`gemma3`): what it adds to the llama-family forward pass, as llama.cpp computes it
//! (`src/models/gemma3.cpp`, `src/llama-hparams.cpp`; docs/models.md, "gemma3"):
//!
//! - the embedding rows scaled by `√n_embd`;
//! - interleaved sliding-window (local) and global attention layers: a local layer's query at
//!   position `p` attends to the keys at `p - window + 1 ..= p` and rotates with its own RoPE
//!   base (`rope.freq_base_swa`, default 10 000) and no position scaling; a global layer attends
//!   to every earlier position with `rope.freq_base` and the file's linear scaling;
//! - per-head RMS norms of q and k (QK-norm, as qwen3) and the query scaled by
//!   `1/√key_length` (the 27B: `1/√(n_embd/n_head)`);
//! - RMS norms after attention and after the feed-forward, before each residual add;
//! - a GeLU-tanh gated feed-forward;
//! - optionally the final logits soft-capped: `c · tanh(x / c)`.
//!
//! Every RMS norm is `x · w`: the converter stores Gemma's `1 + w` already (convert_hf_to_gguf's
//! `Gemma3Model.norm_shift`).
use crate::config::{invalid, opt_f32, opt_usize, ModelConfig};
use crate::ops::{rms_norm, Rope};
use crate::ExecError;
use ork_gguf::{GgufFile, MetaValue};

/// Layer period of llama.cpp's Gemma 3 pattern when the file names none: every 6th layer is
/// global (`load_swa_pattern(ml, 6)`).
pub const DEFAULT_PATTERN: usize = 6;

/// Gemma 3's own hyper-parameters (`gemma3.*` keys beyond the common ones).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Keys a local layer's query sees, itself included (`attention.sliding_window`); `None`
    /// when the file has no window (every layer global, as llama.cpp).
    pub window: Option<usize>,
    /// Per layer: whether it is a local (sliding-window) layer.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (`rope.freq_base_swa`, default 10 000).
    pub rope_base_local: f32,
    /// The factor the query is multiplied by before `q·k` (llama.cpp's `f_attention_scale`).
    pub attn_scale: f32,
    /// `final_logit_softcapping` when present and non-zero.
    pub final_softcap: Option<f32>,
}

impl Gemma3Config {
    /// Read and check the keys of a `gemma3` file whose common configuration is `c`.
    ///
    /// # Errors
    /// [`ExecError::InvalidMetadata`] naming the key: a window of 0 or beyond `context_length`;
    /// a layer pattern (`attention.sliding_window_pattern`) that is a period of 0 or one not
    /// dividing `block_count`, or a per-layer array whose length is not `block_count`; a
    /// non-positive or non-finite RoPE base or soft-cap.
    pub(crate) fn from_gguf(gguf: &GgufFile, c: &ModelConfig) -> Result<Gemma3Config, ExecError> {
        let key = |s: &str| format!("gemma3.{s}");
        let window_key = key("attention.sliding_window");
        let window = match opt_usize(gguf, &window_key)? {
            None => None,
            Some(0) => {
                return Err(invalid(
                    &window_key,
                    "a sliding window of 0 keys leaves a local layer nothing to attend to",
                ))
            }
            Some(w) if w > c.context_length => {
                return Err(invalid(
                    &window_key,
                    &format!(
                        "a window of {w} exceeds the context length {}",
                        c.context_length
                    ),
                ))
            }
            Some(w) => Some(w),
        };
        let local = match window {
            None => vec![false; c.n_layer],
            Some(_) => pattern(gguf, &key("attention.sliding_window_pattern"), c.n_layer)?,
        };
        let base_key = key("rope.freq_base_swa");
        let rope_base_local = opt_f32(gguf, &base_key)?.unwrap_or(10_000.0);
        if !(rope_base_local.is_finite() && rope_base_local > 0.0) {
            return Err(invalid(&base_key, "not a finite positive number"));
        }
        let cap_key = key("final_logit_softcapping");
        let final_softcap = match opt_f32(gguf, &cap_key)? {
            None => None,
            Some(0.0) => None,
            Some(f) if f.is_finite() && f > 0.0 => Some(f),
            Some(_) => return Err(invalid(&cap_key, "not a finite positive number")),
        };
        // llama.cpp: the 27B (62 layers) scales by 1/√(n_embd/n_head), the others by
        // 1/√key_length (gemma_pytorch's query_pre_attn_scalar).
        let scalar = if c.n_layer == 62 {
            c.n_embd / c.n_head
        } else {
            c.head_dim_k
        };
        Ok(Gemma3Config {
            window,
            local,
            rope_base_local,
            attn_scale: 1.0 / (scalar as f32).sqrt(),
            final_softcap,
        })
    }
}

/// Which layers are local: `attention.sliding_window_pattern` as a per-layer array of booleans
/// (or integers), or as a period `n` (layer `i` local unless `i % n == n - 1`); without the key,
/// the period [`DEFAULT_PATTERN`].
fn pattern(gguf: &GgufFile, key: &str, n_layer: usize) -> Result<Vec<bool>, ExecError> {
    let period = match gguf.metadata(key) {
        None => DEFAULT_PATTERN,
        Some(MetaValue::Array(items)) => {
            if items.len() != n_layer {
                return Err(invalid(
                    key,
                    &format!(
                        "{} layer types for block_count {n_layer} layers",
                        items.len()
                    ),
                ));
            }
            return items
                .iter()
                .map(|v| match v {
                    MetaValue::Bool(b) => Ok(*b),
                    other => other
                        .as_u64()
                        .map(|x| x != 0)
                        .ok_or_else(|| invalid(key, "not an array of booleans")),
                })
                .collect();
        }
        // Checked when the file states it; llama.cpp's default period applies unchecked (the
        // 26 layers of Gemma 3 1B end with two local layers).
        Some(_) => opt_usize(gguf, key)?.unwrap_or(DEFAULT_PATTERN),
    };
    if gguf.metadata(key).is_some() && (period == 0 || !n_layer.is_multiple_of(period)) {
        return Err(invalid(
            key,
            &format!("a layer pattern of period {period} does not divide block_count {n_layer}"),
        ));
    }
    Ok((0..n_layer).map(|i| i % period < period - 1).collect())
}

/// What the forward pass does differently for a Gemma 3 model, built once at load.
#[derive(Clone, Debug)]
pub(crate) struct Gemma3 {
    /// `√n_embd`, multiplying every embedding row.
    pub(crate) embd_scale: f32,
    /// RoPE of the local layers.
    pub(crate) rope_local: Rope,
    /// The factor q is multiplied by on top of attention's own `1/√key_length`; `None` when
    /// that is the model's scale already.
    pub(crate) q_rescale: Option<f32>,
    /// Final logit soft-cap.
    pub(crate) final_softcap: Option<f32>,
}

impl Gemma3 {
    pub(crate) fn new(c: &ModelConfig, g: &Gemma3Config) -> Gemma3 {
        let own = 1.0 / (c.head_dim_k as f32).sqrt();
        Gemma3 {
            embd_scale: (c.n_embd as f32).sqrt(),
            rope_local: Rope::new(
                c.arch.rope_style(),
                c.n_rot,
                g.rope_base_local,
                // llama.cpp's rope_freq_scale_train_swa: local layers are never scaled.
                1.0,
            ),
            q_rescale: (g.attn_scale != own).then(|| g.attn_scale / own),
            final_softcap: g.final_softcap,
        }
    }

    /// Scale the embedding rows `x` by `√n_embd`.
    pub(crate) fn scale_embeddings(&self, x: &mut [f32]) {
        scale(x, self.embd_scale);
    }

    /// Scale the query rows when the model's attention scale is not `1/√key_length`.
    pub(crate) fn scale_queries(&self, q: &mut [f32]) {
        if let Some(s) = self.q_rescale {
            scale(q, s);
        }
    }

    /// Soft-cap logits: `c · tanh(x / c)`.
    pub(crate) fn cap_logits(&self, logits: &mut [f32]) {
        if let Some(c) = self.final_softcap {
            for l in logits {
                *l = c * (*l / c).tanh();
            }
        }
    }
}

/// A block's extra norms: applied to the attention output and to the feed-forward output before
/// each is added to the residual stream.
#[derive(Clone, Debug)]
pub(crate) struct PostNorms {
    pub(crate) attn: Vec<f32>,
    pub(crate) ffn: Vec<f32>,
}

/// RMS-norm `x` by `weight` when the block has such a norm (Gemma 3's post-norms).
pub(crate) fn post_norm(x: &mut [f32], weight: Option<&[f32]>, eps: f32) {
    if let Some(w) = weight {
        rms_norm(x, w, eps);
    }
}

fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}
