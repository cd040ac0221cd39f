//! The smoothing section of an `.orkpack` (`docs/orkpack.md`, `docs/chip.md`): the
//! SmoothQuant-style factors the pack's weights were smoothed with, and the parameters they were
//! computed from (α, the calibration text's hash and token count, the unsmoothed model's
//! fingerprint), so that a load with the same parameters takes the factors from the pack instead
//! of running a calibration pass, and a pack made with other parameters is rebuilt.
//!
//! On disk, at the offset the footer records (8-aligned, after the last entry, before the index):
//! a 64-byte [`SmoothingHeader`], then `blocks` presence bytes (1: the block has `ffn` factors)
//! zero-padded to a multiple of 8, then per block its `attn` factors and, when present, its `ffn`
//! factors, `dim` f32 each (little-endian).

use std::mem::size_of;
use std::path::Path;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::checksum::xxh3;
use crate::format::align_up;
use crate::StoreError;

/// Magic of the smoothing section.
pub const SMOOTHING_MAGIC: [u8; 8] = *b"ORKSMTH\0";
/// `optional_flags` bit of the header: the file has a smoothing section (its offset in the
/// footer). Readers that ignore it see a pack whose entries are the smoothed weights.
pub const OPT_SMOOTHING: u32 = 1;
/// Upper bound on the blocks of a smoothing section.
pub const MAX_SMOOTH_BLOCKS: u32 = 4096;
/// Upper bound on the factors per vector (a model's embedding width).
pub const MAX_SMOOTH_DIM: u32 = 1 << 16;

/// The fixed start of the smoothing section.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SmoothingHeader {
    /// [`SMOOTHING_MAGIC`].
    pub magic: [u8; 8],
    /// α as f32 bits.
    pub alpha: U32,
    /// Calibration tokens used.
    pub calib_tokens: U32,
    /// xxh3-64 of the calibration file's bytes.
    pub calib_hash: U64,
    /// Number of blocks.
    pub blocks: U32,
    /// Factors per vector.
    pub dim: U32,
    /// Bytes after this header (presence bytes, padding, factors).
    pub data_size: U64,
    /// xxh3-64 of those bytes.
    pub data_checksum: U64,
    /// xxh3-64 of the unsmoothed model's tensor fingerprints.
    pub model_fingerprint: U64,
    /// xxh3-64 of the 56 bytes before this field.
    pub checksum: U64,
}
const _: () = assert!(size_of::<SmoothingHeader>() == 64);

/// Length of [`SmoothingHeader`].
pub const SMOOTHING_HEADER_LEN: usize = size_of::<SmoothingHeader>();

/// The factors of one block: `attn` for the input of q/k/v, `ffn` for the input of gate/up
/// (`None`: the block's feed-forward was not smoothed, e.g. a mixture of experts).
#[derive(Clone, Debug, PartialEq)]
pub struct SmoothedBlock {
    /// One factor per input channel of q/k/v.
    pub attn: Vec<f32>,
    /// One factor per input channel of gate/up, if smoothed.
    pub ffn: Option<Vec<f32>>,
}

/// What a pack's weights were smoothed with (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct PackSmoothing {
    /// Migration strength α.
    pub alpha: f32,
    /// xxh3-64 of the calibration file's bytes.
    pub calib_hash: u64,
    /// Calibration tokens used.
    pub calib_tokens: u32,
    /// xxh3-64 of the unsmoothed model's tensor fingerprints (the factors depend on the model).
    pub model_fingerprint: u64,
    /// Factors per block, each vector `dim` long.
    pub blocks: Vec<SmoothedBlock>,
}

impl PackSmoothing {
    /// The hash the parameters use for the calibration text and the model (xxh3-64).
    pub fn hash(bytes: &[u8]) -> u64 {
        xxh3(bytes)
    }

    /// Whether `other` was computed from the same parameters (α, calibration text and token
    /// count, model): then its factors are the ones a calibration pass would give.
    pub fn same_parameters(&self, other: &PackSmoothing) -> bool {
        self.alpha.to_bits() == other.alpha.to_bits()
            && self.calib_hash == other.calib_hash
            && self.calib_tokens == other.calib_tokens
            && self.model_fingerprint == other.model_fingerprint
    }

    /// The parameters in words, for messages.
    pub fn describe(&self) -> String {
        format!(
            "smoothing alpha {} from a calibration text of {} tokens (xxh3 {:016x}), model {:016x}",
            self.alpha, self.calib_tokens, self.calib_hash, self.model_fingerprint
        )
    }

    fn dim(&self) -> usize {
        self.blocks.first().map_or(0, |b| b.attn.len())
    }

    /// The section's bytes (header, presence bytes, factors), or why it cannot be written.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, String> {
        let dim = self.dim();
        if self.blocks.is_empty() || self.blocks.len() > MAX_SMOOTH_BLOCKS as usize {
            return Err(format!(
                "{} smoothed blocks (1..={MAX_SMOOTH_BLOCKS})",
                self.blocks.len()
            ));
        }
        if dim == 0 || dim > MAX_SMOOTH_DIM as usize {
            return Err(format!("{dim} factors per block (1..={MAX_SMOOTH_DIM})"));
        }
        let mut data = Vec::new();
        for b in &self.blocks {
            data.push(u8::from(b.ffn.is_some()));
        }
        data.resize(align_up(data.len() as u64, 8).expect("small") as usize, 0);
        for (i, b) in self.blocks.iter().enumerate() {
            for v in std::iter::once(&b.attn).chain(&b.ffn) {
                if v.len() != dim {
                    return Err(format!("block {i}: {} factors, block 0 has {dim}", v.len()));
                }
                if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                    return Err(format!("block {i}: factor {x} is not finite and positive"));
                }
                data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        let mut header = SmoothingHeader {
            magic: SMOOTHING_MAGIC,
            alpha: U32::new(self.alpha.to_bits()),
            calib_tokens: U32::new(self.calib_tokens),
            calib_hash: U64::new(self.calib_hash),
            blocks: U32::new(self.blocks.len() as u32),
            dim: U32::new(dim as u32),
            data_size: U64::new(data.len() as u64),
            data_checksum: U64::new(xxh3(&data)),
            model_fingerprint: U64::new(self.model_fingerprint),
            checksum: U64::new(0),
        };
        header.checksum = U64::new(xxh3(&header.as_bytes()[..56]));
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(&data);
        Ok(out)
    }

    /// Parse the section at `offset` of `bytes` (the whole file), which must end by `limit`
    /// (the index). Every read is checked; any inconsistency is [`StoreError::CorruptIndex`].
    pub(crate) fn decode(
        path: &Path,
        bytes: &[u8],
        offset: u64,
        limit: u64,
    ) -> Result<PackSmoothing, StoreError> {
        let bad = |at: u64, what: String| StoreError::CorruptIndex {
            path: path.to_path_buf(),
            offset: at,
            what: format!("smoothing section: {what}"),
        };
        let head_end = offset
            .checked_add(SMOOTHING_HEADER_LEN as u64)
            .filter(|&e| offset.is_multiple_of(8) && e <= limit)
            .ok_or_else(|| bad(offset, format!("offset {offset} (limit {limit})")))?;
        let header = SmoothingHeader::read_from_bytes(&bytes[offset as usize..head_end as usize])
            .expect("slice has the header's exact length");
        if header.magic != SMOOTHING_MAGIC {
            return Err(bad(offset, "magic missing".into()));
        }
        if xxh3(&header.as_bytes()[..56]) != header.checksum.get() {
            return Err(bad(offset, "header checksum mismatch".into()));
        }
        let (blocks, dim) = (header.blocks.get(), header.dim.get());
        if blocks == 0 || blocks > MAX_SMOOTH_BLOCKS || dim == 0 || dim > MAX_SMOOTH_DIM {
            return Err(bad(offset, format!("{blocks} blocks of {dim} factors")));
        }
        let size = header.data_size.get();
        let end = head_end
            .checked_add(size)
            .filter(|&e| e <= limit)
            .ok_or_else(|| bad(offset, format!("{size} data bytes run past {limit}")))?;
        let data = &bytes[head_end as usize..end as usize];
        if xxh3(data) != header.data_checksum.get() {
            return Err(bad(head_end, "data checksum mismatch".into()));
        }
        let (blocks, dim) = (blocks as usize, dim as usize);
        let presence_len = align_up(blocks as u64, 8).expect("small") as usize;
        let presence = data
            .get(..presence_len)
            .ok_or_else(|| bad(head_end, "shorter than its presence bytes".into()))?;
        if presence[..blocks].iter().any(|&p| p > 1) || presence[blocks..].iter().any(|&p| p != 0) {
            return Err(bad(head_end, "presence bytes other than 0/1".into()));
        }
        let vectors = blocks + presence.iter().filter(|&&p| p == 1).count();
        if data.len() != presence_len + vectors * dim * 4 {
            return Err(bad(
                head_end,
                format!("{} data bytes for {vectors} vectors of {dim}", data.len()),
            ));
        }
        let mut values = data[presence_len..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut take = || -> Result<Vec<f32>, StoreError> {
            let v: Vec<f32> = values.by_ref().take(dim).collect();
            if v.iter().all(|x| x.is_finite() && *x > 0.0) {
                Ok(v)
            } else {
                Err(bad(head_end, "a factor is not finite and positive".into()))
            }
        };
        let mut out = Vec::with_capacity(blocks);
        for &p in &presence[..blocks] {
            let attn = take()?;
            let ffn = if p == 1 { Some(take()?) } else { None };
            out.push(SmoothedBlock { attn, ffn });
        }
        Ok(PackSmoothing {
            alpha: f32::from_bits(header.alpha.get()),
            calib_hash: header.calib_hash.get(),
            calib_tokens: header.calib_tokens.get(),
            model_fingerprint: header.model_fingerprint.get(),
            blocks: out,
        })
    }
}
