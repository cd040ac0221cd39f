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
//!   (`s·Σ = Σ s·Σ_seg`); with per-group scales each segment carries its own groups' scales
//!   (affine groups: its groups' steps and offsets).
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
    let chunk = soc
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

/// Whether the parts, stored one after another in split order, are the whole weight's native
/// blob unchanged: every part is a [`PartBytes::Range`] starting where the previous one ended.
/// True for N-chunks of an unsplit K (and for a weight that fits whole); false once K is
/// segmented.
pub fn native_order(parts: &[Part]) -> bool {
    let mut at = 0;
    parts.iter().all(|p| match &p.bytes {
        PartBytes::Range(r) if r.start == at => {
            at = r.end;
            true
        }
        _ => false,
    })
}

/// Byte offset of each part's blob in the **split order**: the parts' own native blobs stored
/// one after another, N-chunk by N-chunk and, inside a chunk, K-segment by K-segment. Where
/// [`native_order`] holds, these are the parts' [`PartBytes::Range`] starts. The total (the
/// last offset plus the last part's `blob_bytes`) equals the whole weight's `blob_bytes`: a
/// K-segment boundary falls on a k-tile, so no padding is added or lost.
pub fn part_offsets(parts: &[Part]) -> Vec<usize> {
    let mut at = 0;
    parts
        .iter()
        .map(|p| {
            let o = at;
            at += p.layout.blob_bytes();
            o
        })
        .collect()
}

/// Rewrite a weight's native blob `src` into the split order of `parts` ([`part_offsets`]) in
/// `dst` (same length). With [`native_order`] this is a copy.
///
/// # Errors
/// [`DeviceError::Length`] if `src` or `dst` is not `layout.blob_bytes()` long,
/// [`DeviceError::Shape`] if a part does not lie inside the weight on tile boundaries.
pub fn arrange(
    layout: &TiledLayout,
    src: &[u8],
    parts: &[Part],
    dst: &mut [u8],
) -> Result<(), DeviceError> {
    for (operand, len) in [
        ("weight bytes", src.len()),
        ("split weight bytes", dst.len()),
    ] {
        if len != layout.blob_bytes() {
            return Err(DeviceError::Length {
                operand,
                expected: layout.blob_bytes(),
                got: len,
            });
        }
    }
    let mut at = 0;
    for part in parts {
        let len = part.layout.blob_bytes();
        let out = dst
            .get_mut(at..at + len)
            .ok_or_else(|| bad_part(layout, "parts hold more bytes than the weight"))?;
        part_bytes_into(layout, src, part, out)?;
        at += len;
    }
    if at != dst.len() {
        return Err(bad_part(layout, "parts do not cover the weight"));
    }
    Ok(())
}

/// The scales of `part` of a weight with `scales` (per channel: `n`; per group: `[N][K/g]`;
/// affine: steps then offsets, each `[N][K/g]`) and scale group `group`: the chunk's channel
/// scales (borrowed), or its channels' scales of the segment's groups (gathered; borrowed when
/// the part covers all of K), for affine groups the part's steps followed by its offsets.
///
/// # Errors
/// [`DeviceError::Length`] if `scales` do not match the layout, [`DeviceError::Shape`] if the
/// group does not fit K or the part does not lie inside the weight on group boundaries.
pub fn part_scales<'a>(
    layout: &TiledLayout,
    scales: &'a [f32],
    group: ScaleGroup,
    part: &Part,
) -> Result<std::borrow::Cow<'a, [f32]>, DeviceError> {
    use std::borrow::Cow;
    let fit = |_| bad_part(layout, "scale group does not fit K");
    let groups = group.groups(layout.k).map_err(fit)?;
    let expected = group.scales_len(layout.k, layout.n).map_err(fit)?;
    if scales.len() != expected {
        return Err(DeviceError::Length {
            operand: "weight scales",
            expected,
            got: scales.len(),
        });
    }
    let (n, k) = (part.n.clone(), part.k.clone());
    if n.start >= n.end || n.end > layout.n || k.start >= k.end || k.end > layout.k {
        return Err(bad_part(layout, "part does not lie inside the weight"));
    }
    Ok(match group {
        ScaleGroup::PerChannel => Cow::Borrowed(&scales[n]),
        ScaleGroup::Group(g) => {
            if !k.start.is_multiple_of(g) || !(k.end == layout.k || k.end.is_multiple_of(g)) {
                return Err(bad_part(layout, "part cuts a scale group"));
            }
            let (j0, j1) = (k.start / g, k.end.div_ceil(g));
            if j0 == 0 && j1 == groups {
                Cow::Borrowed(&scales[n.start * groups..n.end * groups])
            } else {
                Cow::Owned(
                    n.flat_map(|c| scales[c * groups + j0..c * groups + j1].iter().copied())
                        .collect(),
                )
            }
        }
        // Steps and offsets each cut as per-group scales, the part's offsets after its steps.
        ScaleGroup::Affine(g) => {
            let (steps, offsets) = group.split(scales);
            let s = part_scales(layout, steps, ScaleGroup::Group(g), part)?;
            if s.len() == steps.len() {
                Cow::Borrowed(scales)
            } else {
                let o = part_scales(layout, offsets, ScaleGroup::Group(g), part)?;
                Cow::Owned([&s[..], &o[..]].concat())
            }
        }
    })
}

fn bad_part(l: &TiledLayout, reason: &'static str) -> DeviceError {
    DeviceError::Shape {
        m: 0,
        k: l.k,
        n: l.n,
        reason,
    }
}

/// Write `part`'s own native blob, taken from the whole weight's native blob `src`, into `out`
/// (`part.layout.blob_bytes()` long).
fn part_bytes_into(
    l: &TiledLayout,
    src: &[u8],
    part: &Part,
    out: &mut [u8],
) -> Result<(), DeviceError> {
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
        || out.len() != pl.blob_bytes()
    {
        return Err(bad_part(
            l,
            "part does not lie inside the weight on tile boundaries",
        ));
    }
    match &part.bytes {
        PartBytes::Range(r) => {
            let bytes = src
                .get(r.clone())
                .filter(|d| d.len() == pl.blob_bytes())
                .ok_or(bad_part(l, "part byte range does not match its layout"))?;
            out.copy_from_slice(bytes);
        }
        PartBytes::Repack => {
            // Bytes of one k-tile of one N-tile (tn rows × 32 values).
            let kt_bytes = l.n_tile_bytes() / (l.k_pad() / 32);
            let (kt0, kt1) = (k.start / 32, k.end.div_ceil(32));
            let run = (kt1 - kt0) * kt_bytes;
            for (i, t) in (n.start / tn..n.end.div_ceil(tn)).enumerate() {
                let tile = &src[t * l.n_tile_bytes()..(t + 1) * l.n_tile_bytes()];
                out[i * run..(i + 1) * run].copy_from_slice(&tile[kt0 * kt_bytes..kt1 * kt_bytes]);
            }
        }
    }
    Ok(())
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
    if w.data.len() != l.blob_bytes() {
        return Err(DeviceError::Length {
            operand: "weight bytes",
            expected: l.blob_bytes(),
            got: w.data.len(),
        });
    }
    let scales = part_scales(&l, &w.scales, w.group, part)?.into_owned();
    let mut data = vec![0u8; part.layout.blob_bytes()];
    part_bytes_into(&l, &w.data, part, &mut data)?;
    Ok(PackedWeight {
        layout: part.layout,
        data,
        scales,
        group: w.group,
    })
}
