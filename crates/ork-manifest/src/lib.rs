//! ork — the **weight manifest**: the one place that knows tensor names.
//!
//! In the spirit of llama.cpp's tensor-name table (`LLM_TENSOR_NAMES` in `src/llama-arch.cpp`:
//! `blk.%d.attn_q`, `blk.%d.ffn_gate_exps`, …), [`TENSOR_NAMES`] maps every tensor kind ork
//! reads to its GGUF name template, and [`ARCHITECTURES`] lists, per architecture, the matmul
//! roles a block may have in the order a forward pass uses them. [`Manifest::from_gguf`] derives,
//! once per model, every matmul weight as a typed, interned [`WeightId`] with its shape `(K, N)`,
//! [`Role`], layer and execution order. The store (which weights to pack), the residency layer
//! (execution order, plan, cache keys, prefetch schedule) and the executor (the names of a block's
//! weights) receive the manifest as data instead of deriving names themselves.
//!
//! 3-D expert tensors `blk.N.ffn_{gate,up,down}_exps.weight` (GGUF dims `[K, N, n_expert]`, i.e.
//! numpy `[n_expert, N, K]`) are represented by their per-expert slices: one [`Weight`] per expert,
//! whose [`Weight::key`] (the `.orkpack` entry name) is `TENSOR#EXPERT`, e.g.
//! `blk.0.ffn_gate_exps.weight#3` (docs/orkpack.md), and whose [`Weight::slice`] is a 2-D view
//! of the expert's bytes inside the tensor, usable wherever a 2-D tensor is.
//!
//! Why a crate of its own and not a module of `ork-gguf`: `ork-gguf` reads any GGUF file and knows
//! nothing of model architectures; the manifest is model knowledge that the store, the residency
//! layer and the executor share, and it depends on `ork-gguf` alone.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use ork_gguf::{GgufFile, TensorInfo};

mod names;
mod supported;
pub use names::{WeightName, WeightNames};
pub use supported::{check_understood, support, Arch, ArchSupport, RopeStyle, SUPPORTED};

/// Errors of [`Manifest::from_gguf`]; each names the file and the tensor (or key).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// A matmul weight's dims do not fit its role.
    #[error("{}: tensor '{tensor}' has dims {dims:?}: {reason}", file.display())]
    Shape {
        /// The GGUF file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dims as stored (`ne[0]` first).
        dims: Vec<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A metadata key disagrees with the tensors.
    #[error("{}: metadata key '{key}' {reason}", file.display())]
    Metadata {
        /// The GGUF file.
        file: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's bytes do not split into its experts.
    #[error("{}: tensor '{tensor}' ({size} bytes) does not split into {experts} experts", file.display())]
    ExpertSplit {
        /// The GGUF file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its byte size.
        size: u64,
        /// Its expert count.
        experts: u64,
    },
    /// A tensor ork does not implement for the file's architecture ([`check_understood`]).
    #[error("{}: {}", file.display(), self.without_file())]
    UnsupportedTensor {
        /// The GGUF file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// What it is and why it is refused.
        reason: String,
    },
    /// A metadata key ork does not implement for the file's architecture
    /// ([`check_understood`]).
    #[error("{}: {}", file.display(), self.without_file())]
    UnsupportedKey {
        /// The GGUF file.
        file: PathBuf,
        /// The key.
        key: String,
        /// Why it is refused.
        reason: String,
    },
}

impl ManifestError {
    /// The message without the leading file name, for callers that name the file themselves.
    pub fn without_file(&self) -> String {
        match self {
            ManifestError::UnsupportedTensor { tensor, reason, .. } => {
                format!("tensor '{tensor}' is not supported: {reason} (docs/models.md)")
            }
            ManifestError::UnsupportedKey { key, reason, .. } => {
                format!("metadata key '{key}' is not supported: {reason} (docs/models.md)")
            }
            other => other.to_string(),
        }
    }
}

/// What a tensor is. Matmul roles come first; the others are the small tensors the executor
/// reads itself (norms, biases, the embedding table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Role {
    /// Attention query projection.
    AttnQ,
    /// Attention key projection.
    AttnK,
    /// Attention value projection.
    AttnV,
    /// Fused query/key/value projection (phi3's `attn_qkv`): `[n_embd, q + k + v]`, the q rows
    /// first, then k, then v (llama.cpp's `build_qkv`).
    AttnQkv,
    /// Attention output projection.
    AttnOutput,
    /// Dense feed-forward gate.
    FfnGate,
    /// Dense feed-forward up projection.
    FfnUp,
    /// Dense feed-forward down projection.
    FfnDown,
    /// MoE router (`ffn_gate_inp`), `[n_embd, n_expert]`.
    Router,
    /// One expert's gate (a slice of `ffn_gate_exps`).
    ExpertGate,
    /// One expert's up projection (a slice of `ffn_up_exps`).
    ExpertUp,
    /// One expert's down projection (a slice of `ffn_down_exps`).
    ExpertDown,
    /// Shared expert gate (`ffn_gate_shexp`).
    SharedExpertGate,
    /// Shared expert up projection (`ffn_up_shexp`).
    SharedExpertUp,
    /// Shared expert down projection (`ffn_down_shexp`).
    SharedExpertDown,
    /// The output projection (`output.weight`).
    Output,
    /// The token embedding table; a matmul weight only as the tied output projection.
    TokenEmbd,
    /// Another 2-D tensor of the file (packed and streamed like the rest, unused by the
    /// executor).
    Other,
    /// Attention RMSNorm weight (not a matmul).
    AttnNorm,
    /// Feed-forward RMSNorm weight (not a matmul).
    FfnNorm,
    /// Query bias (not a matmul).
    AttnQBias,
    /// Key bias (not a matmul).
    AttnKBias,
    /// Value bias (not a matmul).
    AttnVBias,
    /// Per-head query norm (qwen3; not a matmul).
    AttnQNorm,
    /// Per-head key norm (qwen3; not a matmul).
    AttnKNorm,
    /// Shared expert's sigmoid gate vector (qwen2moe; not a matmul).
    SharedExpertGateInp,
    /// Final RMSNorm weight (not a matmul).
    OutputNorm,
    /// RoPE frequency factors, one per rotated pair (Llama 3.1/3.2's `rope_freqs`; not a
    /// matmul).
    RopeFreqs,
    /// LongRoPE factors for contexts beyond the original one (phi3; not a matmul).
    RopeFactorsLong,
    /// LongRoPE factors for contexts within the original one (phi3; not a matmul).
    RopeFactorsShort,
    /// RMSNorm of the attention output before the residual add (gemma3; not a matmul).
    AttnPostNorm,
    /// RMSNorm of the feed-forward output before the residual add (gemma3; not a matmul).
    FfnPostNorm,
}

/// The tensor-name table: every kind of tensor ork reads and its GGUF name; `{}` stands for the
/// block index of per-block tensors.
pub const TENSOR_NAMES: &[(Role, &str)] = &[
    (Role::TokenEmbd, "token_embd.weight"),
    (Role::Output, "output.weight"),
    (Role::OutputNorm, "output_norm.weight"),
    (Role::AttnNorm, "blk.{}.attn_norm.weight"),
    (Role::AttnQ, "blk.{}.attn_q.weight"),
    (Role::AttnK, "blk.{}.attn_k.weight"),
    (Role::AttnV, "blk.{}.attn_v.weight"),
    (Role::AttnQkv, "blk.{}.attn_qkv.weight"),
    (Role::AttnQBias, "blk.{}.attn_q.bias"),
    (Role::AttnKBias, "blk.{}.attn_k.bias"),
    (Role::AttnVBias, "blk.{}.attn_v.bias"),
    (Role::AttnQNorm, "blk.{}.attn_q_norm.weight"),
    (Role::AttnKNorm, "blk.{}.attn_k_norm.weight"),
    (Role::AttnOutput, "blk.{}.attn_output.weight"),
    (Role::FfnNorm, "blk.{}.ffn_norm.weight"),
    (Role::AttnPostNorm, "blk.{}.post_attention_norm.weight"),
    (Role::FfnPostNorm, "blk.{}.post_ffw_norm.weight"),
    (Role::FfnGate, "blk.{}.ffn_gate.weight"),
    (Role::FfnUp, "blk.{}.ffn_up.weight"),
    (Role::FfnDown, "blk.{}.ffn_down.weight"),
    (Role::Router, "blk.{}.ffn_gate_inp.weight"),
    (Role::ExpertGate, "blk.{}.ffn_gate_exps.weight"),
    (Role::ExpertUp, "blk.{}.ffn_up_exps.weight"),
    (Role::ExpertDown, "blk.{}.ffn_down_exps.weight"),
    (
        Role::SharedExpertGateInp,
        "blk.{}.ffn_gate_inp_shexp.weight",
    ),
    (Role::SharedExpertGate, "blk.{}.ffn_gate_shexp.weight"),
    (Role::SharedExpertUp, "blk.{}.ffn_up_shexp.weight"),
    (Role::SharedExpertDown, "blk.{}.ffn_down_shexp.weight"),
    (Role::RopeFreqs, "rope_freqs.weight"),
    (Role::RopeFactorsLong, "rope_factors_long.weight"),
    (Role::RopeFactorsShort, "rope_factors_short.weight"),
];

/// Matmul roles of one block in the order a forward pass uses them, with the expert roles last
/// (they run per expert: gate, up, down of expert 0, then of expert 1, …).
const BLOCK_ORDER: &[Role] = &[
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnQkv,
    Role::AttnOutput,
    Role::FfnGate,
    Role::FfnUp,
    Role::FfnDown,
    Role::Router,
    Role::SharedExpertGate,
    Role::SharedExpertUp,
    Role::SharedExpertDown,
    Role::ExpertGate,
    Role::ExpertUp,
    Role::ExpertDown,
];

/// Per architecture (`general.architecture`), the matmul roles its blocks may have: built from
/// the rows of [`SUPPORTED`], the one list of architectures. A file of an architecture not listed
/// here is read with every role of the table.
pub const ARCHITECTURES: &[(&str, &[Role])] = &{
    let mut out: [(&str, &[Role]); SUPPORTED.len()] = [("", &[]); SUPPORTED.len()];
    let mut i = 0;
    while i < SUPPORTED.len() {
        out[i] = (SUPPORTED[i].arch, SUPPORTED[i].matmul);
        i += 1;
    }
    out
};

/// llama's matmul roles: Mixtral-style MoE files are `llama` with experts.
const LLAMA_MATMUL: &[Role] = &[
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::FfnGate,
    Role::FfnUp,
    Role::FfnDown,
    Role::Router,
    Role::ExpertGate,
    Role::ExpertUp,
    Role::ExpertDown,
];

/// phi3's: fused q/k/v (or separate ones, as llama.cpp accepts); `ffn_up` holds gate and up.
const PHI3_MATMUL: &[Role] = &[
    Role::AttnQkv,
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::FfnUp,
    Role::FfnDown,
];

const QWEN2MOE_MATMUL: &[Role] = &[
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::Router,
    Role::ExpertGate,
    Role::ExpertUp,
    Role::ExpertDown,
    Role::SharedExpertGate,
    Role::SharedExpertUp,
    Role::SharedExpertDown,
];

const QWEN3MOE_MATMUL: &[Role] = &[
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::Router,
    Role::ExpertGate,
    Role::ExpertUp,
    Role::ExpertDown,
];

/// The matmul roles of a dense (llama-shaped) block, in the order a forward pass uses them: the
/// dense architectures' row in [`SUPPORTED`], and the block of a model the board clock knows by
/// its dimensions alone.
pub const DENSE: [Role; 7] = [
    Role::AttnQ,
    Role::AttnK,
    Role::AttnV,
    Role::AttnOutput,
    Role::FfnGate,
    Role::FfnUp,
    Role::FfnDown,
];

/// The GGUF name of tensor `role` (of block `layer` for per-block tensors; `layer` is ignored for
/// the others). `None` for [`Role::Other`], which has no fixed name.
pub fn tensor_name(role: Role, layer: usize) -> Option<String> {
    TENSOR_NAMES
        .iter()
        .find(|(r, _)| *r == role)
        .map(|(_, t)| t.replace("{}", &layer.to_string()))
}

/// Parse a tensor name against the table: its role and block index (per-block tensors).
pub fn classify(name: &str) -> Option<(Role, Option<usize>)> {
    if let Some(rest) = name.strip_prefix("blk.") {
        let (_, suffix) = rest.split_once('.')?;
        let layer = block_of(name)?;
        return TENSOR_NAMES
            .iter()
            .find(|(_, t)| t.strip_prefix("blk.{}.") == Some(suffix))
            .map(|(r, _)| (*r, Some(layer)));
    }
    TENSOR_NAMES
        .iter()
        .find(|(_, t)| *t == name)
        .map(|(r, _)| (*r, None))
}

/// The block index (layer) of a `blk.N.…` tensor name or `TENSOR#EXPERT` key, whether or not the
/// table knows the rest: the one place a layer is read from a name. The index is a `u32` printed
/// plainly (`blk.01.` is no block): `layer + 1` cannot overflow.
pub fn block_of(name: &str) -> Option<usize> {
    let (blk, _) = name.strip_prefix("blk.")?.split_once('.')?;
    let layer = blk.parse::<u32>().ok()? as usize;
    (layer.to_string() == blk).then_some(layer)
}

/// The key of a weight (its `.orkpack` entry and cache name, [`Weight::key`]): the GGUF name of
/// `role` in block `layer`, with `#EXPERT` for an expert's slice of a 3-D expert tensor. `None`
/// for [`Role::Other`].
pub fn weight_key(role: Role, layer: usize, expert: Option<u32>) -> Option<String> {
    let t = tensor_name(role, layer)?;
    Some(match expert {
        Some(x) => slice_key(&t, x),
        None => t,
    })
}

/// `TENSOR#EXPERT`: the key of expert `expert`'s slice of 3-D tensor `tensor`.
fn slice_key(tensor: &str, expert: u32) -> String {
    format!("{tensor}#{expert}")
}

/// Whether `key` names an expert's slice (`TENSOR#EXPERT`, see [`Weight::key`]).
pub fn is_expert_key(key: &str) -> bool {
    key.contains('#')
}

/// The weight named `key` in `file`: the tensor of that name (as stored; the caller checks that
/// it is 2-D), or for `TENSOR#EXPERT` expert `EXPERT`'s 2-D slice of the 3-D tensor `TENSOR`
/// (dims `[K, N]`, its bytes inside the tensor), as [`Manifest::from_gguf`] derives it. `None`
/// when there is no such tensor or expert, or the tensor's bytes do not split into its experts
/// (the manifest reports that as an error).
pub fn weight_view(file: &GgufFile, key: &str) -> Option<TensorInfo> {
    let Some((tensor, expert)) = key.rsplit_once('#') else {
        return file.tensor(key).cloned();
    };
    let t = file.tensor(tensor)?;
    let x: u64 = expert.parse().ok()?;
    let [k, n, e] = t.dims[..] else {
        return None;
    };
    if x >= e || !t.size.is_multiple_of(e) || expert != x.to_string() {
        return None;
    }
    let slice_bytes = t.size / e;
    Some(TensorInfo {
        name: key.to_owned(),
        dims: vec![k, n],
        ty: t.ty,
        offset: t.offset + x * slice_bytes,
        size: slice_bytes,
    })
}

/// A matmul weight: a small `Copy` index into its model's name table ([`WeightNames`], a
/// [`Manifest`]'s or one built from a shape's roles), the one id space every layer (executor,
/// weight cache, placement, draft, board events) keys weights by. Only a name table makes ids,
/// so an id always names a weight of the model it came from; its name is
/// [`WeightNames::key`]`(id)` (for a manifest, also [`Manifest::get`]`(id).key`). Two models
/// number their weights from 0 each: a layer that sees both (the board clock's speculative
/// schedule) keys a weight by its model and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(u32);

impl WeightId {
    /// The index into [`Manifest::weights`].
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// A provisional id for a loader that numbers weights while it checks them, before the
    /// manifest exists: ork-exec's `Model::load`, which replaces every such id by the
    /// manifest's before the model is returned. Nothing else makes ids outside a manifest.
    #[doc(hidden)]
    pub fn provisional(index: u32) -> WeightId {
        WeightId(index)
    }

    /// The id at `index`, for tests of a layer fed ids without a manifest (a `Linear` over
    /// hand-made weights). Only built with the `test-ids` feature, which crates enable in their
    /// dev-dependencies; in a run every id comes from [`Manifest::from_gguf`].
    #[cfg(feature = "test-ids")]
    pub fn from_test_index(index: u32) -> WeightId {
        WeightId(index)
    }
}

impl fmt::Display for WeightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One matmul weight of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    /// Its id.
    pub id: WeightId,
    /// The GGUF tensor it is (or is a slice of).
    pub tensor: String,
    /// The expert index for a slice of a 3-D expert tensor.
    pub expert: Option<u32>,
    /// The name of its `.orkpack` entry and cache key: the tensor name, `TENSOR#EXPERT` for an
    /// expert slice.
    pub key: String,
    /// What it does.
    pub role: Role,
    /// Its block, for per-block weights.
    pub layer: Option<u32>,
    /// Input width (GGUF `ne[0]`).
    pub k: usize,
    /// Output width (GGUF `ne[1]`): `N` rows of `K` values.
    pub n: usize,
    /// The weight's bytes as a 2-D tensor of dims `[K, N]` named [`Weight::key`]: the tensor
    /// itself, or the expert's slice of it.
    pub slice: TensorInfo,
}

/// Every matmul weight of a model, derived once from its GGUF.
#[derive(Clone, Debug)]
pub struct Manifest {
    file: PathBuf,
    arch: Option<String>,
    n_layer: usize,
    n_expert: u32,
    n_expert_used: u32,
    /// In pack order: `token_embd.weight` first, then block by block in [`BLOCK_ORDER`] (other
    /// 2-D tensors of a block after its known roles, in file order), then `output.weight`, then
    /// any remaining 2-D tensors in file order.
    weights: Vec<Weight>,
    /// The forward pass's order: blocks, then the output projection (`output.weight`, or
    /// `token_embd.weight` when tied).
    execution: Vec<WeightId>,
    /// The name table of `weights`, in the same order.
    names: WeightNames,
}

/// A weight found in the file with its sort keys: (pack rank, file index, expert).
type Found = ((u8, usize, usize), usize, u32, Weight);

/// Sort rank of a weight in pack order.
fn pack_rank(role: Role, layer: Option<usize>) -> (u8, usize, usize) {
    match (role, layer) {
        (Role::TokenEmbd, _) => (0, 0, 0),
        (_, Some(l)) => (
            1,
            l,
            BLOCK_ORDER
                .iter()
                .position(|r| *r == role)
                .unwrap_or(BLOCK_ORDER.len()),
        ),
        (Role::Output, None) => (2, 0, 0),
        _ => (3, 0, 0),
    }
}

impl Manifest {
    /// Derive the manifest of `file`: every 2-D tensor is a matmul weight (classified by the name
    /// table, [`Role::Other`] when it has no entry there), every 3-D expert tensor is split into
    /// its experts; 1-D tensors and other 3-D tensors are not matmul weights.
    ///
    /// # Errors
    /// A tensor whose role needs other dims (a 3-D tensor named like a dense weight, an expert
    /// tensor that is not 3-D, gate/up/down experts that disagree with each other, with the
    /// router or with `{arch}.expert_count`, a zero dim), or expert bytes that do not split
    /// evenly: an error naming the file and the tensor.
    pub fn from_gguf(file: &GgufFile) -> Result<Manifest, ManifestError> {
        let ctx = FileFacts::of(file);
        let mut scan = Scan::default();
        for (fi, t) in file.tensors().iter().enumerate() {
            scan.tensor(&ctx, fi, t)?;
        }
        scan.check_routers(&ctx)?;
        if let (Some(m), 0) = (ctx.meta_experts, scan.n_expert) {
            if m > 0 {
                return Err(ManifestError::Metadata {
                    file: ctx.path.clone(),
                    key: ctx.expert_key.clone().unwrap_or_default(),
                    reason: format!("says {m} experts, but the file has no expert tensors"),
                });
            }
        }
        let (n_layer, n_expert) = (scan.n_layer, scan.n_expert);
        let mut weights = pack_order(scan.found);
        let names = assign_ids(&mut weights);
        let execution = execution_order(&weights);
        // `{arch}.expert_used_count`, kept for planning (the executor checks it).
        let n_expert_used = ctx
            .arch
            .as_ref()
            .and_then(|a| file.metadata(&format!("{a}.expert_used_count")))
            .and_then(|v| v.as_u64())
            .map_or(0, |u| u.min(u64::from(n_expert)) as u32);
        Ok(Manifest {
            file: ctx.path,
            arch: ctx.arch,
            n_layer,
            n_expert,
            n_expert_used,
            weights,
            execution,
            names,
        })
    }

    /// The GGUF file it was derived from.
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    /// `general.architecture`, if the file has one.
    pub fn arch(&self) -> Option<&str> {
        self.arch.as_deref()
    }

    /// Blocks seen in tensor names.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// Experts per MoE block (0 for a dense model).
    pub fn n_expert(&self) -> u32 {
        self.n_expert
    }

    /// Experts a token uses per MoE block (`{arch}.expert_used_count`, at most
    /// [`Manifest::n_expert`]; 0 for a dense model).
    pub fn n_expert_used(&self) -> u32 {
        self.n_expert_used
    }

    /// The fraction of a block's experts one token uses (0 for a dense model).
    pub fn expert_used_fraction(&self) -> f64 {
        if self.n_expert == 0 {
            0.0
        } else {
            f64::from(self.n_expert_used) / f64::from(self.n_expert)
        }
    }

    /// Every matmul weight in pack order: `token_embd.weight` first, then block by block
    /// (`attn_q`, `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`, `ffn_down`, router,
    /// shared experts, then each expert's gate, up, down; any other 2-D tensor of the block after
    /// them in file order), then `output.weight`, then the remaining 2-D tensors in file order.
    /// Indexed by [`WeightId`].
    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }

    /// The weights a forward pass uses, in its order: block by block as in
    /// [`Manifest::weights`], then the output projection (`output.weight`, or
    /// `token_embd.weight` when the embedding is tied; the embedding is otherwise a lookup, not
    /// a matmul).
    pub fn execution_order(&self) -> impl ExactSizeIterator<Item = &Weight> + '_ {
        self.execution.iter().map(|id| &self.weights[id.index()])
    }

    /// A weight by id.
    ///
    /// # Panics
    /// If `id` is not of this manifest (ids are only made by it).
    pub fn get(&self, id: WeightId) -> &Weight {
        &self.weights[id.index()]
    }

    /// The name table of [`Manifest::weights`]: the same ids, keys, roles, layers and experts.
    pub fn names(&self) -> &WeightNames {
        &self.names
    }

    /// The id of the weight whose key (tensor name, or `TENSOR#EXPERT`) is `key`.
    pub fn id(&self, key: &str) -> Option<WeightId> {
        self.names.id(key)
    }

    /// The weight with `role` in block `layer` (`None` for the output projection and the
    /// embedding), and `expert` for expert slices.
    pub fn find(&self, role: Role, layer: Option<u32>, expert: Option<u32>) -> Option<WeightId> {
        self.names.find(role, layer, expert)
    }

    /// The output projection: `output.weight`, or the tied `token_embd.weight`.
    pub fn output(&self) -> Option<WeightId> {
        self.find(Role::Output, None, None)
            .or_else(|| self.find(Role::TokenEmbd, None, None))
    }
}

/// What [`Manifest::from_gguf`] reads from a file's metadata before it looks at the tensors.
struct FileFacts {
    path: PathBuf,
    arch: Option<String>,
    /// The roles of the file's architecture, when it is a known one.
    allowed: Option<&'static [Role]>,
    /// `{arch}.expert_count`, the key and its value.
    expert_key: Option<String>,
    meta_experts: Option<u64>,
}

impl FileFacts {
    fn of(file: &GgufFile) -> FileFacts {
        let arch = file
            .metadata("general.architecture")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let allowed: Option<&'static [Role]> = arch
            .as_deref()
            .and_then(|a| ARCHITECTURES.iter().find(|(n, _)| *n == a))
            .map(|(_, roles)| *roles);
        let expert_key = arch.as_ref().map(|a| format!("{a}.expert_count"));
        let meta_experts = expert_key
            .as_deref()
            .and_then(|k| file.metadata(k))
            .and_then(|v| v.as_u64());
        FileFacts {
            path: file.path().to_path_buf(),
            arch,
            allowed,
            expert_key,
            meta_experts,
        }
    }

    /// A shape error naming the file and `t`.
    fn shape(&self, t: &TensorInfo, reason: String) -> ManifestError {
        ManifestError::Shape {
            file: self.path.clone(),
            tensor: t.name.clone(),
            dims: t.dims.clone(),
            reason,
        }
    }
}

/// The weights found so far while [`Manifest::from_gguf`] walks the tensors.
#[derive(Default)]
struct Scan<'f> {
    /// (rank, file index, expert) → weight, sorted by [`pack_order`].
    found: Vec<Found>,
    n_layer: usize,
    n_expert: u32,
    /// Per block, the expert shape (K, N of gate/up, expert count) seen so far, and the tensor
    /// that set it.
    expert_shapes: HashMap<usize, (u64, u64, u64, String)>,
    routers: Vec<&'f TensorInfo>,
}

impl<'f> Scan<'f> {
    /// Take tensor `t` (index `fi` in the file): an expert tensor, a 2-D weight, or nothing.
    fn tensor(
        &mut self,
        ctx: &FileFacts,
        fi: usize,
        t: &'f TensorInfo,
    ) -> Result<(), ManifestError> {
        let class = classify(&t.name);
        let (role, layer) = class.unwrap_or((Role::Other, block_of(&t.name)));
        if let Some(l) = layer {
            self.n_layer = self.n_layer.max(l + 1);
        }
        let is_expert = matches!(role, Role::ExpertGate | Role::ExpertUp | Role::ExpertDown);
        if t.dims.contains(&0) {
            if t.dims.len() == 2 || is_expert {
                return Err(ctx.shape(t, "a matmul weight has no zero dim".into()));
            }
            return Ok(());
        }
        if is_expert {
            return self.experts(ctx, fi, t, role, layer);
        }
        if t.dims.len() != 2 {
            let matmul_role =
                class.is_some_and(|(r, _)| r < Role::AttnNorm && r != Role::TokenEmbd);
            if matmul_role {
                return Err(ctx.shape(
                    t,
                    format!(
                        "a matmul weight has 2 dims [K, N], this one has {}",
                        t.dims.len()
                    ),
                ));
            }
            return Ok(());
        }
        self.dense(ctx, fi, t, role, layer);
        Ok(())
    }

    /// A 2-D tensor: one weight.
    fn dense(
        &mut self,
        ctx: &FileFacts,
        fi: usize,
        t: &'f TensorInfo,
        mut role: Role,
        layer: Option<usize>,
    ) {
        // A 2-D tensor the table knows as a non-matmul one (e.g. a [n_embd, 1] gate vector)
        // is still packed like any 2-D tensor, as a weight of no known role.
        if role >= Role::AttnNorm {
            role = Role::Other;
        }
        // A role the architecture does not have is kept, as an unused weight.
        if ctx
            .allowed
            .is_some_and(|a| role < Role::Output && !a.contains(&role))
        {
            role = Role::Other;
        }
        if role == Role::Router {
            self.routers.push(t);
        }
        let (k, n) = (t.dims[0], t.dims[1]);
        let w = weight(t, None, t.name.clone(), role, layer, k, n, t.clone());
        self.found.push((pack_rank(role, layer), fi, 0, w));
    }

    /// A 3-D expert tensor [K, N, n_expert]: one weight per expert, each a slice of its bytes.
    fn experts(
        &mut self,
        ctx: &FileFacts,
        fi: usize,
        t: &TensorInfo,
        role: Role,
        layer: Option<usize>,
    ) -> Result<(), ManifestError> {
        let [k, n, e] = t.dims[..] else {
            return Err(ctx.shape(
                t,
                format!(
                    "an expert tensor has 3 dims [K, N, n_expert], this one has {}",
                    t.dims.len()
                ),
            ));
        };
        if let Some(m) = ctx.meta_experts {
            if m != e {
                return Err(ctx.shape(
                    t,
                    format!(
                        "{e} experts, but {} says {m}",
                        ctx.expert_key.as_deref().unwrap_or("expert_count")
                    ),
                ));
            }
        }
        let l = layer.expect("expert roles are per block");
        self.check_expert_shape(ctx, t, role, l, (k, n, e))?;
        if !t.size.is_multiple_of(e) {
            return Err(ManifestError::ExpertSplit {
                file: ctx.path.clone(),
                tensor: t.name.clone(),
                size: t.size,
                experts: e,
            });
        }
        let e32 = u32::try_from(e).map_err(|_| ctx.shape(t, "too many experts".into()))?;
        self.n_expert = self.n_expert.max(e32);
        let slice_bytes = t.size / e;
        for x in 0..e32 {
            let key = slice_key(&t.name, x);
            let slice = TensorInfo {
                name: key.clone(),
                dims: vec![k, n],
                ty: t.ty,
                offset: t.offset + u64::from(x) * slice_bytes,
                size: slice_bytes,
            };
            let w = weight(t, Some(x), key, role, layer, k, n, slice);
            self.found.push((pack_rank(role, layer), fi, x, w));
        }
        Ok(())
    }

    /// The gate/up/down experts of block `l` must agree: gate/up are [n_embd, n_ff, E], down is
    /// [n_ff, n_embd, E]. The first one seen sets the shape.
    fn check_expert_shape(
        &mut self,
        ctx: &FileFacts,
        t: &TensorInfo,
        role: Role,
        l: usize,
        (k, n, e): (u64, u64, u64),
    ) -> Result<(), ManifestError> {
        let down = role == Role::ExpertDown;
        let (ek, en) = if down { (n, k) } else { (k, n) };
        match self.expert_shapes.get(&l) {
            Some((k0, n0, e0, first)) if (*k0, *n0, *e0) != (ek, en, e) => Err(ctx.shape(
                t,
                format!(
                    "disagrees with '{first}' of the same block (expected {} experts of \
                     [{}, {}]{})",
                    e0,
                    if down { n0 } else { k0 },
                    if down { k0 } else { n0 },
                    if down {
                        ", the transpose of gate/up"
                    } else {
                        ""
                    }
                ),
            )),
            Some(_) => Ok(()),
            None => {
                self.expert_shapes.insert(l, (ek, en, e, t.name.clone()));
                Ok(())
            }
        }
    }

    /// A router must be [n_embd, n_expert] for the experts of its block.
    fn check_routers(&self, ctx: &FileFacts) -> Result<(), ManifestError> {
        for r in &self.routers {
            let l = classify(&r.name).and_then(|(_, l)| l).unwrap_or(0);
            if let Some((k, _, e, first)) = self.expert_shapes.get(&l) {
                if r.dims[..] != [*k, *e] {
                    return Err(ctx.shape(
                        r,
                        format!("a router of {e} experts over '{first}' has dims [{k}, {e}]"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The weights in pack order: stable by rank, then file order, then expert; experts of one block
/// interleave gate/up/down per expert (the order they run in).
fn pack_order(mut found: Vec<Found>) -> Vec<Weight> {
    found.sort_by_key(|(rank, fi, x, w)| {
        let expert_role = matches!(w.role, Role::ExpertGate | Role::ExpertUp | Role::ExpertDown);
        if expert_role {
            (
                rank.0,
                rank.1,
                BLOCK_ORDER.len() - 3,
                *x as usize,
                rank.2,
                *fi,
            )
        } else {
            (rank.0, rank.1, rank.2, 0, 0, *fi)
        }
    });
    found.into_iter().map(|(_, _, _, w)| w).collect()
}

/// Number the weights in order: their name table, indexed by key and by (role, layer, expert).
fn assign_ids(weights: &mut [Weight]) -> WeightNames {
    let mut names = WeightNames::default();
    for w in weights.iter_mut() {
        w.id = names.push(WeightName {
            key: w.key.clone(),
            role: w.role,
            layer: w.layer,
            expert: w.expert,
        });
    }
    names
}

/// The order the weights run in: all but the token embedding, which runs last as the output
/// projection when the file has no output weight (tied embeddings).
fn execution_order(weights: &[Weight]) -> Vec<WeightId> {
    let has_output = weights.iter().any(|w| w.role == Role::Output);
    let mut execution: Vec<WeightId> = weights
        .iter()
        .filter(|w| w.role != Role::TokenEmbd)
        .map(|w| w.id)
        .collect();
    if !has_output {
        if let Some(e) = weights.iter().find(|w| w.role == Role::TokenEmbd) {
            execution.push(e.id);
        }
    }
    execution
}

#[allow(clippy::too_many_arguments)]
fn weight(
    t: &TensorInfo,
    expert: Option<u32>,
    key: String,
    role: Role,
    layer: Option<usize>,
    k: u64,
    n: u64,
    slice: TensorInfo,
) -> Weight {
    Weight {
        id: WeightId(u32::MAX),
        tensor: t.name.clone(),
        expert,
        key,
        role,
        layer: layer.map(|l| l as u32),
        // The parser caps dims far below usize::MAX on 64-bit targets.
        k: k as usize,
        n: n as usize,
        slice,
    }
}
