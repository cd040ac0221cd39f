//! Errors of the source layer.
use std::path::PathBuf;

/// Everything that can go wrong reading a GGUF file or decoding its blocks.
///
/// Parse errors name the file, the byte offset where the problem was found and, where there is
/// one, the metadata key or tensor. Files parsed from memory ([`crate::GgufFile::from_bytes`]) use
/// the label given by the caller as `path`.
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
    /// The path names a directory, FIFO, device or socket, not a regular file.
    #[error("{path}: is {kind}, not a regular file")]
    NotRegularFile {
        /// File.
        path: PathBuf,
        /// What it is ("a directory", "a FIFO", …).
        kind: &'static str,
    },
    /// The file changed while open (cut short by another program): bytes read from it since
    /// may be zeros instead of the file's, so the result that used them is refused.
    #[error("{path}: changed while open, reading tensor '{tensor}': {source}")]
    Changed {
        /// File.
        path: PathBuf,
        /// The tensor being read when the change was noticed.
        tensor: String,
        /// What was noticed (`UnexpectedEof`).
        source: std::io::Error,
    },
    /// Two tensors' data ranges overlap.
    #[error("{path}: tensor '{tensor}' ({offset}+{size}) overlaps tensor '{other}'")]
    OverlappingTensors {
        /// File.
        path: PathBuf,
        /// The tensor that starts inside the other's data.
        tensor: String,
        /// The tensor whose data it overlaps.
        other: String,
        /// Absolute offset of `tensor`'s data.
        offset: u64,
        /// Byte size of `tensor`'s data.
        size: u64,
    },
    /// A structural problem at a byte offset that has no more specific variant (invalid UTF-8,
    /// a bool that is neither 0 nor 1, a badly typed `general.alignment`, …).
    #[error("{path}: {what} (at byte {offset})")]
    Malformed {
        /// File.
        path: PathBuf,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong, naming the key or tensor.
        what: String,
    },
    /// The file does not start with the magic `GGUF`.
    #[error("{path}: not a GGUF file (magic {found:02x?} at byte 0)")]
    BadMagic {
        /// File.
        path: PathBuf,
        /// The first bytes found (fewer than 4 if the file is shorter).
        found: Vec<u8>,
    },
    /// A GGUF version other than 2 or 3 (v1 used 32-bit counts; a byte-swapped number means a
    /// big-endian file).
    #[error("{path}: unsupported GGUF version {version} (at byte 4; ork reads v2 and v3)")]
    UnsupportedVersion {
        /// File.
        path: PathBuf,
        /// The version field.
        version: u32,
    },
    /// The file ends before a field that should be there.
    #[error("{path}: truncated: {what} needs {needed} bytes at byte {offset}, file has {len}")]
    Truncated {
        /// File.
        path: PathBuf,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Length of the file.
        len: u64,
        /// The field, naming the key or tensor.
        what: String,
    },
    /// A count, length, dimension or nesting depth is above ork's cap or above what the rest of
    /// the file could possibly hold.
    #[error("{path}: {what} is {value}, limit {limit} (at byte {offset})")]
    LimitExceeded {
        /// File.
        path: PathBuf,
        /// Byte offset of the field.
        offset: u64,
        /// The field, naming the key or tensor.
        what: String,
        /// The value found.
        value: u64,
        /// The largest accepted value.
        limit: u64,
    },
    /// Arithmetic on sizes or offsets overflowed `u64` / `usize`.
    #[error("{path}: size overflow computing {what} (at byte {offset})")]
    Overflow {
        /// File.
        path: PathBuf,
        /// Byte offset of the field involved.
        offset: u64,
        /// What was being computed, naming the key or tensor.
        what: String,
    },
    /// A metadata value type id outside the 13 GGUF types.
    #[error("{path}: key '{key}': unknown value type {type_id} (at byte {offset})")]
    BadValueType {
        /// File.
        path: PathBuf,
        /// Metadata key.
        key: String,
        /// Byte offset of the type field.
        offset: u64,
        /// The type id found.
        type_id: u32,
    },
    /// The same metadata key appears twice.
    #[error("{path}: duplicate metadata key '{key}' (at byte {offset})")]
    DuplicateKey {
        /// File.
        path: PathBuf,
        /// Metadata key.
        key: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error(
        "{path}: general.alignment {alignment} is not a non-zero power of two (at byte {offset})"
    )]
    BadAlignment {
        /// File.
        path: PathBuf,
        /// Byte offset of the value.
        offset: u64,
        /// The alignment found.
        alignment: u64,
    },
    /// The same tensor name appears twice.
    #[error("{path}: duplicate tensor '{tensor}' (at byte {offset})")]
    DuplicateTensor {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Byte offset of the second tensor info.
        offset: u64,
    },
    /// A tensor's type id has no known block geometry, so its size cannot be computed.
    #[error("{path}: tensor '{tensor}': unknown ggml type id {type_id} (at byte {offset})")]
    UnknownType {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Byte offset of the type field.
        offset: u64,
        /// The type id found.
        type_id: u32,
    },
    /// A tensor's shape is invalid: no dimensions, a zero dimension, or a row length (`ne0`) that
    /// is not a multiple of the type's block size.
    #[error("{path}: tensor '{tensor}': {what} (at byte {offset})")]
    BadShape {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Byte offset of the tensor info.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A tensor's data offset is not aligned, or its bytes reach past the end of the file.
    #[error(
        "{path}: tensor '{tensor}': data at bytes {offset}..{offset}+{size} is misaligned or \
         past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Absolute offset of the tensor's data (as declared).
        offset: u64,
        /// Byte size of the tensor's data.
        size: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// The tensor's type cannot be decoded by ork. From [`crate::dequant::dequantize`], which
    /// has no file context, `path` and `tensor` are empty; the file-level helpers fill them in.
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
    /// A row range asked of a tensor lies outside it, or the output is not a whole number of rows.
    #[error("{path}: tensor '{tensor}': rows {first_row}..{first_row}+{out_len}/{row_len} outside its {n_rows} rows or not whole rows")]
    BadRowRange {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// First row asked for.
        first_row: u64,
        /// Length of the output slice in f32 values.
        out_len: u64,
        /// Values per row (`ne0`).
        row_len: u64,
        /// Rows in the tensor.
        n_rows: u64,
    },
    /// A [`crate::writer::GgufBuilder`] or quantizer was given inconsistent input (data size
    /// not matching dims and type, duplicate names, a row not a whole number of blocks, …).
    #[error("gguf writer: {what}")]
    Build {
        /// What is wrong, naming the key or tensor.
        what: String,
    },
}
