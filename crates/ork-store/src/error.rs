//! Errors of the store layer.
use std::path::PathBuf;

/// The `op`s of [`StoreError::Io`] that mean a pack could not be written.
const WRITE_OPS: [&str; 6] = [
    "create temp file",
    "write",
    "write header",
    "fsync",
    "rename temp file over target",
    "fsync directory",
];

/// Everything that can go wrong reading, writing or filling an `.orkpack` file. Each variant
/// names the file and, where there is one, the tensor and the byte offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An operating-system call on a file failed (open, map, write, sync, rename; a full disk is
    /// `source.kind() == StorageFull`).
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file (for a write: the target; the temp file sits beside it).
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: std::io::Error,
    },
    /// The path names a directory, FIFO, device or socket, not a regular file (refused on open,
    /// and as a write target).
    #[error("{path}: is {kind}, not a regular file")]
    NotRegularFile {
        /// The path as given.
        path: PathBuf,
        /// What it is ("a directory", "a FIFO", …).
        kind: &'static str,
    },
    /// The pack target is the model file itself (same device and inode: another spelling, a
    /// symlink or a hard link); nothing was written.
    #[error(
        "{path}: is the model {model} itself; refusing to overwrite it (pass another --pack / -o)"
    )]
    WouldOverwriteModel {
        /// The pack path as given.
        path: PathBuf,
        /// The model path as given.
        model: PathBuf,
    },
    /// The pack target exists and may not be replaced (not an `.orkpack`, a dangling symlink, …);
    /// nothing was written.
    #[error("{path}: refusing to replace it: {reason}")]
    RefuseOverwrite {
        /// The pack path as given.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file does not start (or end) with the `.orkpack` magic.
    #[error("{path}: not an .orkpack file (magic {found:02x?})")]
    BadMagic {
        /// File.
        path: PathBuf,
        /// The 8 bytes found where the magic belongs.
        found: [u8; 8],
    },
    /// The file is an `.orkpack` of a format version this build cannot read.
    #[error("{path}: .orkpack format version {found}, this build reads version {supported}")]
    UnsupportedVersion {
        /// File.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The file requires features (required-flag bits) this build does not know.
    #[error("{path}: .orkpack requires unknown features (flags {flags:#x})")]
    UnsupportedFlags {
        /// File.
        path: PathBuf,
        /// The unknown required-flag bits.
        flags: u32,
    },
    /// The file is shorter than its header says (an interrupted copy or a cut download).
    #[error("{path}: truncated: {actual} bytes, expected {expected}")]
    Truncated {
        /// File.
        path: PathBuf,
        /// Length the header records (or the minimum length of a header).
        expected: u64,
        /// Actual length.
        actual: u64,
    },
    /// The header, footer or index is damaged or inconsistent.
    #[error("{path}: corrupt index: {what} (at byte {offset})")]
    CorruptIndex {
        /// File.
        path: PathBuf,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong (naming the entry where there is one).
        what: String,
    },
    /// A tensor's blob or scales do not match their checksum.
    #[error("{path}: tensor '{tensor}': corrupt {what}")]
    CorruptBlob {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// What failed (e.g. "blob checksum").
        what: String,
    },
    /// A tensor's bytes could not be read from the file (truncated or replaced in place while
    /// open, an I/O error of the device).
    #[error("{path}: tensor '{tensor}': cannot read its {what}: {source}")]
    BlobUnreadable {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// "blob" or "scales".
        what: &'static str,
        /// The OS error (`UnexpectedEof` for a file cut short).
        source: std::io::Error,
    },
    /// The entry was packed from a different source tensor or with different settings.
    #[error("{path}: tensor '{tensor}': stale entry: {reason}")]
    Stale {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// What differs.
        reason: String,
    },
    /// The file has no entry of that name.
    #[error("{path}: no tensor '{tensor}'")]
    MissingEntry {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
    },
    /// A writer was handed an entry it cannot store (duplicate name, size not matching the
    /// layout, name too long, …).
    #[error("{path}: tensor '{tensor}': cannot store: {reason}")]
    InvalidEntry {
        /// Target file.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A destination buffer has the wrong length.
    #[error("{path}: tensor '{tensor}': buffer of {actual} bytes, blob is {expected}")]
    BufferSize {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// Blob size.
        expected: u64,
        /// Buffer size.
        actual: u64,
    },
    /// Packing a source tensor failed.
    #[error("packing tensor '{tensor}': {source}")]
    Pack {
        /// Tensor name.
        tensor: String,
        /// The pack layer's error (boxed: it embeds GGUF errors and would bloat every
        /// `Result` of this crate).
        source: Box<ork_pack::PackError>,
    },
    /// The model file could not be read correctly (it changed while open).
    #[error(transparent)]
    Source {
        /// The GGUF layer's error, naming file and tensor (boxed, see `Pack`).
        source: Box<ork_gguf::GgufError>,
    },
    /// The pack thread pool could not be built.
    #[error("building the pack thread pool: {reason}")]
    Threads {
        /// Why.
        reason: String,
    },
    /// The model's tensor cannot be stored as a matmul weight (not 2-D, dims too large).
    #[error("tensor '{tensor}': not a matmul weight: {reason}")]
    NotMatmulWeight {
        /// Tensor name.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// The model's weight manifest cannot be derived (names the file and tensor).
    #[error(transparent)]
    Manifest(#[from] ork_manifest::ManifestError),
}

impl StoreError {
    /// Whether this is a failure to *write* a pack (the temp file cannot be created, a write,
    /// fsync or the rename fails: a read-only directory, a full disk, a quota) rather than a
    /// problem with the files themselves. A caller may then run without the cache.
    pub fn is_write_failure(&self) -> bool {
        matches!(
            self,
            StoreError::Io { op, .. } if WRITE_OPS.contains(op)
        )
    }

    /// Shorthand for [`StoreError::Io`].
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}

/// An output refused or not written (`ork_io::output`), as the store's error of the same kind
/// (the same message).
impl From<ork_io::output::OutputError> for StoreError {
    fn from(e: ork_io::output::OutputError) -> Self {
        use ork_io::output::OutputError;
        match e {
            OutputError::Io { path, op, source } => StoreError::Io { path, op, source },
            OutputError::NotRegularFile { path, kind } => StoreError::NotRegularFile { path, kind },
            OutputError::RefuseOverwrite { path, reason } => {
                StoreError::RefuseOverwrite { path, reason }
            }
            other => StoreError::Io {
                path: PathBuf::new(),
                op: "write an output",
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}
