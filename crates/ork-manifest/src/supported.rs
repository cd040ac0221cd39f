//! What each supported architecture understands: the tensors and the computation-changing
//! metadata keys ork implements, one table per architecture (in the spirit of llama.cpp's
//! `LLM_TENSOR_NAMES` / `LLM_KV_NAMES`, `src/llama-arch.cpp`). [`check_understood`] refuses a
//! file carrying anything else, so that nothing a model needs is ever skipped quietly
//! (docs/models.md, "What ork refuses and why").
//!
//! The rule:
//! - every tensor must have a role listed for the file's architecture in [`SUPPORTED`];
//! - every key in the architecture's namespace (`{arch}.…`, the keys llama.cpp reads to build
//!   the computation) must be listed there; the *values* of listed keys are checked by the
//!   executor's configuration (`ork-exec`'s `ModelConfig`, e.g. `rope.scaling.type` other than
//!   `none`/`linear` is refused there);
//! - keys of other namespaces (`general.*`, `tokenizer.*`, `quantize.*`, …) do not change the
//!   model's arithmetic and are allowed (the tokenizer checks its own keys).
//!
//! A file whose `general.architecture` is not in [`SUPPORTED`] is left to the executor, which
//! refuses the architecture itself.

use ork_gguf::GgufFile;

use crate::{classify, ManifestError, Role};

/// The model families ork runs, by identity; everything else about each (its name, roles,
/// tensors, keys, RoPE style) is its row of [`SUPPORTED`]. All are pre-norm decoder-only
/// transformers with RMSNorm, RoPE, grouped-query attention and a gated feed-forward.
// Not `#[non_exhaustive]`: the executor matches on it exhaustively, so a new row cannot be
// added without the executor saying how it computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `llama` (also SmolLM2, Mistral-style dense models converted as llama).
    Llama,
    /// `qwen2`: adds biases to the q/k/v projections.
    Qwen2,
    /// `qwen3`: no q/k/v biases; per-head RMSNorm of q and k before RoPE.
    Qwen3,
    /// `qwen2moe`: qwen2's attention; a Mixture-of-Experts feed-forward with a shared expert
    /// behind a sigmoid gate; routing weights not renormalized (docs/moe.md).
    Qwen2Moe,
    /// `qwen3moe`: qwen3's attention; a Mixture-of-Experts feed-forward, no shared expert;
    /// routing weights renormalized.
    Qwen3Moe,
    /// `phi3` (Phi-3, Phi-4-mini): llama's computation with NEOX RoPE, a fused q/k/v
    /// projection and a fused gate-up (`ffn_up`, gate rows first), LongRoPE factors
    /// (docs/models.md, "phi3").
    Phi3,
    /// `gemma3`: QK-norm, post-attention and post-FFN norms, GeLU-tanh gating, the √d
    /// embedding scale, interleaved sliding-window and global layers.
    Gemma3,
}

impl Arch {
    /// The architecture named `name` (`general.architecture`), if ork runs it.
    pub fn from_name(name: &str) -> Option<Arch> {
        support(name).map(|s| s.id)
    }

    /// Its row of [`SUPPORTED`].
    pub fn row(self) -> &'static ArchSupport {
        SUPPORTED
            .iter()
            .find(|s| s.id == self)
            .expect("every Arch has a row of SUPPORTED (tested)")
    }

    /// The GGUF key prefix / architecture string.
    pub fn name(self) -> &'static str {
        self.row().arch
    }

    /// How this architecture pairs head values for RoPE.
    pub fn rope_style(self) -> RopeStyle {
        self.row().rope
    }

    /// Whether every block's feed-forward is a Mixture of Experts (`llama` is one when its
    /// `expert_count` is positive, as in llama.cpp).
    pub fn is_moe(self) -> bool {
        self.row().moe
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

/// One architecture: the one row every list of architectures is built from
/// ([`SUPPORTED`], [`crate::ARCHITECTURES`], [`Arch`]).
#[derive(Clone, Copy, Debug)]
pub struct ArchSupport {
    /// Its identity.
    pub id: Arch,
    /// `general.architecture`.
    pub arch: &'static str,
    /// The matmul roles its blocks may have ([`crate::ARCHITECTURES`]).
    pub matmul: &'static [Role],
    /// How it pairs head values for RoPE, per llama.cpp's `llama_model_rope_type()`
    /// (src/llama-model.cpp): LLAMA is `LLAMA_ROPE_TYPE_NORM` (convert_hf_to_gguf.py permutes HF
    /// llama q/k rows so that consecutive pairs rotate); the others are `LLAMA_ROPE_TYPE_NEOX`.
    pub rope: RopeStyle,
    /// Whether every block's feed-forward is a Mixture of Experts.
    pub moe: bool,
    /// Every tensor role a file of this architecture may carry (each role's GGUF name is in
    /// [`crate::TENSOR_NAMES`]).
    pub tensors: &'static [Role],
    /// Every key of the architecture's namespace it reads, without the `{arch}.` prefix.
    pub keys: &'static [&'static str],
}

/// Tensors every supported architecture has.
const COMMON_TENSORS: [Role; 9] = [
    Role::TokenEmbd,
    Role::Output,
    Role::OutputNorm,
    Role::AttnNorm,
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::FfnNorm,
];

const DENSE_FFN: [Role; 3] = [Role::FfnGate, Role::FfnUp, Role::FfnDown];
/// LongRoPE's two factor sets (phi3; llama when `rope.scaling.type` is `longrope`).
const LONGROPE: [Role; 2] = [Role::RopeFactorsLong, Role::RopeFactorsShort];
const QKV_BIAS: [Role; 3] = [Role::AttnQBias, Role::AttnKBias, Role::AttnVBias];
const QK_NORM: [Role; 2] = [Role::AttnQNorm, Role::AttnKNorm];
const EXPERTS: [Role; 4] = [
    Role::Router,
    Role::ExpertGate,
    Role::ExpertUp,
    Role::ExpertDown,
];
const SHARED_EXPERT: [Role; 4] = [
    Role::SharedExpertGateInp,
    Role::SharedExpertGate,
    Role::SharedExpertUp,
    Role::SharedExpertDown,
];

/// `common` followed by the groups `extra`, as one array of `N` items (`fill` only seeds the
/// array; every slot is written, and a wrong `N` fails to compile).
const fn concat<T: Copy, const N: usize>(common: &[T], extra: &[&[T]], fill: T) -> [T; N] {
    let mut out = [fill; N];
    let mut n = 0;
    while n < common.len() {
        out[n] = common[n];
        n += 1;
    }
    let mut g = 0;
    while g < extra.len() {
        let mut i = 0;
        while i < extra[g].len() {
            out[n] = extra[g][i];
            n += 1;
            i += 1;
        }
        g += 1;
    }
    assert!(n == N, "item count");
    out
}

/// `COMMON_TENSORS` followed by the groups `extra`, as one array of `N` roles.
const fn roles<const N: usize>(extra: &[&[Role]]) -> [Role; N] {
    concat(&COMMON_TENSORS, extra, Role::TokenEmbd)
}

/// Keys every supported architecture reads (`ork-exec`'s `ModelConfig::from_gguf`).
const COMMON_KEYS: [&str; 17] = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    // Linear scaling (and llama's `longrope` type, which only selects the factor tensors);
    // other types (`yarn`) are refused by the configuration, naming the key.
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    // Multiplies every rotated value's cos and sin, as llama.cpp's `attn_factor`
    // (docs/models.md, "RoPE frequency factors").
    "rope.scaling.attn_factor",
    // Chooses LongRoPE's long or short factors; changes nothing else ork implements (YaRN,
    // which also reads it, is refused).
    "rope.scaling.original_context_length",
];

/// The MoE keys (`MoeConfig::from_gguf`).
const MOE_KEYS: [&str; 4] = [
    "expert_count",
    "expert_used_count",
    "expert_weights_scale",
    "expert_gating_func",
];

/// `COMMON_KEYS` followed by the groups `extra`, as one array of `N` keys.
const fn keys<const N: usize>(extra: &[&[&'static str]]) -> [&'static str; N] {
    concat(&COMMON_KEYS, extra, "")
}

/// llama: optional q/k/v biases (as llama.cpp), dense or Mixtral-style experts (no shared
/// expert; `feed_forward_length` is the experts' width), Llama 3.x RoPE frequency factors, or
/// LongRoPE factors with `rope.scaling.type = longrope`.
const LLAMA_TENSORS: [Role; 22] = roles(&[
    &QKV_BIAS,
    &DENSE_FFN,
    &EXPERTS,
    &[Role::RopeFreqs],
    &LONGROPE,
]);
const LLAMA_KEYS: [&str; 21] = keys(&[&MOE_KEYS]);
/// phi3 (Phi-3, Phi-4-mini): fused q/k/v (or separate ones), `ffn_up` holding gate and up (no
/// `ffn_gate`), LongRoPE factors. `attention.sliding_window` is read and not applied, as
/// llama.cpp 0.3.36 does (docs/models.md, "phi3").
const PHI3_TENSORS: [Role; 14] = roles(&[&[Role::AttnQkv, Role::FfnUp, Role::FfnDown], &LONGROPE]);
const PHI3_KEYS: [&str; 18] = keys(&[&["attention.sliding_window"]]);
const QWEN2_TENSORS: [Role; 15] = roles(&[&QKV_BIAS, &DENSE_FFN]);
const QWEN3_TENSORS: [Role; 14] = roles(&[&QK_NORM, &DENSE_FFN]);
const QWEN2MOE_TENSORS: [Role; 20] = roles(&[&QKV_BIAS, &EXPERTS, &SHARED_EXPERT]);
const QWEN2MOE_KEYS: [&str; 23] = keys(&[
    &MOE_KEYS,
    &[
        "expert_feed_forward_length",
        "expert_shared_feed_forward_length",
    ],
]);
/// gemma3 (llama.cpp's `llama_model_gemma3::load_arch_tensors`): QK-norm, the post-attention
/// and post-FFN norms, a dense gated FFN; `output.weight` optional (tied to the embedding).
const GEMMA3_TENSORS: [Role; 16] = roles(&[
    &QK_NORM,
    &DENSE_FFN,
    &[Role::AttnPostNorm, Role::FfnPostNorm],
]);
/// gemma3's own keys (`llama_model_gemma3::load_arch_hparams`): the sliding window, the layer
/// pattern, the local layers' RoPE base and the final logit soft-cap.
const GEMMA3_KEYS: [&str; 21] = keys(&[&[
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    "final_logit_softcapping",
]]);
const QWEN3MOE_TENSORS: [Role; 15] = roles(&[&QK_NORM, &EXPERTS]);
const QWEN3MOE_KEYS: [&str; 22] = keys(&[&MOE_KEYS, &["expert_feed_forward_length"]]);

/// The per-architecture tables: what ork implements for each `general.architecture` it runs.
pub const SUPPORTED: &[ArchSupport] = &[
    ArchSupport {
        id: Arch::Llama,
        arch: "llama",
        matmul: crate::LLAMA_MATMUL,
        rope: RopeStyle::Interleaved,
        moe: false,
        tensors: &LLAMA_TENSORS,
        keys: &LLAMA_KEYS,
    },
    ArchSupport {
        id: Arch::Qwen2,
        arch: "qwen2",
        matmul: &crate::DENSE,
        rope: RopeStyle::Neox,
        moe: false,
        tensors: &QWEN2_TENSORS,
        keys: &COMMON_KEYS,
    },
    ArchSupport {
        id: Arch::Qwen3,
        arch: "qwen3",
        matmul: &crate::DENSE,
        rope: RopeStyle::Neox,
        moe: false,
        tensors: &QWEN3_TENSORS,
        keys: &COMMON_KEYS,
    },
    ArchSupport {
        id: Arch::Phi3,
        arch: "phi3",
        matmul: crate::PHI3_MATMUL,
        rope: RopeStyle::Neox,
        moe: false,
        tensors: &PHI3_TENSORS,
        keys: &PHI3_KEYS,
    },
    ArchSupport {
        id: Arch::Gemma3,
        arch: "gemma3",
        matmul: &crate::DENSE,
        rope: RopeStyle::Neox,
        moe: false,
        tensors: &GEMMA3_TENSORS,
        keys: &GEMMA3_KEYS,
    },
    ArchSupport {
        id: Arch::Qwen2Moe,
        arch: "qwen2moe",
        matmul: crate::QWEN2MOE_MATMUL,
        rope: RopeStyle::Neox,
        moe: true,
        tensors: &QWEN2MOE_TENSORS,
        keys: &QWEN2MOE_KEYS,
    },
    ArchSupport {
        id: Arch::Qwen3Moe,
        arch: "qwen3moe",
        matmul: crate::QWEN3MOE_MATMUL,
        rope: RopeStyle::Neox,
        moe: true,
        tensors: &QWEN3MOE_TENSORS,
        keys: &QWEN3MOE_KEYS,
    },
];

/// The table of `arch`, if ork runs it.
pub fn support(arch: &str) -> Option<&'static ArchSupport> {
    SUPPORTED.iter().find(|s| s.arch == arch)
}

/// Why a tensor the table does not know is refused: what it is when ork knows the name from
/// llama.cpp, else a general reason.
fn tensor_reason(arch: &str, name: &str) -> String {
    match name {
        "rope_freqs.weight" => format!(
            "RoPE frequency factors are implemented for 'llama' only (llama.cpp reads them for \
             llama, not for '{arch}')"
        ),
        "rope_factors_long.weight" | "rope_factors_short.weight" => format!(
            "LongRoPE factors are implemented for 'phi3' and for 'llama' with \
             rope.scaling.type = longrope, not for '{arch}'"
        ),
        _ => format!("ork does not implement this tensor for architecture '{arch}'"),
    }
}

/// Why a key of the architecture's namespace that the table does not list is refused.
fn key_reason(arch: &str, suffix: &str) -> String {
    if suffix.starts_with("rope.") {
        format!(
            "this RoPE setting is not implemented for '{arch}' (ork implements rope.freq_base, \
             rope.dimension_count, linear rope.scaling.factor, rope.scaling.attn_factor and \
             frequency factors)"
        )
    } else {
        format!("ork does not implement this setting for architecture '{arch}'")
    }
}

/// Refuse a file of a supported architecture that carries a tensor, or a key of the
/// architecture's namespace, outside its table in [`SUPPORTED`]. Files of other architectures
/// (or none) pass: the executor refuses those by architecture.
///
/// # Errors
/// [`ManifestError::UnsupportedTensor`] or [`ManifestError::UnsupportedKey`], naming the file,
/// the first such tensor (in file order; tensors are checked before keys) or key, and why.
pub fn check_understood(file: &GgufFile) -> Result<(), ManifestError> {
    let Some(arch) = file
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
    else {
        return Ok(());
    };
    let Some(table) = support(arch) else {
        return Ok(());
    };
    // A block past `block_count` is refused as llama.cpp refuses it (a tensor no layer reads):
    // run quietly, the file would be a model with blocks missing.
    let blocks = file
        .metadata(&format!("{arch}.block_count"))
        .and_then(|v| v.as_u64());
    for t in file.tensors() {
        let class = classify(&t.name);
        let known = class.is_some_and(|(role, _)| table.tensors.contains(&role));
        let past = match (crate::block_of(&t.name), blocks) {
            (Some(layer), Some(n)) if layer as u64 >= n => Some((layer, n)),
            _ => None,
        };
        if !known || past.is_some() {
            let reason = match past {
                Some((layer, n)) => format!(
                    "block {layer} is past the file's {arch}.block_count {n}: no layer reads it"
                ),
                None => tensor_reason(arch, &t.name),
            };
            return Err(ManifestError::UnsupportedTensor {
                file: file.path().to_path_buf(),
                tensor: t.name.clone(),
                reason,
            });
        }
    }
    let prefix = format!("{arch}.");
    for (key, _) in file.metadata_iter() {
        if let Some(suffix) = key.strip_prefix(&prefix) {
            if !table.keys.contains(&suffix) {
                return Err(ManifestError::UnsupportedKey {
                    file: file.path().to_path_buf(),
                    key: key.to_owned(),
                    reason: key_reason(arch, suffix),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_role_has_a_name_and_lists_have_no_duplicates() {
        for s in SUPPORTED {
            for (i, r) in s.tensors.iter().enumerate() {
                assert!(crate::tensor_name(*r, 0).is_some(), "{}: {r:?}", s.arch);
                assert!(!s.tensors[..i].contains(r), "{}: {r:?} twice", s.arch);
            }
            for (i, k) in s.keys.iter().enumerate() {
                assert!(!k.is_empty() && !s.keys[..i].contains(k), "{}: {k}", s.arch);
            }
        }
    }

    #[test]
    fn the_message_names_the_file_and_the_tensor_once() {
        let e = ManifestError::UnsupportedTensor {
            file: "m.gguf".into(),
            tensor: "rope_freqs.weight".into(),
            reason: tensor_reason("llama", "rope_freqs.weight"),
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("m.gguf: tensor 'rope_freqs.weight'"),
            "{msg}"
        );
        assert_eq!(msg.matches("m.gguf").count(), 1, "{msg}");
        assert!(!e.without_file().contains("m.gguf"));
    }

    #[test]
    fn the_tables_agree_with_the_matmul_roles() {
        for (arch, matmul) in crate::ARCHITECTURES {
            let s = support(arch).expect("every manifest architecture has a table");
            for r in *matmul {
                assert!(s.tensors.contains(r), "{arch}: {r:?}");
            }
        }
        assert_eq!(SUPPORTED.len(), crate::ARCHITECTURES.len());
    }

    #[test]
    fn every_arch_has_one_row_and_its_name_round_trips() {
        let all = [
            Arch::Llama,
            Arch::Qwen2,
            Arch::Qwen3,
            Arch::Qwen2Moe,
            Arch::Qwen3Moe,
            Arch::Phi3,
            Arch::Gemma3,
        ];
        assert_eq!(all.len(), SUPPORTED.len());
        for a in all {
            assert_eq!(SUPPORTED.iter().filter(|s| s.id == a).count(), 1, "{a:?}");
            assert_eq!(Arch::from_name(a.name()), Some(a));
            assert_eq!(
                a.is_moe(),
                a.row().matmul.contains(&Role::ExpertGate) && a != Arch::Llama
            );
        }
        assert_eq!(Arch::from_name("mamba"), None);
        assert_eq!(Arch::Llama.rope_style(), RopeStyle::Interleaved);
        assert_eq!(Arch::Qwen3.rope_style(), RopeStyle::Neox);
    }
}
