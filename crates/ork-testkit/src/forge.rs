//! Forging `.orkpack` damage that checksums cannot see: a value rewritten in place with every
//! checksum that covers it recomputed (the entry's scale checksum, the index checksum, the
//! footer checksum), as a file written by another tool or damaged before it was checksummed
//! would be. Offsets follow `ork_store::format` (`EntryRecord`, `Footer`; docs/orkpack.md).

use std::path::Path;

const FOOTER: usize = 64;
const RECORD: usize = 88;

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn xxh3(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// Set scale `index` of entry `name` of the pack at `path` to `value`, recomputing the
/// checksums so that only a check of the values themselves can tell.
///
/// # Panics
/// If the file is not a well-formed pack holding `name` with at least `index + 1` scales.
pub fn set_scale(path: &Path, name: &str, index: usize, value: f32) {
    let mut b = std::fs::read(path).expect("read the pack");
    let f = b.len() - FOOTER;
    let (index_offset, index_size) = (u64_at(&b, f) as usize, u64_at(&b, f + 8) as usize);
    let count = u32::from_le_bytes(b[f + 24..f + 28].try_into().unwrap()) as usize;
    let mut at = index_offset;
    let mut found = None;
    for _ in 0..count {
        let name_len = usize::from(u16::from_le_bytes([b[at], b[at + 1]]));
        if &b[at + RECORD..at + RECORD + name_len] == name.as_bytes() {
            found = Some(at);
            break;
        }
        at += RECORD + name_len.div_ceil(8) * 8;
    }
    let rec = found.unwrap_or_else(|| panic!("no entry {name} in {}", path.display()));
    let (scale_offset, scale_size) = (u64_at(&b, rec + 40) as usize, u64_at(&b, rec + 48) as usize);
    assert!((index + 1) * 4 <= scale_size, "{name} has fewer scales");
    let s = scale_offset + index * 4;
    b[s..s + 4].copy_from_slice(&value.to_le_bytes());
    let sum = xxh3(&b[scale_offset..scale_offset + scale_size]);
    b[rec + 64..rec + 72].copy_from_slice(&sum.to_le_bytes());
    let sum = xxh3(&b[index_offset..index_offset + index_size]);
    b[f + 16..f + 24].copy_from_slice(&sum.to_le_bytes());
    let sum = xxh3(&b[f..f + 48]);
    b[f + 48..f + 56].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(path, &b).expect("write the pack");
}
