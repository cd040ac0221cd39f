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
//!
//! # Where things are
//! [`Engine::load`] and [`LoadedModel::open`] (`engine.rs`) read as the steps of opening an
//! engine; each step lives in the module that owns it:
//!
//! | module | concern |
//! |---|---|
//! | `config` | [`EngineConfig`], [`PackChoice`], the budget ([`budget_bytes`]) |
//! | `quant` | [`Quant`]: the quantization modes and their names |
//! | `chip` | [`check_chip`]: precisions the chip has no matmul for, refused up front |
//! | `device` | [`open_device`] |
//! | `smoothing` | [`Smoothing`]: calibration, or the factors the `.orkpack` holds |
//! | `plan` | device bytes per weight, the plan beside the draft ([`plan_weights`]) |
//! | `pack` | the self-populating `.orkpack` ([`ConvertObserver`]) |
//! | `cache` | the weight cache, the device matmul, prefetch and warmup |
//! | `linear` | [`EngineLinear`]: the executor's matmuls served by the device ([`ExpertStats`]) |
//! | `phase` | [`PhaseLinear`]: engines per phase, the device and the CPU engine in one session |
//! | `split` | [`SplitLinear`]: the decode row split, each matmul's rows on both engines at once |
//! | `draft` | [`DraftKind`], [`DraftSource`], [`EngineDraft`]: the speculative draft and its budget share |
//! | `engine` | [`Engine`], [`LoadedModel`] and what an engine reports |
//! | `session` | [`Session`]s handed out by an engine |
//! | `error` | [`RuntimeError`] |
//! | [`mod@bench`] | benchmark drivers returning typed reports (`ork bench cpu`) |
//! | [`doctor`] | the install check (`ork doctor`) |
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bench;
pub mod doctor;
mod validate;
pub use validate::{check_weights, CALIB_MIN_TOKENS};

#[cfg(doc)]
use {
    ork_exec::{Linear, Model, Session, Tokenizer},
    ork_manifest::Manifest,
    ork_residency::{DeviceMatmul, Plan, WeightCache},
};

mod cache;
mod chip;
mod config;
mod device;
mod draft;
mod engine;
mod error;
mod identity;
mod linear;
mod pack;
mod phase;
mod plan;
mod quant;
mod session;
mod smoothing;
mod split;

pub use chip::check_chip;
pub use config::{
    budget_bytes, DeviceWeights, EngineConfig, PackChoice, DEFAULT_BUDGET_MB, MAX_BUDGET_MIB,
};
pub use device::open_device;
pub use draft::{bytes_moved, DraftKind, DraftSource, EngineDraft};
pub use engine::{Engine, LoadedModel};
pub use error::RuntimeError;
pub use linear::{EngineLinear, ExpertStats};
pub use pack::ConvertObserver;
pub use phase::{
    host_ram_bytes, npu_weights, NpuWeightSource, NpuWeights, PhaseEngine, PhaseEngines,
    PhaseLinear,
};
pub use plan::{default_slots, plan_dense_weights, plan_weights};
pub use quant::Quant;
pub use smoothing::{Smoothing, SmoothingOrigin, CALIB_CTX, CALIB_MAX_TOKENS};
pub use split::{split_row, SplitLinear, SplitRows, SplitStats};

pub use ork_exec::KvType;

/// Which device backend to open (the device layer's choice and its one `auto` policy, see
/// `docs/device.md`).
pub use ork_device::DeviceKind;
