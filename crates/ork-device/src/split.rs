//! Cutting a weight the chip cannot take whole into chip-sized parts (see `docs/chip.md`).
//!
//! A weight beyond the chip's N limit is cut into **N-chunks** of at most `n_max` output
//! channels; beyond its K limit (10240) into **K-segments** of 8192 k (the size the chip itself
//! uses when it splits B above 8192). A part is one N-chunk × one K-segment.
//!
//! * An N-chunk of an unsplit K is a contiguous byte range of the native blob (the layout is
//!   N-tile-major and chunks start on a tile), and that range *is* the chunk's own native blob:
//!   [`PartBytes::Range`]. Its outputs are columns `n0..n1` of the whole result.
//! * A K-segment is not contiguous (each N-tile holds all of K); [`part_weight`] gathers its
//!   k-tiles from every N-tile into the part's own blob: [`PartBytes::Repack`]. The outputs of
//!   the K-segments of one chunk are partial sums: add them in f32 (in segment order) to get the
//!   chunk's result. With per-channel scales each segment carries the channel scales
//!   (`s·Σ = Σ s·Σ_seg`); with per-group scales each segment carries its own groups' scales.
//!
//! Everything here is pure: no device, no allocation beyond the part's bytes.

use std::ops::Range;

use ork_pack::{PackedWeight, ScaleGroup, TiledLayout};

use crate::soc::{ElemType, Soc};
use crate::DeviceError;

/// Where a part's native bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartBytes {
    /// This byte range of the whole weight's blob is the part's blob, unchanged.
    Range(Range<usize>),
    /// The part's blob must be gathered by [`part_weight`].
    Repack,
}

/// One chip-sized part of a weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Output channels `n0..n1` of the whole weight.
    pub n: Range<usize>,
    /// Reduction range `k0..k1` of the whole weight.
    pub k: Range<usize>,
    /// The part's own layout (`k1 - k0` × `n1 - n0`, same dtype).
    pub layout: TiledLayout,
    /// Where its bytes come from.
    pub bytes: PartBytes,
}

/// The parts `layout` must be cut into to fit `soc`'s N and K limits (one part, the whole
/// weight as a [`PartBytes::Range`], if it fits). N-chunks are the outer order, K-segments the
/// inner: the parts of one chunk are consecutive, in ascending k.
///
/// `group` is the weight's scale group: a K-segment boundary must not cut a group.
///
/// # Errors
/// [`DeviceError::Shape`] for a zero dimension or a scale group that K-segments of the chip's
/// segment size would cut.
pub fn split(layout: &TiledLayout, group: ScaleGroup, soc: Soc) -> Result<Vec<Part>, DeviceError> {
    let (k, n, dtype) = (layout.k, layout.n, layout.dtype);
    let shape = |reason| DeviceError::Shape { m: 0, k, n, reason };
    if k == 0 || n == 0 {
        return Err(shape("weight has a zero dimension"));
    }
    let limits = &soc.caps().limits;
    let tn = dtype.n_tile();
    // Chunks start on an N-tile; the chip's N limits are whole numbers of tiles.
    let chunk = limits
        .n_max(ElemType::of_weight(dtype))
        .map_or(n, |max| (max / tn * tn).max(tn));
    let segment = if k > limits.k_max {
        limits.k_segment
    } else {
        k
    };
    if segment < k {
        if let Some(g) = group.size() {
            if !segment.is_multiple_of(g) {
                return Err(shape("scale group does not divide the chip's K-segment"));
            }
        }
    }
    let mut parts = Vec::new();
    for n0 in (0..n).step_by(chunk) {
        let n1 = (n0 + chunk).min(n);
        for k0 in (0..k).step_by(segment) {
            let k1 = (k0 + segment).min(k);
            let part_layout = TiledLayout::new(dtype, k1 - k0, n1 - n0);
            let bytes = if segment == k {
                let start = n0 / tn * layout.n_tile_bytes();
                PartBytes::Range(start..start + part_layout.blob_bytes())
            } else {
                PartBytes::Repack
            };
            parts.push(Part {
                n: n0..n1,
                k: k0..k1,
                layout: part_layout,
                bytes,
            });
        }
    }
    Ok(parts)
}

/// The part's own packed weight: its native bytes (copied from the range, or gathered k-tile by
/// k-tile from every N-tile of the chunk) and its scales (the chunk's channel scales, or its
/// channels' scales of the segment's groups).
///
/// # Errors
/// [`DeviceError::Length`] if `w`'s blob or scales do not match its layout, [`DeviceError::Shape`]
/// if `part` does not lie inside `w` on tile boundaries.
pub fn part_weight(w: &PackedWeight, part: &Part) -> Result<PackedWeight, DeviceError> {
    let l = w.layout;
    let shape = |reason| DeviceError::Shape {
        m: 0,
        k: l.k,
        n: l.n,
        reason,
    };
    if w.data.len() != l.blob_bytes() {
        return Err(DeviceError::Length {
            operand: "weight bytes",
            expected: l.blob_bytes(),
            got: w.data.len(),
        });
    }
    let groups = w
        .group
        .groups(l.k)
        .map_err(|_| shape("scale group does not fit K"))?;
    if w.scales.len() != l.n * groups {
        return Err(DeviceError::Length {
            operand: "weight scales",
            expected: l.n * groups,
            got: w.scales.len(),
        });
    }
    let tn = l.dtype.n_tile();
    let (n, k) = (part.n.clone(), part.k.clone());
    let pl = part.layout;
    if n.start >= n.end
        || n.end > l.n
        || k.start >= k.end
        || k.end > l.k
        || !n.start.is_multiple_of(tn)
        || !k.start.is_multiple_of(32)
        || pl != TiledLayout::new(l.dtype, k.len(), n.len())
    {
        return Err(shape(
            "part does not lie inside the weight on tile boundaries",
        ));
    }
    let data = match &part.bytes {
        PartBytes::Range(r) => w
            .data
            .get(r.clone())
            .filter(|d| d.len() == pl.blob_bytes())
            .ok_or(shape("part byte range does not match its layout"))?
            .to_vec(),
        PartBytes::Repack => {
            // Bytes of one k-tile of one N-tile (tn rows × 32 values).
            let kt_bytes = l.n_tile_bytes() / (l.k_pad() / 32);
            let (kt0, kt1) = (k.start / 32, k.end.div_ceil(32));
            let mut data = Vec::with_capacity(pl.blob_bytes());
            for t in n.start / tn..n.end.div_ceil(tn) {
                let tile = &w.data[t * l.n_tile_bytes()..(t + 1) * l.n_tile_bytes()];
                data.extend_from_slice(&tile[kt0 * kt_bytes..kt1 * kt_bytes]);
            }
            data
        }
    };
    let scales = match w.group {
        ScaleGroup::PerChannel => w.scales[n].to_vec(),
        ScaleGroup::Group(g) => n
            .flat_map(|c| {
                w.scales[c * groups + k.start / g..c * groups + k.end / g]
                    .iter()
                    .copied()
            })
            .collect(),
    };
    Ok(PackedWeight {
        layout: pl,
        data,
        scales,
        group: w.group,
    })
}
