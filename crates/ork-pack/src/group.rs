//! Per-group weight scales: one scale per output channel and group of `g` consecutive k (the
//! chip's per-group mode, rkllm's `w8a8_g128/g256/g512`; see `docs/chip.md`).
//!
//! The quantization rule is the per-channel rule of the `quant` module applied to each group on
//! its own:
//!
//! ```text
//! absmax[n, j] = max |w[n, k]| over k in j·g .. (j+1)·g
//! scale[n, j]  = absmax[n, j] / lim        (lim = 127 int8, 7 int4)
//! q[n, k]      = clamp(round_ties_even(w[n, k] · lim / absmax[n, j]), -lim, lim)
//! ```
//!
//! Scales are stored `[N][K/g]` (row-major by output channel). The vendor runtime takes N·K/g
//! floats for a per-group B; that this is their order is likely but **unverified on a board**.

use crate::kernel::layout_of;
use crate::quant::{
    absmax_bits, is_non_finite, quantize_i4, quantize_i8, row_scale, KT, TINY_ROW_FACTOR,
};
use crate::{PackDtype, PackError, PackedWeight, RowSource};
use rayon::prelude::*;

/// How a weight's scales cover K.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScaleGroup {
    /// One scale per output channel: `n` scales.
    #[default]
    PerChannel,
    /// One scale per output channel and group of this many consecutive k: `n · k/g` scales,
    /// order `[N][K/g]`. The size is a positive multiple of 32 (a K-tile never straddles two
    /// groups) that divides K.
    Group(usize),
}

impl ScaleGroup {
    /// The group size, `None` per channel.
    pub const fn size(self) -> Option<usize> {
        match self {
            ScaleGroup::PerChannel => None,
            ScaleGroup::Group(g) => Some(g),
        }
    }

    /// Short name for reports: "per-channel" or "g128".
    pub fn name(self) -> String {
        match self {
            ScaleGroup::PerChannel => "per-channel".to_owned(),
            ScaleGroup::Group(g) => format!("g{g}"),
        }
    }

    /// Groups along a K of `k` (1 per channel).
    ///
    /// # Errors
    /// [`PackError::Group`] if the group size is zero, not a multiple of 32 or does not divide
    /// `k`.
    pub fn groups(self, k: usize) -> Result<usize, PackError> {
        match self {
            ScaleGroup::PerChannel => Ok(1),
            ScaleGroup::Group(group) => {
                let reason = if group == 0 || !group.is_multiple_of(KT) {
                    "group size must be a positive multiple of 32"
                } else if !k.is_multiple_of(group) {
                    "group size does not divide K"
                } else {
                    return Ok(k / group);
                };
                Err(PackError::Group { group, k, reason })
            }
        }
    }

    /// Scales a logical `k × n` weight carries (`n · groups`).
    ///
    /// # Errors
    /// As [`ScaleGroup::groups`]; [`PackError::Shape`] if the count overflows.
    pub fn scales_len(self, k: usize, n: usize) -> Result<usize, PackError> {
        self.groups(k)?.checked_mul(n).ok_or(PackError::Shape {
            k,
            n,
            reason: "scale count overflows usize",
        })
    }

    /// Index of the scale of output channel `n`, element `k` in a weight with `groups` groups.
    #[inline]
    pub const fn scale_index(self, groups: usize, n: usize, k: usize) -> usize {
        match self {
            ScaleGroup::PerChannel => n,
            ScaleGroup::Group(g) => n * groups + k / g,
        }
    }
}

/// Pack a weight with per-group scales of `group` consecutive k (int8 or int4), in the same native
/// layout as [`crate::pack`]; see the module docs for the rule. Runs in parallel over N-tiles on
/// the current rayon pool.
///
/// # Errors
/// [`PackError::Group`] for fp16 or a group that does not fit K (see [`ScaleGroup::groups`]),
/// otherwise as [`crate::pack`] ([`PackError::NonFinite`] names the output channel).
pub fn pack_grouped(
    src: &dyn RowSource,
    dtype: PackDtype,
    group: usize,
) -> Result<PackedWeight, PackError> {
    let layout = layout_of(src, dtype)?;
    let sg = ScaleGroup::Group(group);
    let lim = match dtype {
        PackDtype::I8 => 127.0,
        PackDtype::I4 => 7.0,
        PackDtype::F16 => {
            return Err(PackError::Group {
                group,
                k: layout.k,
                reason: "fp16 weights have no scales to group",
            })
        }
    };
    let groups = sg.groups(layout.k)?;
    let mut data = vec![0u8; layout.blob_bytes()];
    let mut scales = vec![0f32; sg.scales_len(layout.k, layout.n)?];
    let (k, tn) = (layout.k, dtype.n_tile());
    let pb = match dtype {
        PackDtype::I8 => KT,
        _ => KT / 2,
    };
    let kt_stride = tn * pb;
    data.par_chunks_mut(layout.n_tile_bytes())
        .zip(scales.par_chunks_mut(tn * groups))
        .enumerate()
        .try_for_each(|(tile, (out, tile_scales))| {
            let first = tile * tn;
            let rows_here = tile_scales.len() / groups;
            let mut rows = vec![0f32; rows_here * k];
            src.read_rows(first, &mut rows)?;
            for (r, (row, row_scales)) in rows
                .chunks_exact_mut(k)
                .zip(tile_scales.chunks_exact_mut(groups))
                .enumerate()
            {
                for (j, (vals, scale)) in row.chunks_exact_mut(group).zip(row_scales).enumerate() {
                    let bits = absmax_bits(vals);
                    if is_non_finite(bits) {
                        return Err(PackError::NonFinite { row: first + r });
                    }
                    let s = row_scale(f32::from_bits(bits), lim);
                    *scale = s.scale;
                    if s.tiny {
                        vals.iter_mut().for_each(|x| *x *= TINY_ROW_FACTOR);
                    }
                    for (p, piece) in vals.chunks_exact(KT).enumerate() {
                        let kt = j * (group / KT) + p;
                        let dst = &mut out[kt * kt_stride + r * pb..kt * kt_stride + (r + 1) * pb];
                        if dtype == PackDtype::I8 {
                            quantize_i8(piece, s.inv, dst);
                        } else {
                            quantize_i4(piece, s.inv, dst);
                        }
                    }
                }
            }
            Ok(())
        })?;
    Ok(PackedWeight {
        layout,
        data,
        scales,
        group: sg,
    })
}
