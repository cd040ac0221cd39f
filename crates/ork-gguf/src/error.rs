//! Errors of the source layer.
use std::path::PathBuf;

/// Everything that can go wrong reading a GGUF file. Each variant names the file and, where
/// there is one, the key or tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening or mapping the file failed.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// A structural problem at a byte offset.
    #[error("{path}: {what} (at byte {offset})")]
    Malformed {
        /// File.
        path: PathBuf,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong, naming the key or tensor.
        what: String,
    },
    /// The tensor's type cannot be decoded by ork.
    #[error("{path}: tensor '{tensor}': unsupported type {ty}")]
    UnsupportedType {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Type name or id.
        ty: String,
    },
    /// Decoding blocks failed (length mismatch).
    #[error("dequantize {ty}: {what}")]
    Decode {
        /// Type name.
        ty: String,
        /// What is wrong.
        what: String,
    },
}
