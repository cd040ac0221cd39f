//! ork layer 3 — **store**: the `.orkpack` on-disk cache of packed weights.
//!
//! An `.orkpack` holds, per matmul weight of a model, the tiled blob in the RK3588 native layout
//! (4096-byte aligned, so it can be mapped or DMA-copied directly), its scales (per channel or per group),
//! xxh3-64 checksums of both, and the source tensor's fingerprint (the staleness key). The
//! format is specified in `docs/orkpack.md`.
//!
//! - [`OrkpackWriter`] streams entries into a temp file and publishes it atomically.
//! - [`Orkpack`] maps and validates a file; blobs are verified as they are loaded.
//! - [`check_entry`] decides whether an entry still matches its source tensor.
//! - [`ensure`] / [`convert`] keep a model's cache file complete and current.
//! - [`bench_load`] measures verified loads against a plain memcpy (`ork bench`).
//!
//! # Signals
//! The first [`OrkpackWriter`] of a process starts a signal-hook listener thread for SIGINT and
//! SIGTERM. On either, it deletes the temp files of all live writers and re-raises the signal
//! with its default disposition, so the process still terminates by that signal (exit status
//! 130 for Ctrl-C). An application that handles these signals itself (`ork serve` drains on
//! them) calls [`leave_signals_to_application`] once its own handlers are installed; from then
//! on the listener leaves them alone. kill -9 cannot be handled: its temp file is removed by
//! the next writer of the same target.
#![forbid(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod bench;
mod check;
mod checksum;
mod convert;
mod error;
mod fingerprint;
pub mod format;
mod map;
mod reader;
mod smoothing;
mod target;
mod writer;

pub use bench::{bench_load, LoadBench};
pub use check::{
    check_entry, check_entry_key, effective_group, matmul_dims, weight_quant, EntryKey, EntryStatus,
};
pub use convert::{
    convert, ensure, matmul_weights, model_identity, Action, ConvertOptions, ConvertReport,
    Progress, RebuildReason,
};
pub use error::StoreError;
pub use fingerprint::{fingerprint, fingerprint_bytes, FULL_HASH_LIMIT};

/// XXH3-64 of `bytes` (seed 0): the format's one checksum, for callers that check or key files
/// of their own (the server's saved prefix caches).
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    checksum::xxh3(bytes)
}
pub use reader::{Entry, ModelIdentity, Orkpack, SourceInfo};
pub use smoothing::{
    PackSmoothing, SmoothedBlock, SmoothingHeader, SmoothingTargets, MAX_SMOOTH_BLOCKS,
    MAX_SMOOTH_DIM, OPT_SMOOTHING, SMOOTHING_HEADER_LEN, SMOOTHING_MAGIC, SMOOTHING_MAGIC_V1,
    TARGET_UP_TO_DOWN, TARGET_V_TO_O,
};
pub use target::{resolve_target, PackTarget};
pub use writer::{leave_signals_to_application, OrkpackWriter};
