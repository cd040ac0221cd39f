//! The per-tile work after decoding: each row's absmax and scale, its codes, and the scatter of
//! its 32-value pieces into the tile. Safe code written to autovectorize; [`crate::dispatch`]
//! compiles it for the baseline target and, on x86-64, again with AVX2.

use crate::quant::{
    absmax_bits, f16_piece, is_non_finite, quantize_i4, quantize_i8, row_scale, KT, TINY_ROW_FACTOR,
};
use crate::{PackDtype, PackError, TiledLayout};
use half::f16;

/// Bytes one 32-value piece of one row takes.
pub(crate) const fn piece_bytes(dtype: PackDtype) -> usize {
    match dtype {
        PackDtype::I8 => KT,
        PackDtype::I4 => KT / 2,
        PackDtype::F16 => 2 * KT,
    }
}

/// Encode the decoded rows `rows` (`scales.len()` rows of `layout.k` values, output channels
/// `first ..`) into the N-tile `out` (`layout.n_tile_bytes()` long, laid out as
/// `[k_tile][row in tile][32 values]`), writing every byte of `out` including padding, and their
/// scales into `scales`. Rows may be modified (tiny rows are rescaled in place).
// On aarch64 only the twin tests call it (the `fcvtn` pieces run there).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
#[inline(always)]
pub(crate) fn encode_tile(
    layout: &TiledLayout,
    first: usize,
    rows: &mut [f32],
    out: &mut [u8],
    scales: &mut [f32],
) -> Result<(), PackError> {
    encode_tile_with(layout, first, rows, out, scales, f16_piece)
}

/// [`encode_tile`] with fp16 pieces written by `f16_piece` (same contract as
/// [`crate::quant::f16_piece`]: 32 finite values within fp16's range to 64 little-endian bytes,
/// round-to-nearest-even), so that an ISA's own conversion can stand in for `half`'s.
#[inline(always)]
pub(crate) fn encode_tile_with(
    layout: &TiledLayout,
    first: usize,
    rows: &mut [f32],
    out: &mut [u8],
    scales: &mut [f32],
    mut f16_piece: impl FnMut(&[f32], &mut [u8]),
) -> Result<(), PackError> {
    let (k, dtype) = (layout.k, layout.dtype);
    let pb = piece_bytes(dtype);
    let kt_stride = dtype.n_tile() * pb;
    for (r, row) in rows.chunks_exact_mut(k).enumerate() {
        let bits = absmax_bits(row);
        if is_non_finite(bits) {
            return Err(PackError::NonFinite { row: first + r });
        }
        let absmax = f32::from_bits(bits);
        // Above fp16's range for every dtype: such a weight is in no model, and its scale would
        // lie beyond what readers accept (`MAX_SCALE`).
        check_f16_range(absmax, first + r)?;
        let pieces = out.chunks_exact_mut(kt_stride).map(
            #[inline(always)]
            |t| &mut t[r * pb..(r + 1) * pb],
        );
        match dtype {
            PackDtype::I8 | PackDtype::I4 => {
                let lim = if dtype == PackDtype::I8 { 127.0 } else { 7.0 };
                let s = row_scale(absmax, lim);
                scales[r] = s.scale;
                if s.tiny {
                    row.iter_mut().for_each(|x| *x *= TINY_ROW_FACTOR);
                }
                if dtype == PackDtype::I8 {
                    // `inline(always)` on the closures: they are defined here, not in the AVX2
                    // wrapper, and must be inlined into it to be compiled with its features.
                    for_each_piece(
                        row,
                        pieces,
                        #[inline(always)]
                        |src, dst| quantize_i8(src, s.inv, dst),
                    );
                } else {
                    for_each_piece(
                        row,
                        pieces,
                        #[inline(always)]
                        |src, dst| quantize_i4(src, s.inv, dst),
                    );
                }
            }
            PackDtype::F16 => {
                scales[r] = 1.0;
                for_each_piece(row, pieces, &mut f16_piece);
            }
        }
    }
    // Padding rows of the last N-tile.
    let used = scales.len() * pb;
    for t in out.chunks_exact_mut(kt_stride) {
        t[used..].fill(0);
    }
    Ok(())
}

/// Run `encode` on each 32-value piece of `row` with its destination; a short last piece is
/// zero-padded (zero encodes to zero bytes in every dtype), and destinations past the row's
/// last piece (there are none: a row has `Kpad / 32` pieces) would be zero-filled.
#[inline(always)]
fn for_each_piece<'a>(
    row: &[f32],
    mut dsts: impl Iterator<Item = &'a mut [u8]>,
    mut encode: impl FnMut(&[f32], &mut [u8]),
) {
    let mut chunks = row.chunks_exact(KT);
    for (chunk, dst) in chunks.by_ref().zip(dsts.by_ref()) {
        encode(chunk, dst);
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

/// Refuse output channel `row` whose largest magnitude `absmax` is beyond fp16's range (it would
/// become ±Inf as fp16, and its scale would lie beyond [`crate::MAX_SCALE`]), for every dtype.
#[inline(always)]
pub(crate) fn check_f16_range(absmax: f32, row: usize) -> Result<(), PackError> {
    if f16::from_f32(absmax).is_infinite() {
        return Err(PackError::F16Overflow { row, value: absmax });
    }
    Ok(())
}
