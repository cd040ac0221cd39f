//! Per-output-channel symmetric quantization of one row, 32 values (one K-tile) at a time.
//!
//! The definition the kernel implements, and the tests' naive reference re-derives:
//!
//! ```text
//! absmax = max |w[n, k]|            (0 → scale 0, every q 0)
//! lim    = 127 (int8) | 7 (int4)
//! scale  = absmax / lim             (f32)
//! inv    = lim / absmax             (f32)
//! q      = clamp(round_ties_even(w · inv), -lim, lim)
//! ```
//!
//! Rounding is IEEE round-half-to-even (the FPU's own mode, also numpy's `round`); it costs one
//! add with a magic constant instead of a call to `roundf`, and it vectorizes on plain SSE2.
//! The range is symmetric (`-lim..=lim`): int4 leaves `-8` unused so that a value and its
//! negation always quantize to negated codes and `absmax` maps to exactly `±lim`.
//!
//! A row whose `lim / absmax` overflows f32 (absmax below about 4e-37, so only subnormal or
//! near-subnormal rows) is first multiplied by 2⁶⁴. The power-of-two scaling is exact, so the
//! codes are the ones an f32 without an exponent limit would give.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Values per K-tile: every layout tiles K by 32.
pub(crate) const KT: usize = 32;

/// `1.5 · 2²³`: for |y| < 2²², `y + MAGIC` has exponent 23, so its low mantissa bits hold
/// `round_ties_even(y)` offset by `2²²`.
const MAGIC: f32 = 12_582_912.0;

/// Exact power of two applied to rows too small for `lim / absmax` to be finite (see module docs).
pub(crate) const TINY_ROW_FACTOR: f32 = 18_446_744_073_709_551_616.0; // 2^64

/// Bits of the largest `|x|` of a row, compared as integers (non-negative IEEE floats order like
/// their bit patterns). A result `>= 0x7f80_0000` means the row holds NaN or ±Inf.
#[inline]
pub(crate) fn absmax_bits(row: &[f32]) -> u32 {
    // Integer max reduction: vectorizes, unlike an f32 max (whose NaN rules forbid reassociation).
    // With the sign bit cleared the bits are non-negative as i32, so the signed max (one SSE2
    // compare, `pmaxsd` from SSE4.1 on) orders them correctly.
    row.iter()
        .fold(0i32, |m, &x| m.max((x.to_bits() & 0x7fff_ffff) as i32)) as u32
}

/// Whether absmax bits denote a non-finite value.
#[inline]
pub(crate) const fn is_non_finite(bits: u32) -> bool {
    bits >= 0x7f80_0000
}

/// The per-row parameters of [`quantize_i8`] / [`quantize_i4`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowScale {
    /// Scale stored in the packed weight (`absmax / lim`).
    pub scale: f32,
    /// Multiplier applied to each value (`lim / absmax`, 0 for a zero row).
    pub inv: f32,
    /// Whether the row must first be multiplied by [`TINY_ROW_FACTOR`].
    pub tiny: bool,
}

/// Scale of a finite row with the given absmax for the symmetric range `±lim`.
#[inline]
pub(crate) fn row_scale(absmax: f32, lim: f32) -> RowScale {
    if absmax == 0.0 {
        return RowScale {
            scale: 0.0,
            inv: 0.0,
            tiny: false,
        };
    }
    let scale = absmax / lim;
    let inv = lim / absmax;
    if inv.is_finite() {
        RowScale {
            scale,
            inv,
            tiny: false,
        }
    } else {
        RowScale {
            scale,
            inv: lim / (absmax * TINY_ROW_FACTOR),
            tiny: true,
        }
    }
}

/// `clamp(round_ties_even(x · inv), -lim, lim)` as the bits of `MAGIC + q`: the low byte is `q`
/// in two's complement (the low byte of [`MAGIC`]'s bits is zero), so the code is a truncation
/// away, with no float-to-int conversion.
///
/// Requires `|x · inv| < 2²²`, which holds for every value of a row whose `inv` came from
/// [`row_scale`]: the products stay within `lim · (1 + 2⁻²²)`, so the clamp is a guard that never
/// changes a code. It is written as compare-and-select so that it compiles to `minps`/`maxps`.
#[inline(always)]
fn code_bits(x: f32, inv: f32, lim: f32) -> u32 {
    let y = x * inv;
    let y = if y < -lim { -lim } else { y };
    let y = if y > lim { lim } else { y };
    (y + MAGIC).to_bits()
}

/// The int8 codes of 32 values (the first 32 of `src`) into `dst[..32]`.
#[inline(always)]
pub(crate) fn quantize_i8(src: &[f32], inv: f32, dst: &mut [u8]) {
    for (d, &x) in dst[..KT].iter_mut().zip(&src[..KT]) {
        *d = code_bits(x, inv, 127.0) as u8;
    }
}

/// The int4 codes of 32 values packed two per byte into `dst[..16]`: elements `2j` and `2j+1`
/// share byte `j`; which one takes the low nibble is [`crate::INT4_EVEN_K_IN_LOW_NIBBLE`].
#[inline(always)]
pub(crate) fn quantize_i4(src: &[f32], inv: f32, dst: &mut [u8]) {
    let mut nib = [0u8; KT];
    for (d, &x) in nib.iter_mut().zip(&src[..KT]) {
        *d = code_bits(x, inv, 7.0) as u8 & 0xF;
    }
    // Each pair as one little-endian u16 `even | odd << 8`, folded into a byte with shifts: a
    // plain 16-bit lane operation, where picking even and odd bytes apart does not vectorize.
    for (d, pair) in dst[..KT / 2].iter_mut().zip(nib.chunks_exact(2)) {
        let v = u16::from_le_bytes([pair[0], pair[1]]);
        *d = if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
            (v | (v >> 4)) as u8
        } else {
            ((v << 4) | (v >> 8)) as u8
        };
    }
}

/// The two codes of one int4 byte, sign-extended, in element order (even element first).
#[inline]
pub(crate) fn unpack_nibbles(b: u8) -> [i8; 2] {
    let lo = ((b << 4) as i8) >> 4;
    let hi = (b as i8) >> 4;
    if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
        [lo, hi]
    } else {
        [hi, lo]
    }
}

/// 32 f32 values (the first 32 of `src`) to little-endian fp16 bytes in `dst[..64]`,
/// round-to-nearest-even.
// On aarch64 only the twin tests call it (the `fcvtn` pieces run there).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
#[inline(always)]
pub(crate) fn f16_piece(src: &[f32], dst: &mut [u8]) {
    let mut h = [f16::ZERO; KT];
    h.convert_from_f32_slice(&src[..KT]);
    for (d, v) in dst[..2 * KT].chunks_exact_mut(2).zip(h) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_rounding_is_round_ties_even() {
        let mut src = [0f32; KT];
        let probes = [
            0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 126.5, -126.5, 127.0, -127.0, 127.4,
            3.0000002, -0.0, 1e-30, -64.50001, 100.25, 7.5, -7.5,
        ];
        src[..probes.len()].copy_from_slice(&probes);
        let mut q = [0u8; KT];
        quantize_i8(&src, 1.0, &mut q);
        for (x, got) in src.iter().zip(q) {
            assert_eq!(
                got as i8 as f32,
                x.round_ties_even().clamp(-127.0, 127.0),
                "x={x}"
            );
        }
    }

    #[test]
    fn clamp_applies_to_limit() {
        let mut src = [8.4f32; KT];
        src[1] = -9.0;
        let mut q = [0u8; KT / 2];
        quantize_i4(&src, 1.0, &mut q);
        assert_eq!(unpack_nibbles(q[0]), [7, -7]);
        assert!(q[1..].iter().all(|&b| unpack_nibbles(b) == [7, 7]));
        let mut q8 = [0u8; KT];
        quantize_i8(&[1e3; KT], 1.0, &mut q8);
        assert!(q8.iter().all(|&v| v == 127));
    }

    #[test]
    fn nibbles_roundtrip() {
        let src: Vec<f32> = (0..KT).map(|i| (i % 15) as f32 - 7.0).collect();
        let mut bytes = [0u8; KT / 2];
        quantize_i4(&src, 1.0, &mut bytes);
        let back: Vec<f32> = bytes
            .iter()
            .flat_map(|&b| unpack_nibbles(b))
            .map(f32::from)
            .collect();
        assert_eq!(back, src);
        // The documented order: element 0 in the low nibble.
        let low = if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
            bytes[0] & 0xF
        } else {
            bytes[0] >> 4
        };
        assert_eq!(low, (-7i8 as u8) & 0xF);
    }

    #[test]
    fn absmax_bits_flags_non_finite() {
        assert!(!is_non_finite(absmax_bits(&[1.0, -3.0, f32::MAX])));
        assert_eq!(f32::from_bits(absmax_bits(&[1.0, -3.0, 2.0])), 3.0);
        assert!(is_non_finite(absmax_bits(&[1.0, f32::NAN])));
        assert!(is_non_finite(absmax_bits(&[f32::NEG_INFINITY])));
        assert_eq!(absmax_bits(&[-0.0, 0.0]), 0);
    }

    #[test]
    fn tiny_rows_use_exact_rescaling() {
        let absmax = f32::from_bits(1); // smallest subnormal
        let s = row_scale(absmax, 127.0);
        assert!(s.tiny && s.inv.is_finite());
        let mut src = [0f32; KT];
        src[0] = absmax * TINY_ROW_FACTOR;
        src[1] = -absmax * TINY_ROW_FACTOR;
        let mut q = [0u8; KT];
        quantize_i8(&src, s.inv, &mut q);
        assert_eq!((q[0] as i8, q[1] as i8, q[2]), (127, -127, 0));
    }
}
