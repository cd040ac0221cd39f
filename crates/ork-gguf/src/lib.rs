//! ork layer 1 — **source**: GGUF v3 models read through mmap.
//!
//! API CONTRACT (other crates are being written against these signatures; keep them):
//! - [`GgufFile::open`] maps and validates a file.
//! - [`GgufFile::metadata`] / [`GgufFile::tensors`] / [`GgufFile::tensor`] / [`GgufFile::tensor_data`].
//! - [`dequant::dequantize`] turns whole blocks of one [`GgmlType`] into f32.
#![deny(missing_docs)]

pub mod dequant;
mod error;
mod file;
mod mmap;
mod types;

pub use error::GgufError;
pub use file::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;
