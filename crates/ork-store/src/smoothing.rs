//! The smoothing section of an `.orkpack` (`docs/orkpack.md`, `docs/chip.md`): the
//! SmoothQuant-style factors the pack's weights were smoothed with, and the parameters they were
//! computed from (α, the calibration text's hash and token count, the unsmoothed model's
//! fingerprint), so that a load with the same parameters takes the factors from the pack instead
//! of running a calibration pass, and a pack made with other parameters is rebuilt.
//!
//! On disk, at the offset the footer records (8-aligned, after the last entry, before the index):
//! a 64-byte [`SmoothingHeader`] whose magic gives the layout of the bytes after it.
//!
//! - [`SMOOTHING_MAGIC`] (version 2, written): a 16-byte [`SmoothingTargets`] record (which
//!   targets besides the normed inputs, and the lengths of their vectors), then `blocks`
//!   presence bytes (bit 0: the block has `ffn` factors, bit 1: `vo`, bit 2: `down`)
//!   zero-padded to a multiple of 8, then per block its `attn` factors (`dim` f32) and, when
//!   present, its `ffn` (`dim`), `vo` (`vo_dim`) and `down` (`down_dim`) factors, little-endian.
//! - [`SMOOTHING_MAGIC_V1`] (read only, packs made before `v → o` and `up → down` smoothing):
//!   presence bytes 0/1 (`ffn`), no targets record; read as smoothing of the normed inputs only,
//!   so a load that asks for more targets rebuilds the pack.

use std::mem::size_of;
use std::path::Path;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::checksum::xxh3;
use crate::format::align_up;
use crate::StoreError;

/// Magic of the smoothing section (version 2, with the targets record).
pub const SMOOTHING_MAGIC: [u8; 8] = *b"ORKSMT2\0";
/// Magic of the first version of the section (normed inputs only), still read.
pub const SMOOTHING_MAGIC_V1: [u8; 8] = *b"ORKSMTH\0";
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

/// The start of a version-2 section's data: which targets were smoothed besides the normed
/// inputs, and the length of their vectors.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SmoothingTargets {
    /// Bit 0: `v → o` ([`TARGET_V_TO_O`]), bit 1: `up → down` ([`TARGET_UP_TO_DOWN`]).
    pub targets: U32,
    /// Factors per `vo` vector (0 without `v → o`).
    pub vo_dim: U32,
    /// Factors per `down` vector (0 without `up → down`).
    pub down_dim: U32,
    /// Zero.
    pub reserved: U32,
}
const _: () = assert!(size_of::<SmoothingTargets>() == 16);

/// [`SmoothingTargets::targets`] bit: `v → o` per head was smoothed.
pub const TARGET_V_TO_O: u32 = 1;
/// [`SmoothingTargets::targets`] bit: `up → down` was smoothed.
pub const TARGET_UP_TO_DOWN: u32 = 2;

/// Presence bits of a block.
const HAS_FFN: u8 = 1;
const HAS_VO: u8 = 2;
const HAS_DOWN: u8 = 4;

/// The factors of one block: `attn` for the input of q/k/v, `ffn` for the input of gate/up
/// (`None`: the block's feed-forward was not smoothed, e.g. a mixture of experts), `vo` for the
/// input of the attention output projection and `down` for the input of the feed-forward down
/// projection (`None`: that target was not smoothed).
#[derive(Clone, Debug, PartialEq)]
pub struct SmoothedBlock {
    /// One factor per input channel of q/k/v.
    pub attn: Vec<f32>,
    /// One factor per input channel of gate/up, if smoothed.
    pub ffn: Option<Vec<f32>>,
    /// One factor per (kv head, dim) of v's output, if `v → o` was smoothed.
    pub vo: Option<Vec<f32>>,
    /// One factor per input channel of down, if `up → down` was smoothed.
    pub down: Option<Vec<f32>>,
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
    /// `v → o` per head was smoothed (besides the normed inputs).
    pub v_to_o: bool,
    /// `up → down` was smoothed (dense feed-forward blocks).
    pub up_to_down: bool,
    /// Factors per block: `attn` and `ffn` `dim` long, `vo` and `down` as long as every other
    /// block's.
    pub blocks: Vec<SmoothedBlock>,
}

impl PackSmoothing {
    /// The hash the parameters use for the calibration text and the model (xxh3-64).
    pub fn hash(bytes: &[u8]) -> u64 {
        xxh3(bytes)
    }

    /// Whether `other` was computed from the same parameters (α, targets, calibration text and
    /// token count, model): then its factors are the ones a calibration pass would give.
    pub fn same_parameters(&self, other: &PackSmoothing) -> bool {
        self.alpha.to_bits() == other.alpha.to_bits()
            && self.v_to_o == other.v_to_o
            && self.up_to_down == other.up_to_down
            && self.calib_hash == other.calib_hash
            && self.calib_tokens == other.calib_tokens
            && self.model_fingerprint == other.model_fingerprint
    }

    /// The targets in the CLI's words: `norm`, `norm,vo`, `norm,down` or `all`.
    pub fn targets_name(&self) -> &'static str {
        match (self.v_to_o, self.up_to_down) {
            (false, false) => "norm",
            (true, false) => "norm,vo",
            (false, true) => "norm,down",
            (true, true) => "all",
        }
    }

    /// The parameters in words, for messages.
    pub fn describe(&self) -> String {
        format!(
            "smoothing alpha {} of targets {} from a calibration text of {} tokens (xxh3 \
             {:016x}), model {:016x}",
            self.alpha,
            self.targets_name(),
            self.calib_tokens,
            self.calib_hash,
            self.model_fingerprint
        )
    }

    fn dim(&self) -> usize {
        self.blocks.first().map_or(0, |b| b.attn.len())
    }

    /// The section's bytes (header, targets, presence bytes, factors), or why it cannot be
    /// written.
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
        let len_of = |f: fn(&SmoothedBlock) -> &Option<Vec<f32>>| {
            self.blocks
                .iter()
                .find_map(|b| f(b).as_ref())
                .map_or(0, Vec::len)
        };
        let (vo_dim, down_dim) = (len_of(|b| &b.vo), len_of(|b| &b.down));
        for (what, set, len) in [
            ("vo", self.v_to_o, vo_dim),
            ("down", self.up_to_down, down_dim),
        ] {
            if len > MAX_SMOOTH_DIM as usize || (!set && len > 0) {
                return Err(format!(
                    "{len} {what} factors per block with the target {}",
                    if set { "set" } else { "not set" }
                ));
            }
        }
        let targets = SmoothingTargets {
            targets: U32::new(
                u32::from(self.v_to_o) * TARGET_V_TO_O
                    + u32::from(self.up_to_down) * TARGET_UP_TO_DOWN,
            ),
            vo_dim: U32::new(vo_dim as u32),
            down_dim: U32::new(down_dim as u32),
            reserved: U32::new(0),
        };
        let mut data = targets.as_bytes().to_vec();
        for b in &self.blocks {
            data.push(
                u8::from(b.ffn.is_some()) * HAS_FFN
                    + u8::from(b.vo.is_some()) * HAS_VO
                    + u8::from(b.down.is_some()) * HAS_DOWN,
            );
        }
        data.resize(align_up(data.len() as u64, 8).expect("small") as usize, 0);
        for (i, b) in self.blocks.iter().enumerate() {
            let vectors = [
                (Some(&b.attn), dim),
                (b.ffn.as_ref(), dim),
                (b.vo.as_ref(), vo_dim),
                (b.down.as_ref(), down_dim),
            ];
            for (v, len) in vectors.into_iter().filter_map(|(v, l)| Some((v?, l))) {
                if v.len() != len {
                    return Err(format!(
                        "block {i}: a vector of {} factors, {len} expected",
                        v.len()
                    ));
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
        let bad = |at: u64, what: String| smoothing_error(path, at, what);
        let (header, v2, head_end, end) = read_header(path, bytes, offset, limit)?;
        let data = &bytes[head_end as usize..end as usize];
        // Version 2: the targets record first; version 1 has none (normed inputs only).
        let (targets, vo_dim, down_dim, data) = if v2 {
            let (t, rest) = SmoothingTargets::read_from_prefix(data)
                .map_err(|_| bad(head_end, "shorter than its targets record".into()))?;
            (t.targets.get(), t.vo_dim.get(), t.down_dim.get(), rest)
        } else {
            (0, 0, 0, data)
        };
        let known = TARGET_V_TO_O | TARGET_UP_TO_DOWN;
        let dims_ok =
            |bit: u32, len: u32| len <= MAX_SMOOTH_DIM && ((targets & bit != 0) || len == 0);
        if targets & !known != 0
            || !dims_ok(TARGET_V_TO_O, vo_dim)
            || !dims_ok(TARGET_UP_TO_DOWN, down_dim)
        {
            return Err(bad(
                head_end,
                format!("targets {targets:#x} with vectors of {vo_dim} and {down_dim} factors"),
            ));
        }
        let shape = BlockShape {
            blocks: header.blocks.get() as usize,
            dim: header.dim.get() as usize,
            vo_dim: vo_dim as usize,
            down_dim: down_dim as usize,
            targets,
        };
        let data_at = head_end + if v2 { 16 } else { 0 };
        let out = decode_blocks(path, data, data_at, &shape)?;
        Ok(PackSmoothing {
            alpha: f32::from_bits(header.alpha.get()),
            calib_hash: header.calib_hash.get(),
            calib_tokens: header.calib_tokens.get(),
            model_fingerprint: header.model_fingerprint.get(),
            v_to_o: targets & TARGET_V_TO_O != 0,
            up_to_down: targets & TARGET_UP_TO_DOWN != 0,
            blocks: out,
        })
    }
}

/// A corrupt smoothing section.
fn smoothing_error(path: &Path, at: u64, what: String) -> StoreError {
    StoreError::CorruptIndex {
        path: path.to_path_buf(),
        offset: at,
        what: format!("smoothing section: {what}"),
    }
}

/// The section's header at `offset` (its magic, checksum and counts checked) and its data's
/// checksum; returns the header, whether it is version 2, and where the data starts and ends.
fn read_header(
    path: &Path,
    bytes: &[u8],
    offset: u64,
    limit: u64,
) -> Result<(SmoothingHeader, bool, u64, u64), StoreError> {
    let bad = |at: u64, what: String| smoothing_error(path, at, what);
    let head_end = offset
        .checked_add(SMOOTHING_HEADER_LEN as u64)
        .filter(|&e| offset.is_multiple_of(8) && e <= limit)
        .ok_or_else(|| bad(offset, format!("offset {offset} (limit {limit})")))?;
    let header = SmoothingHeader::read_from_bytes(&bytes[offset as usize..head_end as usize])
        .expect("slice has the header's exact length");
    let v2 = match header.magic {
        SMOOTHING_MAGIC => true,
        SMOOTHING_MAGIC_V1 => false,
        _ => return Err(bad(offset, "magic missing".into())),
    };
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
    if xxh3(&bytes[head_end as usize..end as usize]) != header.data_checksum.get() {
        return Err(bad(head_end, "data checksum mismatch".into()));
    }
    Ok((header, v2, head_end, end))
}

/// The section's block count, vector lengths and targets.
struct BlockShape {
    blocks: usize,
    dim: usize,
    vo_dim: usize,
    down_dim: usize,
    targets: u32,
}

/// The blocks' factors from `data` (at `data_at` in the file): a presence byte per block
/// (padded to 8), then each block's vectors; every factor finite and positive.
fn decode_blocks(
    path: &Path,
    data: &[u8],
    data_at: u64,
    shape: &BlockShape,
) -> Result<Vec<SmoothedBlock>, StoreError> {
    let bad = |at: u64, what: String| smoothing_error(path, at, what);
    let BlockShape {
        blocks,
        dim,
        vo_dim,
        down_dim,
        targets,
    } = *shape;
    let presence_len = align_up(blocks as u64, 8).expect("small") as usize;
    let presence = data
        .get(..presence_len)
        .ok_or_else(|| bad(data_at, "shorter than its presence bytes".into()))?;
    // A vo / down vector only where its target is set (and only in version 2).
    let mut allowed = HAS_FFN;
    if targets & TARGET_V_TO_O != 0 {
        allowed |= HAS_VO;
    }
    if targets & TARGET_UP_TO_DOWN != 0 {
        allowed |= HAS_DOWN;
    }
    if presence[..blocks].iter().any(|&p| p & !allowed != 0)
        || presence[blocks..].iter().any(|&p| p != 0)
    {
        return Err(bad(data_at, "presence bytes with unknown bits".into()));
    }
    let floats: usize = presence[..blocks]
        .iter()
        .map(|&p| {
            dim + usize::from(p & HAS_FFN != 0) * dim
                + usize::from(p & HAS_VO != 0) * vo_dim
                + usize::from(p & HAS_DOWN != 0) * down_dim
        })
        .sum();
    if data.len() != presence_len + floats * 4 {
        return Err(bad(
            data_at,
            format!("{} data bytes for {floats} factors", data.len()),
        ));
    }
    let mut values = data[presence_len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut take = |len: usize| -> Result<Vec<f32>, StoreError> {
        let v: Vec<f32> = values.by_ref().take(len).collect();
        if v.iter().all(|x| x.is_finite() && *x > 0.0) {
            Ok(v)
        } else {
            Err(bad(data_at, "a factor is not finite and positive".into()))
        }
    };
    let mut out = Vec::with_capacity(blocks);
    for &p in &presence[..blocks] {
        let attn = take(dim)?;
        let mut opt = |bit: u8, len: usize| -> Result<Option<Vec<f32>>, StoreError> {
            if p & bit != 0 {
                take(len).map(Some)
            } else {
                Ok(None)
            }
        };
        let ffn = opt(HAS_FFN, dim)?;
        let vo = opt(HAS_VO, vo_dim)?;
        let down = opt(HAS_DOWN, down_dim)?;
        out.push(SmoothedBlock {
            attn,
            ffn,
            vo,
            down,
        });
    }
    Ok(out)
}
