//! ork layer 5 — **residency**: which packed weights live on the device, and when.
//!
//! - [`WeightCache`]: a byte-budgeted LRU cache of device-resident weights, fed by a
//!   [`WeightSource`] (the `.orkpack`, or packing from the GGUF on the fly), with pinning and
//!   counters ([`CacheStats`]): hits, loads, packs, evictions, wall hits, bytes moved, peak.
//! - [`DeviceBudget`]: one byte budget per device and domain, shared by every cache on the
//!   device; the eviction choice is an [`EvictionPolicy`] ([`Lru`], or [`LayerOrder`] for
//!   MoE models' streamed experts).
//! - [`plan()`]: resident across IOMMU domains when the model fits them, else streamed.
//! - [`Prefetcher`]: a thread that fills the next slots of the schedule while the device
//!   computes; the schedule is a [`ScheduleSource`] (the plan order, [`PlanOrder`], with the
//!   weights the executor announces served first, [`Announced`]).
//! - [`DeviceMatmul`]: `y = x · Wᵀ` on the device, w8a8 or w8a16, by weight id in the cache
//!   ([`WeightCache::id`], resolved once) or by name ([`WeightKey`]).
//! - [`Trace`]: a Perfetto / Chrome trace of loads, computes and waits.
//! - The board clock's events (`ork_board::Recorder`, [`DeviceMatmul::set_events`]): matmuls and
//!   loads as they happen, replayed on a board's cost model (`docs/board-model.md`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod board;
mod budget;
mod cache;
mod error;
mod linear;
mod parts;
pub mod plan;
mod prefetch;
mod source;
mod trace;

pub use budget::{Candidate, DeviceBudget, EvictionPolicy, Incoming, LayerOrder, Lru};
pub use cache::{device_bytes, CacheConfig, CacheStats, WeightCache, WeightKey, WeightLease};
pub use error::ResidencyError;
pub use linear::{quantize_row_i8, DeviceMatmul};
pub use plan::{plan, Mode, Placement, Plan, PlanInput};
pub use prefetch::{Announced, PlanOrder, Prefetcher, ScheduleSource, Warmup};
pub use source::{Fetch, WeightSource};
pub use trace::{Lane, Trace, TraceEvent};

/// Cache keys (`.orkpack` entry names) of the model's matmul weights in the order a forward pass
/// uses them, as its [`ork_manifest::Manifest`] lists them: block by block `attn_q, attn_k,
/// attn_v, attn_output, ffn_gate, ffn_up, ffn_down` (plus any other 2-D tensor of the block, in
/// file order), then the output projection (`output.weight`, or `token_embd.weight` when the
/// embedding is tied).
pub fn execution_order(manifest: &ork_manifest::Manifest) -> Vec<String> {
    manifest.execution_order().map(|w| w.key.clone()).collect()
}
