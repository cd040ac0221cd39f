//! ork layer 1 — **source**: GGUF models read through mmap, and ggml block decoders.
//!
//! - [`GgufFile::open`] maps a GGUF v3 (or v2) file and validates its whole header;
//!   [`GgufFile::metadata`] / [`GgufFile::tensors`] / [`GgufFile::tensor`] (O(1) by name) /
//!   [`GgufFile::tensor_data`] (borrowed from the map) read it; [`GgufFile::evict`] hands a
//!   tensor's pages back to the kernel once it has been packed.
//! - [`dequant::dequantize`] turns whole blocks of one [`GgmlType`] into f32;
//!   [`GgufFile::dequantize_rows`] does it for rows of a tensor (the pack kernel's input).
//! - Opening and mapping follow `ork_io`'s file rules (a regular file, opened without blocking;
//!   a map that survives the file being cut short); this crate only parses.
//! - [`writer`] builds small GGUF files (test fixtures) and quantizes f32 to F32/F16/Q8_0/Q4_0/Q4_1.
//!
//! # Why a hand-written reader
//! The reader is ~400 lines over `memmap2` rather than a crate such as `gguf-rs-lib` or
//! `candle-core`'s `gguf_file`: ork needs tensor bytes borrowed zero-copy from one map (candle
//! copies them), per-tensor `madvise` eviction on that same map, typed errors that name the file,
//! key or tensor and byte offset, and hard caps on every count before allocating — none of the
//! candidates offers all of these, and the format is small enough that a checked cursor
//! (`parse.rs`) is easy to review and fuzz (`fuzz/`).
//!
//! # Validation
//! Every read is bounds-checked; tensor/metadata counts, string lengths, array lengths, nesting
//! depth and dimensions are capped and checked against the bytes left before allocating; sizes
//! use checked arithmetic. `general.alignment` must be a non-zero power of two (default 32);
//! each tensor's offset must be aligned and its data (size from dims and the type's block
//! geometry; `ne0` a multiple of the block size) must end inside the file; duplicate keys and
//! tensor names are rejected. Tensors of types ork cannot decode (IQ*, TQ*, …) still open, since
//! their block geometry is known; decoding them reports [`GgufError::UnsupportedType`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod dequant;
mod error;
mod file;
mod parse;
mod types;
pub mod writer;

pub use error::GgufError;
pub use file::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;
