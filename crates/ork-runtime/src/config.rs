//! What [`Engine::open`](crate::Engine::open) is told: the model, the pack, the budget, the
//! device, the quantization, the draft and the options of a run.

use std::path::PathBuf;

use ork_device::ActPrecision;
use ork_exec::KvType;
use ork_pack::PackDtype;

#[cfg(doc)]
use crate::Engine;
use crate::{DeviceKind, DraftSource, PhaseEngine, PhaseEngines, Quant, RuntimeError, Smoothing};

/// Default weight-cache budget per domain (MiB) when neither the config nor
/// `ORK_WCACHE_BUDGET_MB` gives one.
pub const DEFAULT_BUDGET_MB: u64 = 3072;

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

/// Which of the model's weights the device holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceWeights {
    /// Every matmul weight (the `.orkpack`'s whole content).
    #[default]
    All,
    /// Only the dense (non-expert) weights: a decode row split after a CPU prefill
    /// (`--device auto`'s dense-only split, `ork_board::engines::NpuHolds::Dense`). A MoE's
    /// expert slices are planned, packed and loaded for the CPU engine alone, never for the
    /// device; a device phase that would compute them is refused when the engine opens. For a
    /// dense model, the same as [`DeviceWeights::All`].
    Dense,
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
    /// `Some`: the CPU engine (`--device cpu`, `docs/cpu.md`) computes every matmul from the
    /// GGUF's mapped blocks on these cores and threads; no device, `.orkpack` or weight cache is
    /// opened, so `device`, `pack`, `budget_bytes`, `domains`, `dtype`, `activations`, `group`,
    /// `prefetch`, `verify` and `evict_src` do not apply. `None`: the device computes. With
    /// [`EngineConfig::phases`], the CPU engine computes only the phases it is given, the device
    /// the others.
    pub cpu: Option<ork_cpu::CpuOptions>,
    /// Engines per phase (`--prefill-device`, `--decode-device`; `docs/architecture.md`):
    /// `Some` pairing of the device and the CPU engine (whose options `cpu` then gives, and
    /// which computes only its phase); `None`: one engine, as `cpu` says.
    pub phases: Option<PhaseEngines>,
    /// The RAM the device's weight source is decided against when the CPU engine computes a
    /// phase ([`crate::npu_weights`]; a board's, from `--board`); `None`: the host's.
    pub ram_bytes: Option<u64>,
    /// With a decode [`PhaseEngine::Split`]: the device's share of each dense weight's rows,
    /// one for all (`--split-rows F`) or the board clock's per weight (`--split-rows auto`;
    /// [`crate::SplitLinear`]).
    pub split_rows: Option<crate::SplitRows>,
    /// With a prefill [`PhaseEngine::Split`]: the same for the prefill's passes (the board
    /// clock's per-weight shares differ by phase: `ork_board::split::split_prefill`).
    pub prefill_split_rows: Option<crate::SplitRows>,
    /// Which weights the device holds ([`DeviceWeights::All`] unless a dense-only split asks).
    pub device_weights: DeviceWeights,
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
            cpu: None,
            phases: None,
            ram_bytes: None,
            split_rows: None,
            prefill_split_rows: None,
            device_weights: DeviceWeights::All,
        }
    }

    /// The engine of each phase: [`EngineConfig::phases`], else the CPU engine for both when
    /// [`EngineConfig::cpu`] is set, else the device for both.
    pub fn engines(&self) -> PhaseEngines {
        match (self.phases, &self.cpu) {
            (Some(p), _) => p,
            (None, Some(_)) => PhaseEngines::one(PhaseEngine::Cpu),
            (None, None) => PhaseEngines::one(PhaseEngine::Device),
        }
    }

    /// Whether the device computes any phase (a device, a plan, a weight cache are opened).
    pub fn uses_device(&self) -> bool {
        self.engines().uses(PhaseEngine::Device)
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
