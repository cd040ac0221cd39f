//! ork — the **CPU engine** (`--device cpu`): every matmul computed on the CPU straight from
//! the GGUF's mapped blocks, at the file's own bits (`docs/cpu.md`).
//!
//! - [`GgufLinear`] is an [`ork_exec::Linear`]: per [`ork_manifest::WeightId`] it knows the
//!   weight's bytes in the map (an MoE expert's slice: that expert's rows only), its
//!   [`WeightType`] and the [`Kernel`] for it, all checked when it opens. No weight is copied,
//!   dequantized or packed; the weights stay file-backed pages shared with the page cache.
//! - [`CpuPool`]: the persistent worker threads a matmul's rows are shared among.
//! - MoE experts are read ahead into the page cache as the executor announces them, and the
//!   most-routed ones kept locked in RAM within a pin budget ([`ExpertReadOptions`]; the
//!   `mlock` calls are this crate's only unsafe code, in one small module).
//! - [`topology`]: which cores to run on (the big cores of a big.LITTLE chip by default).
//!
//! The layer sits beside the device backends (`ork-device`, `ork-residency`) and below the
//! runtime, which opens it instead of a device for `--device cpu`.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

mod error;
mod linear;
#[allow(unsafe_code)]
mod lock;
mod pool;
mod readahead;
pub mod topology;

pub use error::CpuError;
pub use linear::{supported_types, weight_type, GgufLinear, TypeCount};
pub use ork_kernels::blocks::{Kernel, WeightType};
pub use pool::{allowed_cpus, CpuPool};
pub use readahead::{ExpertReadOptions, ExpertReadStats, REPIN_EVERY};
pub use topology::{CoreChoice, CoreSource, CpuOptions, Topology};
