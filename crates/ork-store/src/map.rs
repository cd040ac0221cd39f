//! The read-only file mapping behind [`crate::Orkpack`]. The mapping itself (and its only
//! `unsafe`) lives in `ork_io::GuardedMap`, which survives the file being cut short while
//! mapped: vanished pages read as zeros and [`ReadMap::intact`] reports it.

use std::io;

use ork_io::GuardedMap;

/// The bytes of a whole `.orkpack` file: a guarded read-only mapping, or an owned copy.
pub(crate) enum ReadMap {
    /// A mapped file.
    Mapped(GuardedMap),
    /// Bytes held in memory (fixtures, fuzzing).
    Owned(Vec<u8>),
}

impl ReadMap {
    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            ReadMap::Mapped(m) => m.bytes(),
            ReadMap::Owned(v) => v,
        }
    }

    /// `Ok` if every byte read so far was the file's (see `GuardedMap::intact`).
    pub(crate) fn intact(&self) -> io::Result<()> {
        match self {
            ReadMap::Mapped(m) => m.intact(),
            ReadMap::Owned(_) => Ok(()),
        }
    }

    /// `intact`, and whether the file is unchanged since it was mapped (see
    /// `GuardedMap::unchanged`; bytes held in memory never change).
    pub(crate) fn unchanged(&self) -> io::Result<bool> {
        match self {
            ReadMap::Mapped(m) => m.unchanged(),
            ReadMap::Owned(_) => Ok(true),
        }
    }
}
