//! A model's RoPE with its frequency factors, read as llama.cpp 0.3.36 reads them
//! (docs/models.md, "RoPE frequency factors"):
//! - `rope_freqs.weight` (`llama`, unless `rope.scaling.type` is `longrope`): one factor per
//!   rotated pair, `n_rot / 2` values; Llama 3.1/3.2 store their long-context scaling this way.
//! - `rope_factors_long.weight` / `rope_factors_short.weight` (`phi3`; `llama` with
//!   `rope.scaling.type = longrope`): LongRoPE, the long set for sessions whose context exceeds
//!   `rope.scaling.original_context_length`, the short one otherwise (`get_rope_factors`).
//!
//! Each pair's frequency is divided by its factor (ggml's `ggml_rope_cache_init`: `theta / ff`),
//! and `rope.scaling.attn_factor` multiplies every cos and sin. A factor tensor the architecture
//! does not read (llama.cpp would refuse the file for an unused tensor), of the wrong length, or
//! with a factor that is not a finite positive number is refused, naming it.
use crate::config::{Arch, ModelConfig};
use crate::ops::Rope;
use crate::weights::dequantize_tensor;
use crate::ExecError;
use ork_gguf::GgufFile;
use ork_manifest::{tensor_name, Role};

/// The rope of the model configured by `c`, with the factors `gguf` carries.
pub(crate) fn load_rope(gguf: &GgufFile, c: &ModelConfig) -> Result<Rope, ExecError> {
    let mut rope = Rope::new(c.arch.rope_style(), c.n_rot, c.rope_base, c.rope_freq_scale)
        .with_attn_factor(c.rope_attn_factor);
    let name = |role: Role| tensor_name(role, 0).expect("roles in the table have names");
    let (freqs, long, short) = (
        name(Role::RopeFreqs),
        name(Role::RopeFactorsLong),
        name(Role::RopeFactorsShort),
    );
    let longrope = c.arch == Arch::Phi3 || (c.arch == Arch::Llama && c.rope_longrope);
    let reads_freqs = c.arch == Arch::Llama && !c.rope_longrope;
    for (tensor, read) in [(&freqs, reads_freqs), (&long, longrope), (&short, longrope)] {
        if !read && gguf.tensor(tensor).is_some() {
            return Err(ExecError::TensorData {
                tensor: tensor.clone(),
                what: format!(
                    "not read for architecture '{}'{} (llama.cpp would refuse the file for an \
                     unused tensor)",
                    c.arch.name(),
                    if c.arch == Arch::Llama {
                        " with this rope.scaling.type: rope_freqs without longrope, LongRoPE \
                         factors with it"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    if reads_freqs {
        if let Some(f) = factors(gguf, &freqs, c.n_rot)? {
            rope = rope.with_factors(&f);
        }
    }
    if longrope {
        if let Some(f) = factors(gguf, &short, c.n_rot)? {
            rope = rope.with_factors(&f);
        }
        let long = factors(gguf, &long, c.n_rot)?;
        rope = rope.with_long_factors(long.as_deref(), c.rope_original_context);
    }
    Ok(rope)
}

/// The factor tensor `name` if present: `n_rot / 2` finite positive values.
fn factors(gguf: &GgufFile, name: &str, n_rot: usize) -> Result<Option<Vec<f32>>, ExecError> {
    if gguf.tensor(name).is_none() {
        return Ok(None);
    }
    let f = dequantize_tensor(gguf, name, &[(n_rot / 2) as u64])?;
    if let Some((i, v)) = f
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        return Err(ExecError::TensorData {
            tensor: name.to_owned(),
            what: format!("factor {i} is {v}, not a finite positive number"),
        });
    }
    Ok(Some(f))
}
