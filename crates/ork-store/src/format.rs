//! The fixed on-disk structures of an `.orkpack` file and the checked cursor that parses the
//! variable-length index. The layout is specified in `docs/orkpack.md`; this module is its only
//! implementation. Every struct here is little-endian, byte-aligned (`Unaligned`), and has its size
//! pinned by a compile-time assertion, so reading one from any offset of the map is a checked
//! `zerocopy` cast that refuses short input.

use std::mem::size_of;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// File magic, at the start of the header and at the very end of the footer.
pub const MAGIC: [u8; 8] = *b"ORKPK01\0";
/// The one format version this build reads and writes (2: per-group scales and the target
/// chip; see `docs/orkpack.md`).
pub const VERSION: u32 = 2;
/// Blob alignment and size of the header page (bytes).
pub const PAGE: u64 = 4096;
/// Required-feature flags this build understands (none yet). A file with any other required bit
/// set is refused.
pub const KNOWN_REQUIRED_FLAGS: u32 = 0;

/// Upper bound on the number of index entries (a 1000-layer MoE model with 8 experts and 7
/// matmuls per layer is 56 000; the cap keeps a corrupt count from driving an allocation).
pub const MAX_ENTRIES: u32 = 1 << 20;
/// Largest scale group an entry may record (partial sums of 1024 int8 products are exact in
/// f32).
pub const MAX_GROUP: usize = 1024;
/// Upper bound on a tensor name in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Upper bound on K and N of one entry (2^24; the NPU's own K limit is 10240).
pub const MAX_DIM: u64 = 1 << 24;

/// The start of the header page (offset 0; the rest of the 4096-byte page is zero).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FileHeader {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// Format version ([`VERSION`]).
    pub version: U32,
    /// Features a reader must understand; unknown bits => refuse.
    pub required_flags: U32,
    /// Features a reader may ignore.
    pub optional_flags: U32,
    /// Blob alignment in bytes ([`PAGE`]).
    pub page_size: U32,
    /// Total length of the file in bytes (detects truncation).
    pub file_len: U64,
    /// Informational: byte length of the source model file.
    pub model_len: U64,
    /// Informational: fingerprint of the source model file (0 = not recorded).
    pub model_fingerprint: U64,
    /// The chip the pack was made for: its lower-case name in ASCII, zero-padded (all zeros:
    /// none recorded). A pack made for another chip is rebuilt by `ensure`.
    pub target: [u8; 8],
    /// xxh3-64 of the 56 bytes before this field.
    pub checksum: U64,
}
const _: () = assert!(size_of::<FileHeader>() == 64);

/// The last 64 bytes of the file.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Footer {
    /// Absolute offset of the index (8-aligned, after the last blob).
    pub index_offset: U64,
    /// Byte length of the index (the footer follows it directly).
    pub index_size: U64,
    /// xxh3-64 of the index bytes.
    pub index_checksum: U64,
    /// Number of entries in the index.
    pub entry_count: U32,
    /// Format version, equal to the header's.
    pub version: U32,
    /// Required flags, equal to the header's.
    pub required_flags: U32,
    /// Offset of the smoothing section when the header's `optional_flags` has
    /// [`crate::OPT_SMOOTHING`] (8-aligned, after the entries, before the index); else zero.
    pub smoothing_offset: U64,
    /// Zero on write, ignored on read.
    pub reserved: [u8; 4],
    /// xxh3-64 of the 48 bytes before this field.
    pub checksum: U64,
    /// [`MAGIC`] again, so the end of a complete file is recognisable.
    pub magic: [u8; 8],
}
const _: () = assert!(size_of::<Footer>() == 64);

/// The fixed part of one index entry; followed by `name_len` bytes of UTF-8 name and zero
/// padding to the next multiple of 8.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct EntryRecord {
    /// Byte length of the name that follows the record.
    pub name_len: U16,
    /// `PackDtype` tag.
    pub dtype: u8,
    /// `LayoutId` tag.
    pub layout: u8,
    /// ggml type id of the source tensor.
    pub source_type: U32,
    /// Logical K (GGUF ne0).
    pub k: U64,
    /// Logical N (GGUF ne1).
    pub n: U64,
    /// Absolute offset of the tiled blob (multiple of [`PAGE`]).
    pub blob_offset: U64,
    /// Byte length of the blob (`TiledLayout::blob_bytes()`).
    pub blob_size: U64,
    /// Absolute offset of the scales (multiple of 4).
    pub scale_offset: U64,
    /// Byte length of the scales (`4 * n`).
    pub scale_size: U64,
    /// xxh3-64 of the blob bytes.
    pub blob_checksum: U64,
    /// xxh3-64 of the scale bytes.
    pub scale_checksum: U64,
    /// Fingerprint of the source tensor (see `fingerprint`).
    pub source_fingerprint: U64,
    /// Scale group: 0 = one scale per output channel, else the number of consecutive k one
    /// scale covers (a multiple of 32 dividing K, at most 1024); the scales are `[N][K/g]`.
    pub group: U32,
    /// What the scales of a grouped entry are: [`GROUP_SYMMETRIC`] (one scale per group, and
    /// always for per-channel entries) or [`GROUP_AFFINE`] (int4 only: steps `[N][K/g]` then as
    /// many offsets, so `scale_size` is twice the symmetric one). Files written before affine
    /// groups existed have 0 here (this byte was reserved), so they read as symmetric, never as
    /// affine.
    pub group_kind: u8,
    /// Zero on write, ignored on read.
    pub reserved: [u8; 3],
}
const _: () = assert!(size_of::<EntryRecord>() == 88);

/// [`EntryRecord::group_kind`]: one scale per group (or per channel).
pub const GROUP_SYMMETRIC: u8 = 0;
/// [`EntryRecord::group_kind`]: a step and an offset per group (`ork_pack::ScaleGroup::Affine`).
pub const GROUP_AFFINE: u8 = 1;

/// Size of [`FileHeader`] in bytes.
pub const HEADER_LEN: usize = size_of::<FileHeader>();
/// Size of [`Footer`] in bytes.
pub const FOOTER_LEN: usize = size_of::<Footer>();
/// Size of [`EntryRecord`] in bytes.
pub const RECORD_LEN: usize = size_of::<EntryRecord>();

impl FileHeader {
    /// The bytes covered by [`FileHeader::checksum`].
    pub fn checksum_input(&self) -> &[u8] {
        &self.as_bytes()[..HEADER_LEN - 8]
    }
}

impl Footer {
    /// The bytes covered by [`Footer::checksum`].
    pub fn checksum_input(&self) -> &[u8] {
        &self.as_bytes()[..FOOTER_LEN - 16]
    }
}

/// Round `x` up to a multiple of `a` (a power of two); `None` on overflow.
pub fn align_up(x: u64, a: u64) -> Option<u64> {
    debug_assert!(a.is_power_of_two());
    Some(x.checked_add(a - 1)? & !(a - 1))
}

/// A forward-only reader over a borrowed byte slice. Every read is bounds-checked and reports the
/// absolute offset at which it failed.
#[derive(Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
}

/// Why a [`Cursor`] read failed: what was being read and where.
#[derive(Debug)]
pub struct CursorError {
    /// Absolute file offset of the failed read.
    pub offset: u64,
    /// What was being read.
    pub what: String,
}

impl<'a> Cursor<'a> {
    /// A cursor over `bytes`, which start at absolute file offset `base`.
    pub fn new(bytes: &'a [u8], base: u64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            base,
        }
    }

    /// Absolute file offset of the next byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Take the next `len` bytes.
    pub fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], CursorError> {
        let rest = &self.bytes[self.pos..];
        match rest.split_at_checked(len) {
            Some((head, _)) => {
                self.pos += len;
                Ok(head)
            }
            None => Err(CursorError {
                offset: self.offset(),
                what: format!(
                    "{what}: needs {len} bytes, {} left in the index",
                    rest.len()
                ),
            }),
        }
    }

    /// Read one fixed-size record.
    pub fn record<T: FromBytes + KnownLayout + Immutable + Unaligned>(
        &mut self,
        what: &str,
    ) -> Result<&'a T, CursorError> {
        let at = self.offset();
        let bytes = self.take(size_of::<T>(), what)?;
        T::ref_from_bytes(bytes).map_err(|_| CursorError {
            offset: at,
            what: format!("{what}: not a valid record"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_refuses_short_reads_and_reports_offsets() {
        let bytes = [0u8; RECORD_LEN + 12];
        let mut c = Cursor::new(&bytes, 1000);
        let r: &EntryRecord = c.record("first").unwrap();
        assert_eq!(r.k.get(), 0);
        let after = 1000 + RECORD_LEN as u64;
        assert_eq!(c.offset(), after);
        let err = c.record::<EntryRecord>("second").unwrap_err();
        assert_eq!(err.offset, after);
        assert_eq!(c.remaining(), 12);
        assert_eq!(c.take(12, "tail").unwrap().len(), 12);
        assert!(c.take(1, "past end").is_err());
    }

    #[test]
    fn align_up_rounds_and_detects_overflow() {
        assert_eq!(align_up(0, PAGE), Some(0));
        assert_eq!(align_up(1, PAGE), Some(4096));
        assert_eq!(align_up(4096, PAGE), Some(4096));
        assert_eq!(align_up(u64::MAX - 10, PAGE), None);
    }
}
