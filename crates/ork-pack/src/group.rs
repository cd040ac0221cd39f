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
    /// Affine groups (int4 only; `docs/chip.md`, "RK3576 w4a16-gN"): per output channel and
    /// group of this many consecutive k a step `s[n, j]` and an offset `b[n, j]`, the value being
    /// `s · q + b` with `q` in -8..=7. `2 · n · k/g` scales: the steps `[N][K/g]` followed by the
    /// offsets `[N][K/g]` ([`ScaleGroup::split`]). Same size rules as [`ScaleGroup::Group`].
    Affine(usize),
}

impl ScaleGroup {
    /// The group size, `None` per channel.
    pub const fn size(self) -> Option<usize> {
        match self {
            ScaleGroup::PerChannel => None,
            ScaleGroup::Group(g) | ScaleGroup::Affine(g) => Some(g),
        }
    }

    /// Whether the weight carries offsets next to its steps ([`ScaleGroup::Affine`]).
    pub const fn is_affine(self) -> bool {
        matches!(self, ScaleGroup::Affine(_))
    }

    /// Short name for reports: "per-channel", "g128" or "g32-affine".
    pub fn name(self) -> String {
        match self {
            ScaleGroup::PerChannel => "per-channel".to_owned(),
            ScaleGroup::Group(g) => format!("g{g}"),
            ScaleGroup::Affine(g) => format!("g{g}-affine"),
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
            ScaleGroup::Group(group) | ScaleGroup::Affine(group) => {
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

    /// Scales a logical `k × n` weight carries (`n · groups`; twice that for
    /// [`ScaleGroup::Affine`]: steps, then offsets).
    ///
    /// # Errors
    /// As [`ScaleGroup::groups`]; [`PackError::Shape`] if the count overflows.
    pub fn scales_len(self, k: usize, n: usize) -> Result<usize, PackError> {
        let parts = if self.is_affine() { 2 } else { 1 };
        self.groups(k)?
            .checked_mul(n)
            .and_then(|c| c.checked_mul(parts))
            .ok_or(PackError::Shape {
                k,
                n,
                reason: "scale count overflows usize",
            })
    }

    /// The steps (scales) and the offsets of a weight's scale array: for
    /// [`ScaleGroup::Affine`] its two halves, otherwise all of it and an empty slice.
    pub fn split(self, scales: &[f32]) -> (&[f32], &[f32]) {
        if self.is_affine() {
            scales.split_at(scales.len() / 2)
        } else {
            (scales, &[])
        }
    }

    /// Index of the scale of output channel `n`, element `k` in a weight with `groups` groups
    /// (for [`ScaleGroup::Affine`] the step; its offset has the same index in the second half).
    #[inline]
    pub const fn scale_index(self, groups: usize, n: usize, k: usize) -> usize {
        match self {
            ScaleGroup::PerChannel => n,
            ScaleGroup::Group(g) | ScaleGroup::Affine(g) => n * groups + k / g,
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
                    crate::encode::check_f16_range(f32::from_bits(bits), first + r)?;
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

/// Pack an int4 weight with affine groups of `group` consecutive k ([`ScaleGroup::Affine`]), in
/// the same native layout as [`crate::pack`]. Per output channel `n` and group `j`:
///
/// ```text
/// lo, hi   = min, max of w[n, k] over the group
/// s[n, j]  = (hi − lo) / 15                                       (f64, rounded once to f32)
/// q[n, k]  = clamp(round_ties_even((w − lo) / s), 0, 15) − 8      (q = −8 when s = 0)
/// b[n, j]  = lo + 8 · s                                           (f64, rounded once to f32)
/// value    = s · q + b
/// ```
///
/// A Q4_1 source (per 32 weights one fp16 step `d` and minimum `m`, values `m + d · q'`, q' in
/// 0..=15) packed with groups of 32 gets back its own values within f32 rounding: llama.cpp's
/// quantizer maps each block's minimum to q' = 0 and its maximum to q' = 15, so `lo = m` and
/// `s = d` up to one rounding (`docs/chip.md`). Runs in parallel over N-tiles on the current
/// rayon pool.
///
/// # Errors
/// [`PackError::Group`] for a group that does not fit K (see [`ScaleGroup::groups`]),
/// [`PackError::NonFinite`] naming the output channel of a NaN or infinity, otherwise as
/// [`crate::pack`].
pub fn pack_affine(src: &dyn RowSource, group: usize) -> Result<PackedWeight, PackError> {
    let dtype = PackDtype::I4;
    let layout = layout_of(src, dtype)?;
    let sg = ScaleGroup::Affine(group);
    let groups = sg.groups(layout.k)?;
    let mut data = vec![0u8; layout.blob_bytes()];
    let steps_len = layout.n * groups;
    let mut scales = vec![0f32; sg.scales_len(layout.k, layout.n)?];
    let (steps, offsets) = scales.split_at_mut(steps_len);
    let (k, tn) = (layout.k, dtype.n_tile());
    let pb = KT / 2;
    let kt_stride = tn * pb;
    data.par_chunks_mut(layout.n_tile_bytes())
        .zip(steps.par_chunks_mut(tn * groups))
        .zip(offsets.par_chunks_mut(tn * groups))
        .enumerate()
        .try_for_each(|(tile, ((out, tile_steps), tile_offsets))| {
            let first = tile * tn;
            let rows_here = tile_steps.len() / groups;
            let mut rows = vec![0f32; rows_here * k];
            src.read_rows(first, &mut rows)?;
            let per_row = tile_steps
                .chunks_exact_mut(groups)
                .zip(tile_offsets.chunks_exact_mut(groups));
            for (r, (row, (row_steps, row_offsets))) in
                rows.chunks_exact(k).zip(per_row).enumerate()
            {
                for (j, vals) in row.chunks_exact(group).enumerate() {
                    let fit = affine_fit(vals).ok_or(PackError::NonFinite { row: first + r })?;
                    crate::encode::check_f16_range(
                        fit.lo.abs().max((fit.lo + 15.0 * fit.step).abs()),
                        first + r,
                    )?;
                    row_steps[j] = fit.step;
                    row_offsets[j] = fit.offset;
                    for (p, piece) in vals.chunks_exact(KT).enumerate() {
                        let kt = j * (group / KT) + p;
                        let dst = &mut out[kt * kt_stride + r * pb..kt * kt_stride + (r + 1) * pb];
                        let mut nib = [0u8; KT];
                        for (d, &x) in nib.iter_mut().zip(piece) {
                            *d = fit.code(x);
                        }
                        pack_nibbles(&nib, dst);
                    }
                }
            }
            Ok::<(), PackError>(())
        })?;
    Ok(PackedWeight {
        layout,
        data,
        scales,
        group: sg,
    })
}

/// The affine fit of one group (see [`pack_affine`]).
#[derive(Clone, Copy, Debug)]
struct AffineFit {
    lo: f32,
    step: f32,
    offset: f32,
}

/// Fit a group; `None` if it holds a NaN or an infinity.
fn affine_fit(vals: &[f32]) -> Option<AffineFit> {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in vals {
        if !x.is_finite() {
            return None;
        }
        lo = lo.min(x);
        hi = hi.max(x);
    }
    // In f64 (exact for the difference of two f32), each rounded once to f32: finite for any
    // finite group, even where `hi − lo` or `lo + 8 · s` would overflow f32.
    let step = ((f64::from(hi) - f64::from(lo)) / 15.0) as f32;
    let offset = (f64::from(lo) + 8.0 * f64::from(step)) as f32;
    Some(AffineFit { lo, step, offset })
}

impl AffineFit {
    /// The int4 code of `x` as a nibble (two's complement of `q` in -8..=7).
    #[inline]
    fn code(self, x: f32) -> u8 {
        let u = if self.step > 0.0 {
            ((x - self.lo) / self.step)
                .round_ties_even()
                .clamp(0.0, 15.0)
        } else {
            0.0
        };
        // u in 0..=15, so q = u - 8 in -8..=7.
        ((u as i8) - 8) as u8 & 0xF
    }
}

/// 32 int4 nibbles into `dst[..16]`, two per byte in [`crate::INT4_EVEN_K_IN_LOW_NIBBLE`] order.
fn pack_nibbles(nib: &[u8; KT], dst: &mut [u8]) {
    for (d, pair) in dst[..KT / 2].iter_mut().zip(nib.chunks_exact(2)) {
        *d = if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
            pair[0] | (pair[1] << 4)
        } else {
            pair[1] | (pair[0] << 4)
        };
    }
}
