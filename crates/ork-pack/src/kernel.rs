//! The pack kernel: rows → scales → quantized codes → native tiles, in parallel over N-tiles.

use crate::quant::{
    absmax_bits, f16_piece, is_non_finite, pack_nibbles, quantize_piece, row_scale, KT,
    TINY_ROW_FACTOR,
};
use crate::{PackDtype, PackError, PackedWeight, RowSource, TiledLayout};
use half::f16;
use rayon::prelude::*;

/// Pack a weight read through `src` into `dtype`'s RK3588 native layout, on the current rayon
/// pool (the global one unless called inside [`rayon::ThreadPool::install`]; see [`pack_in`]).
///
/// - `I8`: per output channel `scale = absmax / 127`, `q = round(w · 127/absmax)` in `-127..=127`.
/// - `I4`: per output channel `scale = absmax / 7`, `q` in `-7..=7` (the symmetric range: `-8` is
///   never produced), two codes per byte in the order of [`crate::INT4_EVEN_K_IN_LOW_NIBBLE`].
/// - `F16`: values rounded to fp16 (nearest-even), scales all 1.0.
///
/// Rounding is half-to-even; an all-zero row gets scale 0 and zero codes. K is padded to 32 and
/// N to the dtype's tile height with zeros.
///
/// # Errors
/// [`PackError::Shape`] for an empty or oversized shape, [`PackError::NonFinite`] if a row holds
/// NaN or ±Inf (one of the offending rows is named), [`PackError::F16Overflow`] if an fp16 row
/// holds a value beyond fp16's range, and whatever the source reports.
pub fn pack(src: &dyn RowSource, dtype: PackDtype) -> Result<PackedWeight, PackError> {
    let layout = layout_of(src, dtype)?;
    let mut data = vec![0u8; layout.blob_bytes()];
    let mut scales = vec![0f32; layout.n];
    pack_into(src, dtype, &mut data, &mut scales)?;
    Ok(PackedWeight {
        layout,
        data,
        scales,
    })
}

/// [`pack`] on the given thread pool.
///
/// # Errors
/// As [`pack`].
pub fn pack_in(
    pool: &rayon::ThreadPool,
    src: &dyn RowSource,
    dtype: PackDtype,
) -> Result<PackedWeight, PackError> {
    pool.install(|| pack(src, dtype))
}

/// [`pack`] into caller-provided buffers (e.g. a device buffer or a mapped cache file), which
/// must be exactly `layout.blob_bytes()` and `layout.n` long. Every byte of `data` is written,
/// padding included, so the buffers need not be zeroed.
///
/// # Errors
/// [`PackError::Length`] if a buffer has the wrong length, otherwise as [`pack`]. On error the
/// buffers hold partial output.
pub fn pack_into(
    src: &dyn RowSource,
    dtype: PackDtype,
    data: &mut [u8],
    scales: &mut [f32],
) -> Result<TiledLayout, PackError> {
    let layout = layout_of(src, dtype)?;
    expect_len("packed blob", layout.blob_bytes(), data.len())?;
    expect_len("scales", layout.n, scales.len())?;
    let tn = dtype.n_tile();
    data.par_chunks_mut(layout.n_tile_bytes())
        .zip(scales.par_chunks_mut(tn))
        .enumerate()
        .try_for_each_init(Vec::new, |scratch, (tile, (out, tile_scales))| {
            pack_tile(src, &layout, tile * tn, out, tile_scales, scratch)
        })?;
    Ok(layout)
}

/// The layout `src` packs into, with the shape checks every entry point needs.
pub(crate) fn layout_of(src: &dyn RowSource, dtype: PackDtype) -> Result<TiledLayout, PackError> {
    let (k, n) = (src.k(), src.n());
    let layout = TiledLayout::new(dtype, k, n);
    if k == 0 || n == 0 {
        return Err(PackError::Shape {
            k,
            n,
            reason: "empty weight",
        });
    }
    // Also bounds k·tn (one tile's scratch) since a tile is part of the blob.
    if layout.checked_blob_bytes().is_none() {
        return Err(PackError::Shape {
            k,
            n,
            reason: "packed size overflows usize",
        });
    }
    Ok(layout)
}

pub(crate) fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<(), PackError> {
    if expected == got {
        Ok(())
    } else {
        Err(PackError::Length {
            what,
            expected,
            got,
        })
    }
}

/// Bytes one K-tile piece of one row takes (32 values).
const fn piece_bytes(dtype: PackDtype) -> usize {
    match dtype {
        PackDtype::I8 => KT,
        PackDtype::I4 => KT / 2,
        PackDtype::F16 => 2 * KT,
    }
}

/// Pack output channels `first .. first + scales.len()` into the N-tile `out`
/// (`layout.n_tile_bytes()` long, laid out as `[k_tile][row in tile][32 values]`).
fn pack_tile(
    src: &dyn RowSource,
    layout: &TiledLayout,
    first: usize,
    out: &mut [u8],
    scales: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<(), PackError> {
    let (k, dtype) = (layout.k, layout.dtype);
    let rows = scales.len();
    let need = rows * k;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let buf = &mut scratch[..need];
    src.read_rows(first, buf)?;

    let pb = piece_bytes(dtype);
    let kt_stride = dtype.n_tile() * pb;
    for (r, row) in buf.chunks_exact_mut(k).enumerate() {
        let bits = absmax_bits(row);
        if is_non_finite(bits) {
            return Err(PackError::NonFinite { row: first + r });
        }
        let absmax = f32::from_bits(bits);
        let pieces = out
            .chunks_exact_mut(kt_stride)
            .map(|t| &mut t[r * pb..(r + 1) * pb]);
        match dtype {
            PackDtype::I8 | PackDtype::I4 => {
                let lim = if dtype == PackDtype::I8 { 127 } else { 7 };
                let s = row_scale(absmax, lim as f32);
                scales[r] = s.scale;
                if s.tiny {
                    row.iter_mut().for_each(|x| *x *= TINY_ROW_FACTOR);
                }
                if dtype == PackDtype::I8 {
                    for_each_piece(row, pieces, |src, dst| {
                        let q = quantize_piece(src, s.inv, lim);
                        for (d, q) in dst.iter_mut().zip(q) {
                            *d = q as u8;
                        }
                    });
                } else {
                    for_each_piece(row, pieces, |src, dst| {
                        pack_nibbles(&quantize_piece(src, s.inv, lim), dst)
                    });
                }
            }
            PackDtype::F16 => {
                if f16::from_f32(absmax).is_infinite() {
                    return Err(PackError::F16Overflow {
                        row: first + r,
                        value: absmax,
                    });
                }
                scales[r] = 1.0;
                for_each_piece(row, pieces, f16_piece);
            }
        }
    }
    // Padding rows of the last N-tile.
    for t in out.chunks_exact_mut(kt_stride) {
        t[rows * pb..].fill(0);
    }
    Ok(())
}

/// Run `encode` on each 32-value piece of `row` with its destination; a short last piece is
/// zero-padded (zero encodes to zero bytes in every dtype), and destinations past the row's
/// last piece (K padding) are zero-filled.
#[inline(always)]
fn for_each_piece<'a>(
    row: &[f32],
    mut dsts: impl Iterator<Item = &'a mut [u8]>,
    mut encode: impl FnMut(&[f32; KT], &mut [u8]),
) {
    let mut chunks = row.chunks_exact(KT);
    for (chunk, dst) in chunks.by_ref().zip(dsts.by_ref()) {
        let mut piece = [0f32; KT];
        piece.copy_from_slice(chunk);
        encode(&piece, dst);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        if let Some(dst) = dsts.next() {
            let mut piece = [0f32; KT];
            piece[..tail.len()].copy_from_slice(tail);
            encode(&piece, dst);
        }
    }
    for dst in dsts {
        dst.fill(0);
    }
}
