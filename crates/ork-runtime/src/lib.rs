//! ork — the **engine**: one object that front ends (the `ork` CLI today; a server, a draft model
//! beside a verifier tomorrow) run models through.
//!
//! [`Engine::open`] takes an [`EngineConfig`] and owns everything a model run needs: the GGUF
//! (`Arc<GgufFile>`), its weight [`Manifest`], the [`Model`], [`Tokenizer`] and chat template, the
//! device, the residency [`Plan`], the self-populating `.orkpack`, the budgeted [`WeightCache`] and
//! the prefetcher; it hands out [`Session`]s and exposes what a front end reports (plan, cache
//! stats, convert report). The stack, top to bottom: a [`Session`] asks the engine's [`Linear`]
//! for every matmul; it hands the matmul to the residency layer's [`DeviceMatmul`], which leases
//! the weight from the cache (filled from the `.orkpack`, or packed from the GGUF) and submits the
//! task to the device.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod doctor;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ork_device::{ActPrecision, Device, EmuConfig};
pub use ork_exec::KvType;
use ork_exec::{ChatTemplate, ExecError, Linear, Model, Session, Tokenizer};
use ork_gguf::GgufFile;
use ork_manifest::Manifest;
use ork_pack::PackDtype;
use ork_residency::{
    device_bytes, plan::domain_map, CacheConfig, CacheStats, DeviceBudget, DeviceMatmul,
    LayerOrder, Mode, Plan, PlanInput, Trace, WeightCache, WeightSource,
};
use ork_store::{ConvertOptions, ConvertReport};

/// Default weight-cache budget per domain (MiB) when neither the config nor
/// `ORK_WCACHE_BUDGET_MB` gives one.
pub const DEFAULT_BUDGET_MB: u64 = 3072;

/// What can go wrong opening or running an engine. Each variant names the file (and, through its
/// source, the tensor) it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The GGUF cannot be opened or parsed.
    #[error(transparent)]
    Gguf(#[from] ork_gguf::GgufError),
    /// The calibration text for smoothing (`--calib`) cannot be used: missing, unreadable,
    /// not UTF-8 or empty.
    #[error("calibration file {}: {what}", path.display())]
    Calibration {
        /// The calibration file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The model's weight manifest cannot be derived.
    #[error(transparent)]
    Manifest(#[from] ork_manifest::ManifestError),
    /// The model (configuration, tensors, tokenizer, template) cannot be loaded.
    #[error("{}", model.display())]
    Model {
        /// The GGUF file.
        model: PathBuf,
        /// The executor's error.
        #[source]
        source: ExecError,
    },
    /// A weight cannot be planned (a tensor that is no matmul weight).
    #[error("{}", model.display())]
    Plan {
        /// The GGUF file.
        model: PathBuf,
        /// The store's error naming the tensor.
        #[source]
        source: ork_store::StoreError,
    },
    /// The budget cannot hold the largest weight.
    #[error(
        "{}: a weight budget of {budget_mib} MiB cannot hold weight '{weight}' ({weight_mib:.1} MiB); \
         the minimum budget is {min_mib} MiB",
        model.display()
    )]
    BudgetTooSmall {
        /// The GGUF file.
        model: PathBuf,
        /// The budget per domain, MiB.
        budget_mib: u64,
        /// The largest weight.
        weight: String,
        /// Its device size, MiB.
        weight_mib: f64,
        /// The smallest budget that runs the model, MiB.
        min_mib: u64,
    },
    /// A budget setting is not usable.
    #[error("{what}")]
    Budget {
        /// What is wrong.
        what: String,
    },
    /// The `.orkpack` cannot be prepared.
    #[error("preparing the weight cache {}", path.display())]
    Pack {
        /// The `.orkpack` path.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: ork_store::StoreError,
    },
    /// The weight cache cannot be set up (pinning, placement).
    #[error(transparent)]
    Residency(#[from] ork_residency::ResidencyError),
    /// The chip the run models cannot run the weights' matmuls in the asked precision (e.g.
    /// fp16 activations × int8 weights on the RK3588): refused before anything is converted.
    #[error("{}: {source}; {hint}", model.display())]
    Chip {
        /// The GGUF file.
        model: PathBuf,
        /// What to use instead.
        hint: String,
        /// The device layer's refusal, naming the chip, the type pair and the limit.
        #[source]
        source: ork_device::DeviceError,
    },
    /// The draft model cannot be opened or used (`--draft MODEL.gguf`): unreadable, not a model
    /// ork runs, or a vocabulary other than the model's ([`ExecError::DraftVocabMismatch`]).
    #[error("draft {}", draft.display())]
    DraftModel {
        /// The draft's GGUF file.
        draft: PathBuf,
        /// The executor's error.
        #[source]
        source: ExecError,
    },
    /// The draft's resident weights and the model's smallest working set do not fit the budget
    /// together.
    #[error(
        "{}: the draft ({draft}) keeps {draft_mib:.1} MiB resident and the model needs at least          {model_min_mib:.1} MiB beside it, but the weight budget is {budget_mib} MiB: use a budget          of at least {need_mib} MiB or a smaller draft",
        model.display()
    )]
    DraftTooLarge {
        /// The GGUF file.
        model: PathBuf,
        /// Which draft (`self:N` or the draft's file).
        draft: String,
        /// The draft's resident bytes, MiB.
        draft_mib: f64,
        /// The model's largest remaining weight, MiB.
        model_min_mib: f64,
        /// The budget per domain, MiB.
        budget_mib: u64,
        /// The smallest budget that holds both, MiB.
        need_mib: u64,
    },
    /// The device cannot be opened or configured.
    #[error("{what}")]
    Device {
        /// What was being done.
        what: String,
        /// The device's error, if it gave one.
        #[source]
        source: Option<ork_device::DeviceError>,
    },
}

/// Which device backend to open (the device layer's choice and its one `auto` policy, see
/// `docs/device.md`).
pub use ork_device::DeviceKind;

/// Where the packed weights come from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PackChoice {
    /// `ORK_PERSIST`, else `MODEL.orkpack` next to the model.
    #[default]
    Default,
    /// This `.orkpack` (read if valid, else built).
    Path(PathBuf),
    /// No `.orkpack`: pack every weight from the GGUF when it is needed.
    None,
}

/// Told about the `.orkpack` conversion while [`Engine::open`] runs it (a front end's progress
/// bar).
pub trait ConvertObserver: Sync {
    /// Conversion is about to check or pack the weights of `manifest`.
    fn started(&self, manifest: &Manifest);
    /// One weight was handled.
    fn tensor_done(&self, progress: &ork_store::Progress<'_>);
    /// Conversion is over (also after an error).
    fn finished(&self);
}

/// A quantization mode, named as rkllm names them (`docs/chip.md`): weights × activations and
/// how the weight scales cover K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Quant {
    /// int8 weights, per-channel scales, int8 activations (the default).
    W8a8,
    /// int8 weights with one scale per 128 / 256 / 512 consecutive k, int8 activations (the
    /// chip's int8 × int8 → fp32 per-group mode). Weights whose K the group does not divide keep
    /// per-channel scales.
    W8a8G(usize),
    /// fp16 weights and activations.
    W16a16,
    /// int4 weights, per-channel scales, fp16 activations (RK3576 only).
    W4a16,
    /// int4 weights with affine groups of 32 / 64 / 128 consecutive k (a step and an offset per
    /// group, [`ork_pack::ScaleGroup::Affine`]), fp16 activations (RK3576 only; the chip's
    /// fp16 × int4 → fp32 per-group mode plus an fp16 × fp16 matmul of the offsets,
    /// `docs/chip.md`). Weights whose K the group does not divide keep per-channel scales.
    W4a16G(usize),
}

impl Quant {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: [Quant; 9] = [
        Quant::W8a8,
        Quant::W8a8G(128),
        Quant::W8a8G(256),
        Quant::W8a8G(512),
        Quant::W16a16,
        Quant::W4a16,
        Quant::W4a16G(32),
        Quant::W4a16G(64),
        Quant::W4a16G(128),
    ];

    /// Weight dtype, activation precision and scale group.
    pub fn parts(self) -> (PackDtype, ActPrecision, ork_pack::ScaleGroup) {
        use ork_pack::ScaleGroup::{Affine, Group, PerChannel};
        match self {
            Quant::W8a8 => (PackDtype::I8, ActPrecision::Int8, PerChannel),
            Quant::W8a8G(g) => (PackDtype::I8, ActPrecision::Int8, Group(g)),
            Quant::W16a16 => (PackDtype::F16, ActPrecision::F16, PerChannel),
            Quant::W4a16 => (PackDtype::I4, ActPrecision::F16, PerChannel),
            Quant::W4a16G(g) => (PackDtype::I4, ActPrecision::F16, Affine(g)),
        }
    }

    /// The name (`w8a8`, `w8a8-g128`, …).
    pub fn name(self) -> String {
        match self {
            Quant::W8a8 => "w8a8".to_owned(),
            Quant::W8a8G(g) => format!("w8a8-g{g}"),
            Quant::W16a16 => "w16a16".to_owned(),
            Quant::W4a16 => "w4a16".to_owned(),
            Quant::W4a16G(g) => format!("w4a16-g{g}"),
        }
    }
}

impl std::fmt::Display for Quant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Quant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Quant::ALL
            .iter()
            .copied()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                let names: Vec<String> = Quant::ALL.iter().map(|q| q.name()).collect();
                format!("unknown quant '{s}' (one of: {})", names.join(", "))
            })
    }
}

/// Everything [`Engine::open`] needs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The GGUF model.
    pub model: PathBuf,
    /// The `.orkpack` to use.
    pub pack: PackChoice,
    /// Weight budget per domain in bytes (`None`: `ORK_WCACHE_BUDGET_MB`, else
    /// [`DEFAULT_BUDGET_MB`]).
    pub budget_bytes: Option<u64>,
    /// The device backend.
    pub device: DeviceKind,
    /// IOMMU domains to use.
    pub domains: u32,
    /// The chip whose matmul types and limits the run keeps to (`docs/chip.md`).
    pub soc: ork_device::Soc,
    /// Weight dtype on the device.
    pub dtype: PackDtype,
    /// Activation precision of the device matmuls.
    pub activations: ActPrecision,
    /// Weight scale groups: per channel, or `Group(g)` for every weight whose K `g` divides
    /// (the others stay per channel; `docs/chip.md`). [`EngineConfig::set_quant`] sets it with
    /// `dtype` and `activations`.
    pub group: ork_pack::ScaleGroup,
    /// Compute threads (`None`: all cores). The first engine of a process sizes rayon's global
    /// pool when it loads ([`Engine::load`]); a process that used that pool before keeps the
    /// pool it has ([`Engine::threads`] says its size).
    pub threads: Option<usize>,
    /// Run the prefetch thread when the plan streams, and the first-pass loader (`Warmup`) when
    /// it is resident.
    pub prefetch: bool,
    /// Record a timeline of loads, computes and waits ([`Engine::trace`]).
    pub trace: bool,
    /// Verify checksums of blobs loaded from the `.orkpack`.
    pub verify: bool,
    /// Drop source pages once each tensor is converted (`ORK_EVICT_SRC`).
    pub evict_src: bool,
    /// A draft model for speculative decoding kept on the device beside the model, its bytes
    /// taken from the same budget (`docs/speculative.md`); `None` for none (prompt lookup needs
    /// no model).
    pub draft: Option<DraftSource>,
    /// MoE models: speculative expert prefetch in decode, predicting `k + extra` experts of
    /// each block from the block before (`None`: announce only the experts a router chose;
    /// see docs/moe.md).
    pub expert_speculation: Option<usize>,
    /// SmoothQuant-style smoothing folded into the weights before they are packed
    /// (`docs/chip.md`); `None` for none.
    pub smooth: Option<Smoothing>,
    /// What the sessions' KV caches store (f16 by default, as llama.cpp's; `docs/kv-cache.md`).
    pub kv_cache: KvType,
}

/// SmoothQuant-style smoothing (`docs/chip.md`): per input channel of q/k/v and gate/up,
/// `s = max|X|^alpha / max|W|^(1-alpha)`, `max|X|` measured by running `calib` through the f32
/// reference; `1/s` is folded into the RMSNorm before, `s` into the weights. `targets` adds the
/// inputs no norm precedes (`v → o` per head, `up → down`), `1/s` folded into the projection
/// before. A pack made with other smoothing (or none) is rebuilt with the reason.
#[derive(Clone, Debug, PartialEq)]
pub struct Smoothing {
    /// Migration strength in `[0, 1]` (0.7 by default in the CLI).
    pub alpha: f32,
    /// The calibration text (a few hundred tokens; never the text perplexity is measured on).
    pub calib: PathBuf,
    /// Which matmul inputs are smoothed besides the normed ones.
    pub targets: ork_exec::SmoothTargets,
}

/// Tokens of the calibration text used at most (windows of [`CALIB_CTX`]).
pub const CALIB_MAX_TOKENS: usize = 2048;
/// Window length of the calibration run.
pub const CALIB_CTX: usize = 512;

/// Where the smoothing factors of a load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmoothingOrigin {
    /// A calibration pass through the f32 reference computed them.
    Calibrated,
    /// The `.orkpack`'s smoothing section held them for the same parameters (α, calibration
    /// text and token count, model): no calibration pass ran.
    FromPack,
}

/// What [`apply_smoothing`] gives: the smoothed in-memory GGUF, its model, the record for the
/// pack and where the factors came from.
struct Smoothed {
    gguf: Arc<GgufFile>,
    model: Arc<Model>,
    record: ork_store::PackSmoothing,
    origin: SmoothingOrigin,
}

/// Fold `smooth` into `gguf`: the factors from the configured `.orkpack` when its smoothing
/// section was made with the same parameters, else from a calibration pass.
fn apply_smoothing(
    config: &EngineConfig,
    smooth: &Smoothing,
    gguf: &GgufFile,
    model: &Arc<Model>,
    tokenizer: &Tokenizer,
) -> Result<Smoothed, RuntimeError> {
    let bad = |what: String| RuntimeError::Calibration {
        path: smooth.calib.clone(),
        what,
    };
    let bytes = std::fs::read(&smooth.calib).map_err(|e| bad(e.to_string()))?;
    let calib_hash = ork_store::PackSmoothing::hash(&bytes);
    let text = String::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(bad("the file is empty".to_owned()));
    }
    let model_err = |source| RuntimeError::Model {
        model: config.model.clone(),
        source,
    };
    let mut tokens = tokenizer.encode(&text, true, false).map_err(model_err)?;
    tokens.truncate(CALIB_MAX_TOKENS);
    // The factors depend on every tensor of the model (norms included), so the parameters name
    // the model by all its tensors' fingerprints.
    let mut fps = Vec::with_capacity(gguf.tensors().len() * 8);
    for t in gguf.tensors() {
        fps.extend_from_slice(&ork_store::fingerprint(gguf, t).to_le_bytes());
    }
    let mut record = ork_store::PackSmoothing {
        alpha: smooth.alpha,
        calib_hash,
        calib_tokens: tokens.len() as u32,
        model_fingerprint: ork_store::PackSmoothing::hash(&fps),
        v_to_o: smooth.targets.v_to_o,
        up_to_down: smooth.targets.up_to_down,
        blocks: Vec::new(),
    };
    let stored = config
        .pack_path()
        .and_then(|p| ork_store::Orkpack::open(&p).ok())
        .and_then(|pack| pack.smoothing().cloned())
        .filter(|s| s.same_parameters(&record) && s.blocks.len() == model.config().n_layer);
    let (factors, origin) = match stored {
        Some(s) => (
            s.blocks
                .into_iter()
                .map(|b| ork_exec::BlockSmoothing {
                    attn: b.attn,
                    ffn: b.ffn,
                    vo: b.vo,
                    down: b.down,
                })
                .collect::<Vec<_>>(),
            SmoothingOrigin::FromPack,
        ),
        None => {
            let reference = Arc::new(
                ork_exec::CpuF32Linear::from_gguf(gguf, model.matmul_weights())
                    .map_err(model_err)?,
            );
            let f = ork_exec::smoothing_factors(
                model,
                &reference,
                &tokens,
                CALIB_CTX,
                smooth.alpha,
                smooth.targets,
            )
            .map_err(model_err)?;
            (f, SmoothingOrigin::Calibrated)
        }
    };
    record.blocks = factors
        .iter()
        .map(|b| ork_store::SmoothedBlock {
            attn: b.attn.clone(),
            ffn: b.ffn.clone(),
            vo: b.vo.clone(),
            down: b.down.clone(),
        })
        .collect();
    let label = config
        .model
        .with_extension(format!("smooth-{}-{}.gguf", smooth.alpha, smooth.targets));
    let file = Arc::new(ork_exec::smoothed_gguf(gguf, model, &factors, label).map_err(model_err)?);
    let smoothed = Arc::new(Model::load(&file).map_err(model_err)?);
    Ok(Smoothed {
        gguf: file,
        model: smoothed,
        record,
        origin,
    })
}

/// A draft that lives on the device beside the model (speculative decoding,
/// `docs/speculative.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSource {
    /// The model's own first blocks and its output projection (an early exit), pinned in the
    /// model's weight cache, which the model's passes use too; `None` chooses the number of
    /// blocks: as many as fit beside the model's streaming working set, at most a quarter of
    /// them.
    SelfLayers(Option<usize>),
    /// A second, smaller GGUF with the model's vocabulary, packed at open into a cache of its
    /// own on the same device and budget, every weight pinned.
    Model(PathBuf),
}

impl EngineConfig {
    /// Defaults for `model`: default `.orkpack`, budget from the environment, auto device, one
    /// domain, int8 weights and activations, prefetch and verification on, no trace.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model: model.into(),
            pack: PackChoice::Default,
            budget_bytes: None,
            device: DeviceKind::Auto,
            domains: 1,
            soc: ork_device::Soc::Rk3588,
            dtype: PackDtype::I8,
            activations: ActPrecision::Int8,
            group: ork_pack::ScaleGroup::PerChannel,
            threads: None,
            prefetch: true,
            trace: false,
            verify: true,
            evict_src: false,
            draft: None,
            expert_speculation: Some(1),
            smooth: None,
            kv_cache: KvType::F16,
        }
    }

    /// Use the quantization mode `quant` (weight dtype, activation precision, scale groups).
    pub fn set_quant(&mut self, quant: Quant) {
        let (dtype, activations, group) = quant.parts();
        self.dtype = dtype;
        self.activations = activations;
        self.group = group;
    }

    /// The quantization mode the config's dtype, activations and group make, if it is one of
    /// [`Quant`]'s.
    pub fn quant(&self) -> Option<Quant> {
        Quant::ALL
            .iter()
            .copied()
            .find(|q| q.parts() == (self.dtype, self.activations, self.group))
    }

    /// The `.orkpack` path this config uses, if any.
    pub fn pack_path(&self) -> Option<PathBuf> {
        match &self.pack {
            PackChoice::None => None,
            PackChoice::Path(p) => Some(p.clone()),
            PackChoice::Default => std::env::var_os("ORK_PERSIST")
                .map(PathBuf::from)
                .or_else(|| Some(self.model.with_extension("orkpack"))),
        }
    }
}

/// Largest weight budget per domain accepted, in MiB (16 TiB: far above any window, small
/// enough that MiB → bytes cannot overflow).
pub const MAX_BUDGET_MIB: u64 = 1 << 24;

/// The budget in bytes per domain: `flag_bytes`, else `ORK_WCACHE_BUDGET_MB` (a whole number of
/// MiB in 1..=[`MAX_BUDGET_MIB`]), else [`DEFAULT_BUDGET_MB`]; at least 1 MiB. Refused, never
/// clamped.
pub fn budget_bytes(flag_bytes: Option<u64>) -> Result<u64, RuntimeError> {
    let bytes = match flag_bytes {
        Some(b) => b,
        None => match std::env::var("ORK_WCACHE_BUDGET_MB") {
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(mb) if (1..=MAX_BUDGET_MIB).contains(&mb) => mb << 20,
                _ => {
                    return Err(RuntimeError::Budget {
                        what: format!(
                            "ORK_WCACHE_BUDGET_MB={v:?}: expected a whole number of MiB in \
                             1..={MAX_BUDGET_MIB}"
                        ),
                    })
                }
            },
            Err(_) => DEFAULT_BUDGET_MB << 20,
        },
    };
    if !((1 << 20)..=(MAX_BUDGET_MIB << 20)).contains(&bytes) {
        return Err(RuntimeError::Budget {
            what: format!("the weight budget must be 1..={MAX_BUDGET_MIB} MiB"),
        });
    }
    Ok(bytes)
}

/// Open the device backend `kind` with `domains` IOMMU domains, through the device layer's one
/// [`ork_device::open`] (its `auto` policy: an NPU backend that opens and can compute, else the
/// emulator, which says why in its name).
pub fn open_device(
    kind: DeviceKind,
    domains: u32,
    soc: ork_device::Soc,
) -> Result<Arc<dyn Device>, RuntimeError> {
    let options = ork_device::OpenOptions::new().domains(domains).soc(soc);
    ork_device::open(kind, &options).map_err(|e| RuntimeError::Device {
        what: "opening the device".to_owned(),
        source: Some(e),
    })
}

/// Refuse, before anything is converted or allocated, a precision the chip has no matmul type
/// for (the device would refuse every task later): every weight is checked as the device will
/// see it (per-channel scales; its K and N limits are the split's business, not checked here).
pub fn check_chip(config: &EngineConfig, manifest: &Manifest) -> Result<(), RuntimeError> {
    use ork_device::{ElemType, MatmulShape};
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice).map_err(|source| RuntimeError::Plan {
            model: manifest.file().to_path_buf(),
            source,
        })?;
        let (dtype, group) = ork_store::weight_quant(&w.key, config.dtype, config.group);
        let shape = MatmulShape {
            a: ElemType::of_activations(config.activations),
            b: ElemType::of_weight(dtype),
            k,
            n,
            group: ork_store::effective_group(group, dtype, k),
        };
        let quant = config.quant().map_or_else(
            || {
                format!(
                    "--dtype {} --act {}",
                    config.dtype.name(),
                    config.activations.name()
                )
            },
            |q| format!("--quant {q}"),
        );
        if let Err(source) = config.soc.check_types(&shape) {
            if let (
                ork_device::DeviceError::Chip {
                    limit: ork_device::ChipLimit::Group { .. },
                    ..
                },
                Some(g),
            ) = (&source, shape.group.size())
            {
                return Err(RuntimeError::Chip {
                    model: config.model.clone(),
                    hint: format!(
                        "{quant}: the {} has no {}-weight group of {g} with {} activations \
                         (w8a8 groups: 128, 256, 512; w4a16 groups on the RK3576: 32, 64, 128); \
                         see docs/chip.md",
                        config.soc,
                        config.dtype.name(),
                        config.activations.name()
                    ),
                    source,
                });
            }
            let hint = match (config.activations, config.dtype) {
                (ActPrecision::F16, PackDtype::I8 | PackDtype::I4) => format!(
                    "the {} has no fp16 × int{} matmul (no w{}a16): use --act i8 (w8a8), \
                     --dtype f16 --act f16, or --soc rk3576 for a chip that has it",
                    config.soc,
                    if config.dtype == PackDtype::I8 { 8 } else { 4 },
                    if config.dtype == PackDtype::I8 { 8 } else { 4 },
                ),
                (ActPrecision::Int8, PackDtype::I4) => format!(
                    "the {} has no int8 × int4 matmul: use --dtype i8 (w8a8), or --soc rk3576",
                    config.soc
                ),
                (ActPrecision::Int8, PackDtype::F16) => {
                    "no chip has int8 × fp16: use --act f16 with --dtype f16".to_owned()
                }
                _ => "see docs/chip.md for the chip's matmul types".to_owned(),
            };
            return Err(RuntimeError::Chip {
                model: config.model.clone(),
                hint: format!("{quant}: {hint}"),
                source,
            });
        }
    }
    Ok(())
}

/// Prefetch slots of the default emulated device (`cores + 1`), for planning without a device.
pub fn default_slots() -> usize {
    EmuConfig::default().cores as usize + 1
}

/// Plan `manifest`'s weights (execution order, device bytes at `dtype`, or what
/// [`ork_store::weight_quant`] makes of it with `group`) for a budget and window per domain,
/// `domains` domains and `slots` prefetch slots.
pub fn plan_weights(
    manifest: &Manifest,
    dtype: PackDtype,
    group: ork_pack::ScaleGroup,
    budget: u64,
    window: u64,
    domains: u32,
    slots: usize,
) -> Result<Plan, RuntimeError> {
    Ok(ork_residency::plan(&PlanInput {
        weights: weight_bytes(manifest, dtype, group)?,
        budget_bytes: budget,
        window_bytes: window,
        domains,
        slots,
    }))
}

/// Device bytes of every matmul weight of `manifest` at `dtype`, in execution order.
fn weight_bytes(
    manifest: &Manifest,
    dtype: PackDtype,
    group: ork_pack::ScaleGroup,
) -> Result<Vec<(String, u64)>, RuntimeError> {
    let mut weights = Vec::new();
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice).map_err(|source| RuntimeError::Plan {
            model: manifest.file().to_path_buf(),
            source,
        })?;
        weights.push((
            w.key.clone(),
            device_bytes(&ork_pack::TiledLayout::new(
                ork_store::weight_quant(&w.key, dtype, group).0,
                k,
                n,
            )),
        ));
    }
    Ok(weights)
}

/// The executor's matmul interface served by the device through the weight cache.
pub struct EngineLinear {
    dm: DeviceMatmul,
    /// MoE expert matmuls, and how many found their expert already in the cache.
    expert_calls: AtomicU64,
    expert_hits: AtomicU64,
}

/// Expert figures of a MoE run (see docs/moe.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Expert matmuls computed.
    pub expert_matmuls: u64,
    /// Of those, how many found their expert resident (pinned, cached or prefetched in time).
    pub expert_hits: u64,
    /// `expert_hits / expert_matmuls`.
    pub expert_hit_rate: f64,
    /// Experts predicted ahead by the speculative prefetch.
    pub predictions: u64,
    /// Predicted ∩ used / used, over the decode steps that had a prediction.
    pub recall: Option<f64>,
}

impl EngineLinear {
    fn new(dm: DeviceMatmul) -> EngineLinear {
        EngineLinear {
            dm,
            expert_calls: AtomicU64::new(0),
            expert_hits: AtomicU64::new(0),
        }
    }
}

impl EngineLinear {
    /// Count a call of `weight` if it is an expert slice, and a hit if it is resident now.
    fn count_expert(&self, weight: &str) {
        if ork_manifest::is_expert_key(weight) {
            self.expert_calls.fetch_add(1, Ordering::Relaxed);
            if self.dm.cache().is_resident(weight) {
                self.expert_hits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Linear for EngineLinear {
    fn matmul(&self, weight: &str, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.count_expert(weight);
        self.dm
            .matmul(weight, x, m, y)
            .map_err(|e| ExecError::Backend {
                weight: weight.to_owned(),
                source: Box::new(e),
            })
    }

    /// Served by [`DeviceMatmul::matmul_many`]: one quantization of `x`, one device batch for
    /// the weights that are resident.
    fn matmul_many(
        &self,
        weights: &[&str],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        for w in weights {
            self.count_expert(w);
        }
        self.dm
            .matmul_many(weights, x, m, ys)
            .map_err(|e| ExecError::Backend {
                weight: weights.join(","),
                source: Box::new(e),
            })
    }

    /// Forwarded to the prefetcher, which serves announced weights before the plan order.
    fn upcoming(&self, weights: &[&str]) {
        self.dm.upcoming(weights);
    }

    /// Kept by the device matmul's board-clock recorder, if any (`docs/board-model.md`).
    fn record(&self, event: ork_board::Event) {
        self.dm.record(event);
    }
}

impl EngineLinear {
    /// The device matmul behind it.
    pub fn device_matmul(&self) -> &DeviceMatmul {
        &self.dm
    }
}

/// A model opened on a device: see the crate documentation.
pub struct Engine {
    config: EngineConfig,
    gguf: Arc<GgufFile>,
    manifest: Arc<Manifest>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    device: Arc<dyn Device>,
    plan: Plan,
    cache: Arc<WeightCache>,
    device_budget: Arc<DeviceBudget>,
    linear: Arc<EngineLinear>,
    trace: Option<Arc<Trace>>,
    convert: Option<ConvertReport>,
    pack_path: Option<PathBuf>,
    pack_unwritable: Option<ork_store::StoreError>,
    draft: Option<EngineDraft>,
    smoothing_origin: Option<SmoothingOrigin>,
}

/// The draft an engine keeps beside its model ([`EngineConfig::draft`]).
pub struct EngineDraft {
    source: DraftSource,
    label: String,
    model: Arc<Model>,
    linear: Arc<dyn Linear>,
    cache: Option<Arc<WeightCache>>,
    bytes: u64,
    kv_cache: KvType,
}

impl std::fmt::Debug for EngineDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineDraft")
            .field("draft", &self.label)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl EngineDraft {
    /// What the draft is: `self:N` (the model's first N blocks and output projection) or the
    /// draft model's file.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The source it was opened from (with the number of blocks chosen, for a self draft).
    pub fn source(&self) -> &DraftSource {
        &self.source
    }

    /// The draft's model (for a self draft, the truncated model).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Device bytes the draft keeps resident, taken from the budget.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The draft model's own cache (`None` for a self draft, whose weights are pinned in the
    /// model's cache).
    pub fn cache(&self) -> Option<&Arc<WeightCache>> {
        self.cache.as_ref()
    }

    /// A new session of the draft (owned, as [`Engine::session`]).
    pub fn session(&self) -> Session {
        Session::new(Arc::clone(&self.model), Arc::clone(&self.linear)).with_kv_type(self.kv_cache)
    }
}

/// A draft model read and checked, before the plan.
struct LoadedDraft {
    path: PathBuf,
    gguf: Arc<GgufFile>,
    model: Arc<Model>,
    weights: Vec<(String, u64)>,
}

fn load_draft_model(
    path: &std::path::Path,
    config: &EngineConfig,
    tokenizer: &Tokenizer,
) -> Result<LoadedDraft, RuntimeError> {
    let err = |source: ExecError| RuntimeError::DraftModel {
        draft: path.to_path_buf(),
        source,
    };
    let gguf = Arc::new(GgufFile::open(path).map_err(|e| err(e.into()))?);
    let model = Arc::new(Model::load(&gguf).map_err(err)?);
    let draft_tokenizer = Tokenizer::from_gguf(&gguf).map_err(err)?;
    ork_exec::check_draft_vocabulary(tokenizer, &draft_tokenizer, &path.display().to_string())
        .map_err(err)?;
    let manifest = Manifest::from_gguf(&gguf)?;
    check_chip(config, &manifest)?;
    let weights = weight_bytes(&manifest, config.dtype, config.group)?;
    Ok(LoadedDraft {
        path: path.to_path_buf(),
        gguf,
        model,
        weights,
    })
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("mode", &self.plan.mode)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Open the model of `config` (see the crate documentation).
    ///
    /// # Errors
    /// Any failure to open, check, plan, convert or place the model, naming the file and tensor.
    pub fn open(config: EngineConfig) -> Result<Engine, RuntimeError> {
        Self::open_observed(config, None)
    }

    /// [`Engine::open`], telling `observer` about the `.orkpack` conversion.
    pub fn open_observed(
        config: EngineConfig,
        observer: Option<&dyn ConvertObserver>,
    ) -> Result<Engine, RuntimeError> {
        Engine::load(config)?.open(observer)
    }

    /// The first half of [`Engine::open`]: read and check the model, its tokenizer and its weight
    /// manifest, without opening a device or touching the `.orkpack`, so that a front end can
    /// refuse a request (a prompt longer than the context …) before a conversion that may take
    /// minutes on a large model.
    ///
    /// # Errors
    /// The GGUF cannot be opened, or its model, tokenizer or manifest is not usable.
    pub fn load(config: EngineConfig) -> Result<LoadedModel, RuntimeError> {
        if let Some(n) = config.threads {
            // Before anything here runs in parallel: the first use of rayon's global pool
            // (loading the model uses it) builds it with one thread per core, and
            // `build_global` is then refused. The first call wins; later engines in the same
            // process share the pool ([`Engine::threads`] says how large it is).
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n.max(1))
                .build_global();
        }
        let gguf = Arc::new(GgufFile::open(&config.model)?);
        let model_err = |source| RuntimeError::Model {
            model: config.model.clone(),
            source,
        };
        let model = Arc::new(Model::load(&gguf).map_err(model_err)?);
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).map_err(model_err)?);
        let (gguf, model, smoothing) = match &config.smooth {
            Some(smooth) => {
                let s = apply_smoothing(&config, smooth, &gguf, &model, &tokenizer)?;
                (s.gguf, s.model, Some((s.record, s.origin)))
            }
            None => (gguf, model, None),
        };
        let manifest = Arc::new(Manifest::from_gguf(&gguf)?);
        Ok(LoadedModel {
            config,
            gguf,
            model,
            tokenizer,
            manifest,
            smoothing,
        })
    }
}

/// A model read and checked by [`Engine::load`], not yet on a device.
pub struct LoadedModel {
    config: EngineConfig,
    gguf: Arc<GgufFile>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    manifest: Arc<Manifest>,
    smoothing: Option<(ork_store::PackSmoothing, SmoothingOrigin)>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// What the weights were smoothed with (recorded in the `.orkpack`), `None` without
    /// smoothing.
    pub fn smoothing(&self) -> Option<&ork_store::PackSmoothing> {
        self.smoothing.as_ref().map(|s| &s.0)
    }

    /// Where the smoothing factors came from, `None` without smoothing.
    pub fn smoothing_origin(&self) -> Option<SmoothingOrigin> {
        self.smoothing.as_ref().map(|s| s.1)
    }

    /// The GGUF the weights come from (the smoothed in-memory copy when the config smooths).
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's chat template, if it has one.
    ///
    /// # Errors
    /// A template that does not parse, naming the file.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, RuntimeError> {
        ChatTemplate::from_gguf(&self.gguf, &self.tokenizer).map_err(|source| RuntimeError::Model {
            model: self.config.model.clone(),
            source,
        })
    }

    /// The second half of [`Engine::open`]: the device, the plan, the `.orkpack` (converted if
    /// needed, telling `observer`), the cache and the prefetcher.
    ///
    /// # Errors
    /// Any failure to open the device, plan, convert or place the model, naming file and tensor.
    pub fn open(self, observer: Option<&dyn ConvertObserver>) -> Result<Engine, RuntimeError> {
        let LoadedModel {
            config,
            gguf,
            model,
            tokenizer,
            manifest,
            smoothing,
        } = self;
        check_chip(&config, &manifest)?;
        model.set_expert_speculation(config.expert_speculation);
        let device = open_device(config.device, config.domains, config.soc)?;
        let info = device.info();
        let budget = budget_bytes(config.budget_bytes)?;
        let slots = info.cores as usize + 1;
        let all = weight_bytes(&manifest, config.dtype, config.group)?;
        let capacity = budget.min(info.window_bytes);
        let model_err = |source| RuntimeError::Model {
            model: config.model.clone(),
            source,
        };
        // The draft's resident weights come out of the budget before the model is planned.
        let mut draft_model = None;
        let mut self_layers = None;
        let mut draft_names = std::collections::HashSet::new();
        let mut draft_bytes = 0u64;
        match &config.draft {
            None => {}
            Some(DraftSource::Model(path)) => {
                let d = load_draft_model(path, &config, &tokenizer)?;
                draft_bytes = d.weights.iter().map(|w| w.1).sum();
                draft_model = Some(d);
            }
            Some(DraftSource::SelfLayers(n)) => {
                let names_for =
                    |n: usize| -> Result<std::collections::HashSet<String>, RuntimeError> {
                        Ok(model
                            .truncated(n)
                            .map_err(model_err)?
                            .matmul_weights()
                            .iter()
                            .map(|w| w.name.clone())
                            .collect())
                    };
                let bytes_of = |set: &std::collections::HashSet<String>| -> u64 {
                    all.iter().filter(|w| set.contains(&w.0)).map(|w| w.1).sum()
                };
                let n = match n {
                    Some(n) => *n,
                    None => {
                        // As many blocks as fit beside the model's streaming working set (the
                        // planner's `slots + 1` largest remaining weights), at most a quarter.
                        let mut best = 1;
                        for cand in 1..=(model.config().n_layer / 4).max(1) {
                            let set = names_for(cand)?;
                            let mut rest: Vec<u64> = all
                                .iter()
                                .filter(|w| !set.contains(&w.0))
                                .map(|w| w.1)
                                .collect();
                            rest.sort_unstable_by(|a, b| b.cmp(a));
                            let reserve: u64 = rest.iter().take(slots + 1).sum();
                            if bytes_of(&set) + reserve > capacity {
                                break;
                            }
                            best = cand;
                        }
                        best
                    }
                };
                draft_names = names_for(n)?;
                draft_bytes = bytes_of(&draft_names);
                self_layers = Some(n);
            }
        }
        let rest: Vec<(String, u64)> = all
            .iter()
            .filter(|w| !draft_names.contains(&w.0))
            .cloned()
            .collect();
        if draft_bytes > 0 {
            let largest = rest.iter().map(|w| w.1).max().unwrap_or(0);
            if draft_bytes + largest > capacity {
                let mib = |b: u64| b as f64 / (1 << 20) as f64;
                return Err(RuntimeError::DraftTooLarge {
                    model: config.model.clone(),
                    draft: match (&draft_model, self_layers) {
                        (Some(d), _) => d.path.display().to_string(),
                        (None, n) => format!("self:{}", n.unwrap_or(0)),
                    },
                    draft_mib: mib(draft_bytes),
                    model_min_mib: mib(largest),
                    budget_mib: budget >> 20,
                    need_mib: (draft_bytes + largest).div_ceil(1 << 20),
                });
            }
        }
        let mut plan = ork_residency::plan(&PlanInput {
            weights: rest,
            budget_bytes: budget - draft_bytes,
            window_bytes: info.window_bytes.saturating_sub(draft_bytes),
            domains: info.domains,
            slots,
        });
        if !draft_names.is_empty() {
            // A self draft's weights are the model's own: pinned in domain 0, in execution order.
            let mut planned = std::mem::take(&mut plan.placement).into_iter();
            for (name, bytes) in &all {
                if draft_names.contains(name) {
                    plan.placement.push(ork_residency::Placement {
                        name: name.clone(),
                        bytes: *bytes,
                        domain: 0,
                        resident: true,
                    });
                } else if let Some(p) = planned.next() {
                    plan.placement.push(p);
                }
            }
            plan.model_bytes += draft_bytes;
            plan.resident_bytes += draft_bytes;
        }
        if !plan.runnable {
            return Err(RuntimeError::BudgetTooSmall {
                model: config.model.clone(),
                budget_mib: budget >> 20,
                weight: plan.largest.0.clone(),
                weight_mib: plan.largest.1 as f64 / (1 << 20) as f64,
                min_mib: plan.min_budget_bytes.div_ceil(1 << 20),
            });
        }
        let mut pack_path = config.pack_path();
        let mut pack_unwritable = None;
        let (source, convert) = match &pack_path {
            Some(path) => {
                let mut copts = ConvertOptions::new(config.dtype);
                copts.group = config.group;
                copts.target = Some(config.soc.name());
                copts.verify = config.verify;
                copts.evict_src = config.evict_src;
                copts.threads = config.threads;
                copts.manifest = Some(&manifest);
                copts.smoothing = smoothing.as_ref().map(|s| &s.0);
                let progress = |p: &ork_store::Progress<'_>| {
                    if let Some(o) = observer {
                        o.tensor_done(p);
                    }
                };
                copts.progress = Some(&progress);
                if let Some(o) = observer {
                    o.started(&manifest);
                }
                let result = ork_store::ensure(&gguf, path, &copts);
                if let Some(o) = observer {
                    o.finished();
                }
                match result {
                    Ok((pack, report)) => (
                        WeightSource::Pack {
                            pack,
                            model: Some(Arc::clone(&gguf)),
                            verify: config.verify,
                        },
                        Some(report),
                    ),
                    // The pack cannot be written (read-only directory, full disk): run from
                    // memory, as without a pack, and say so (`Engine::pack_unwritable`).
                    Err(e) if e.is_write_failure() => {
                        pack_unwritable = Some(e);
                        (
                            WeightSource::Gguf {
                                model: Arc::clone(&gguf),
                                dtype: config.dtype,
                                group: config.group,
                            },
                            None,
                        )
                    }
                    Err(source) => {
                        return Err(RuntimeError::Pack {
                            path: path.clone(),
                            source,
                        })
                    }
                }
            }
            None => (
                WeightSource::Gguf {
                    model: Arc::clone(&gguf),
                    dtype: config.dtype,
                    group: config.group,
                },
                None,
            ),
        };
        if pack_unwritable.is_some() {
            pack_path = None;
        }
        let cache_config = CacheConfig {
            domains: info.domains,
            ..CacheConfig::new(budget)
        };
        // The device's one budget: a second cache on this device (a draft model, an expert
        // cache) books its weights in the same ledger.
        let device_budget = DeviceBudget::new(budget, info.domains);
        let cache = WeightCache::with_budget(
            Arc::clone(&device),
            source,
            cache_config,
            Arc::clone(&device_budget),
        )?
        .with_placement(domain_map(&plan));
        // MoE: streamed experts are evicted by block order (the block just computed first), not
        // LRU, which would evict the experts of the blocks about to run (docs/moe.md).
        let cache = if manifest.n_expert() > 0 {
            cache.with_policy(Box::new(LayerOrder {
                n_layer: model.config().n_layer,
            }))
        } else {
            cache
        };
        for p in plan.pinned() {
            cache.pin(&p.name)?;
        }
        let cache = Arc::new(cache);
        device_budget.register(&cache);
        let trace = config.trace.then(|| Arc::new(Trace::new()));
        // Experts are not in the static order: a token uses only those its router picks, and
        // the executor announces them (Linear::upcoming) once the router has run.
        let schedule = (config.prefetch && plan.mode == Mode::Streamed).then(|| {
            (
                plan.placement
                    .iter()
                    .filter(|p| !ork_manifest::is_expert_key(&p.name))
                    .map(|p| p.name.clone())
                    .collect::<Vec<_>>(),
                slots,
            )
        });
        cache.set_trace(trace.clone());
        let mut dm =
            DeviceMatmul::new(Arc::clone(&cache), schedule).with_activations(config.activations);
        if let Some(t) = &trace {
            dm = dm.with_trace(Arc::clone(t));
        }
        // Resident: the first pass's loads run on a thread of their own, ahead of compute,
        // instead of one by one on the compute path (`ork_residency::Warmup`).
        if config.prefetch && plan.mode == Mode::Resident {
            dm = dm.with_warmup(plan.placement.iter().map(|p| p.name.clone()).collect());
        }
        let linear = Arc::new(EngineLinear::new(dm));
        let draft = match (draft_model, self_layers) {
            (Some(d), _) => {
                let dcache = WeightCache::with_budget(
                    Arc::clone(&device),
                    WeightSource::Gguf {
                        model: Arc::clone(&d.gguf),
                        dtype: config.dtype,
                        group: config.group,
                    },
                    CacheConfig {
                        domains: info.domains,
                        ..CacheConfig::new(budget)
                    },
                    Arc::clone(&device_budget),
                )?;
                for (name, _) in &d.weights {
                    dcache.pin(name)?;
                }
                let dcache = Arc::new(dcache);
                device_budget.register(&dcache);
                // Pack every draft weight now: no pass waits for one later.
                for (name, _) in &d.weights {
                    drop(dcache.get(name)?);
                }
                let dm = DeviceMatmul::new(Arc::clone(&dcache), None)
                    .with_activations(config.activations);
                Some(EngineDraft {
                    label: d.path.display().to_string(),
                    source: DraftSource::Model(d.path),
                    model: d.model,
                    linear: Arc::new(EngineLinear::new(dm)),
                    cache: Some(dcache),
                    bytes: draft_bytes,
                    kv_cache: config.kv_cache,
                })
            }
            (None, Some(n)) => Some(EngineDraft {
                source: DraftSource::SelfLayers(Some(n)),
                label: format!("self:{n}"),
                model: Arc::new(model.truncated(n).map_err(model_err)?),
                linear: Arc::clone(&linear) as Arc<dyn Linear>,
                cache: None,
                bytes: draft_bytes,
                kv_cache: config.kv_cache,
            }),
            (None, None) => None,
        };
        Ok(Engine {
            config,
            gguf,
            manifest,
            model,
            tokenizer,
            device,
            plan,
            cache,
            device_budget,
            linear,
            trace,
            convert,
            pack_path,
            pack_unwritable,
            draft,
            smoothing_origin: smoothing.map(|s| s.1),
        })
    }
}

impl Engine {
    /// The configuration it was opened with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The GGUF file.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// The model's weight manifest.
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's chat template, if it has one.
    ///
    /// # Errors
    /// A template that does not parse, naming the file.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, RuntimeError> {
        ChatTemplate::from_gguf(&self.gguf, &self.tokenizer).map_err(|source| RuntimeError::Model {
            model: self.config.model.clone(),
            source,
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }
    /// Compute threads: the size of rayon's global pool, which the forward pass runs on
    /// ([`EngineConfig::threads`] sizes it when the first engine of the process loads).
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    /// The residency plan in force.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The weight cache.
    pub fn cache(&self) -> &Arc<WeightCache> {
        &self.cache
    }

    /// The device's byte budget per domain, shared by every cache on it.
    pub fn device_budget(&self) -> &Arc<DeviceBudget> {
        &self.device_budget
    }

    /// MoE models: expert cache hits and speculative prefetch counters so far, summed over the
    /// engine's sessions (`None` for a dense model).
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        let moe = self.model.moe_stats()?;
        let calls = self.linear.expert_calls.load(Ordering::Relaxed);
        let hits = self.linear.expert_hits.load(Ordering::Relaxed);
        Some(ExpertStats {
            expert_matmuls: calls,
            expert_hits: hits,
            expert_hit_rate: if calls == 0 {
                0.0
            } else {
                hits as f64 / calls as f64
            },
            predictions: moe.predictions,
            recall: moe.recall(),
        })
    }

    /// The cache's counters so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Where the smoothing factors came from (a calibration pass, or the `.orkpack`), `None`
    /// without smoothing.
    pub fn smoothing_origin(&self) -> Option<SmoothingOrigin> {
        self.smoothing_origin
    }

    /// What the self-populating `.orkpack` did at open (`None` without a pack).
    pub fn convert_report(&self) -> Option<&ConvertReport> {
        self.convert.as_ref()
    }

    /// Why the configured `.orkpack` could not be written, when the engine runs from memory
    /// instead (read-only directory, full disk …); `None` when the pack is in use or none was
    /// asked for.
    pub fn pack_unwritable(&self) -> Option<&ork_store::StoreError> {
        self.pack_unwritable.as_ref()
    }

    /// The `.orkpack` in use, if any.
    pub fn pack_path(&self) -> Option<&PathBuf> {
        self.pack_path.as_ref()
    }

    /// The timeline, when the config asked for one.
    pub fn trace(&self) -> Option<&Arc<Trace>> {
        self.trace.as_ref()
    }

    /// The draft kept beside the model, when the config asked for one.
    pub fn draft(&self) -> Option<&EngineDraft> {
        self.draft.as_ref()
    }

    /// The matmul backend sessions use.
    pub fn linear(&self) -> &Arc<EngineLinear> {
        &self.linear
    }

    /// Activation precision of the device matmuls.
    pub fn activations(&self) -> ActPrecision {
        self.config.activations
    }

    /// A new session over the model's trained context.
    ///
    /// The session owns `Arc`s of the engine's model and matmul backend (and, through the
    /// backend, of the weight cache, the device and the prefetcher): it is `Send + 'static`, can
    /// run on another thread or task, and keeps those pieces alive after the engine is dropped.
    pub fn session(&self) -> Session {
        Session::new(Arc::clone(&self.model), self.shared_linear())
            .with_kv_type(self.config.kv_cache)
    }

    /// A new session with an explicit context length (owned, as [`Engine::session`]).
    ///
    /// # Errors
    /// A context of 0.
    pub fn session_with_context(&self, context: usize) -> Result<Session, ExecError> {
        Ok(
            Session::with_context(Arc::clone(&self.model), self.shared_linear(), context)?
                .with_kv_type(self.config.kv_cache),
        )
    }

    /// The matmul backend as the executor holds it.
    pub fn shared_linear(&self) -> Arc<dyn Linear> {
        Arc::clone(&self.linear) as Arc<dyn Linear>
    }

    /// Stop the prefetcher and drop the device state, keeping the trace (complete once the
    /// engine is closed). Sessions still alive keep the matmul backend, and with it the
    /// prefetcher and the cache, until the last of them is dropped.
    pub fn close(self) -> Option<Arc<Trace>> {
        let Engine { trace, linear, .. } = self;
        drop(linear);
        trace
    }
}
