//! The read-only file mapping behind [`crate::Orkpack`] — the crate's only `unsafe`.

use std::fs::File;
use std::io;

use memmap2::{Mmap, MmapOptions};

/// The bytes of a whole `.orkpack` file: a read-only mapping, or an owned copy.
pub(crate) enum ReadMap {
    /// A mapped file (`None` for an empty file: `mmap` refuses zero-length maps).
    Mapped(Option<Mmap>),
    /// Bytes held in memory (fixtures, fuzzing).
    Owned(Vec<u8>),
}

impl ReadMap {
    /// Map `len` bytes of `file` (`len` = its current length; an empty file maps to nothing,
    /// because `mmap` refuses zero-length maps).
    pub(crate) fn new(file: &File, len: u64) -> io::Result<ReadMap> {
        if len == 0 {
            return Ok(ReadMap::Mapped(None));
        }
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file larger than memory"))?;
        // SAFETY: `Mmap` is sound as long as nobody modifies or truncates the mapped file while
        // the mapping lives. ork never writes an `.orkpack` in place: every writer builds a new
        // inode in a temp file and renames it over the target, so a live mapping keeps the old,
        // unchanging inode. A third party editing the file in place is outside that contract
        // (documented in docs/orkpack.md); a truncation by one would raise SIGBUS, as for any
        // mmap-based reader, and every byte we read is checksummed before it is trusted.
        let map = unsafe { MmapOptions::new().len(len).map(file)? };
        Ok(ReadMap::Mapped(Some(map)))
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            ReadMap::Mapped(Some(m)) => m,
            ReadMap::Mapped(None) => &[],
            ReadMap::Owned(v) => v,
        }
    }
}
