//! The `rknn` backend: matmuls through Rockchip's vendor runtime `librknnrt.so`, loaded at run
//! time (never linked), through its matmul C API (see `docs/rknn.md`).
//!
//! * [`sys`]: the C structs (sizes and offsets pinned), the library loader and one safe wrapper
//!   per call; all of this backend's `unsafe` is there.
//! * [`RknnDevice`]: the [`crate::Device`] — weights in runtime memory of their IOMMU domain,
//!   matmul contexts per (type, K, N, domain) with dynamic M, B bound in the native layout,
//!   N-chunks of a wide weight bound as memory objects inside the same memory.
//! * [`kernels`]: the emulator's kernels on plain slices, for the CI stand-in runtime.

mod device;
pub mod kernels;
mod lib_path;
pub mod sys;

pub use device::{parse_version, RknnDevice, RuntimeVersion, MIN_RUNTIME, M_BUCKETS};
