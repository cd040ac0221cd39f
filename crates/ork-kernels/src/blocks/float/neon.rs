//! NEON float kernels: sixteen lanes in four q registers per activation row, `fmul` then
//! `fadd` (the scalar twin's order, `super::rows_scalar`), or for f16 one `fmla`, which gives
//! the same bits because an f16 × f16 product is exact in f32 ([`Load::EXACT_PRODUCT`]); f16
//! widens with `fcvtl`, bf16 by a 16-bit shift. Each weight chunk is widened once for up to four activation rows.
//!
//! F16 on a core with fp16 arithmetic (FEAT_FP16) runs [`fp16`] instead, ggml's fp16
//! accumulation; this f32 kernel is its fallback (Cortex-A72/A53, the RK3576's cores).

use super::super::neon::widen_f16;
use super::{drive, finish, Bf16, Elem, RowsFn, Tile, WeightType, F16, F32};
use std::arch::aarch64::*;

mod fp16;
#[cfg(test)]
pub(super) use fp16::fmadd;

/// Sixteen values widened to f32.
trait Load: Elem {
    /// Whether every product of two values is exact in f32, so that a fused `fmla` rounds
    /// once, as `fmul` (exact) then `fadd` do: true for f16 (11-bit significands make a
    /// 22-bit product; exponents from 2⁻²⁴·2⁻²⁴ = 2⁻⁴⁸ to 65504² < 2³² stay in f32's normal
    /// range, so no product overflows or rounds, and a product of infinity and zero is NaN
    /// either way). Not for bf16 or f32, whose products can round, overflow or underflow.
    const EXACT_PRODUCT: bool;
    /// # Safety
    /// `16 · BYTES` readable bytes at `p`.
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4];
}

impl Load for F32 {
    const EXACT_PRODUCT: bool = false;
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: 64 readable bytes (caller); unaligned loads.
        unsafe {
            [
                vld1q_f32(p.cast()),
                vld1q_f32(p.add(16).cast()),
                vld1q_f32(p.add(32).cast()),
                vld1q_f32(p.add(48).cast()),
            ]
        }
    }
}

impl Load for F16 {
    const EXACT_PRODUCT: bool = true;
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: 32 readable bytes (caller).
        let (h0, h1) = unsafe { (vld1q_u16(p.cast()), vld1q_u16(p.add(16).cast())) };
        let ((a, b), (c, d)) = (widen_f16(h0), widen_f16(h1));
        [a, b, c, d]
    }
}

impl Load for Bf16 {
    const EXACT_PRODUCT: bool = false;
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: 32 readable bytes (caller); NEON is the aarch64 baseline.
        unsafe {
            let (h0, h1) = (vld1q_u16(p.cast()), vld1q_u16(p.add(16).cast()));
            let w = |h: uint16x4_t| vreinterpretq_f32_u32(vshll_n_u16::<16>(h));
            [
                w(vget_low_u16(h0)),
                w(vget_high_u16(h0)),
                w(vget_low_u16(h1)),
                w(vget_high_u16(h1)),
            ]
        }
    }
}

/// `R` weight rows against `N` activation rows (see the x86 twin of this function).
///
/// # Safety
/// Every `wr[j]` and `ar[i]` hold the same whole number of values.
unsafe fn tile<E: Load, const R: usize, const N: usize>(
    wr: [&[u8]; R],
    ar: [&[u8]; N],
) -> [[f32; N]; R] {
    let k = wr[0].len() / E::BYTES;
    let whole = k - k % 16;
    // SAFETY: register-only; NEON is the aarch64 baseline.
    let mut acc = [[[unsafe { vdupq_n_f32(0.0) }; 4]; N]; R];
    for c in (0..whole).step_by(16) {
        // SAFETY: values c .. c + 16 <= whole lie inside every row.
        unsafe {
            for j in 0..R {
                let w = E::load16(wr[j].as_ptr().add(c * E::BYTES));
                for i in 0..N {
                    let a = E::load16(ar[i].as_ptr().add(c * E::BYTES));
                    for l in 0..4 {
                        acc[j][i][l] = if E::EXACT_PRODUCT {
                            vfmaq_f32(acc[j][i][l], w[l], a[l])
                        } else {
                            vaddq_f32(acc[j][i][l], vmulq_f32(w[l], a[l]))
                        };
                    }
                }
            }
        }
    }
    let mut res = [[0f32; N]; R];
    for j in 0..R {
        for i in 0..N {
            let mut lanes = [0f32; 16];
            for (l, v) in acc[j][i].iter().enumerate() {
                // SAFETY: 16 writable bytes at lane 4l.
                unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * l), *v) };
            }
            res[j][i] = finish::<E>(lanes, wr[j], ar[i], whole);
        }
    }
    res
}

/// Safe entry (`RowsFn`): NEON is the aarch64 baseline, `Kernel::rows` checks the lengths.
fn entry<E: Load>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let t = (
        tile::<E, 4, 1> as Tile<4, 1>,
        tile::<E, 1, 4> as Tile<1, 4>,
        tile::<E, 1, 1> as Tile<1, 1>,
    );
    // SAFETY: see the doc comment.
    unsafe { drive(k * E::BYTES, w, rows, acts, m, out, t) }
}

/// The NEON kernel for `ty` (both aarch64 ISAs run it): for F16 the fp16-accumulating kernel
/// where the CPU has FEAT_FP16, else [`widening`]'s.
pub(super) fn rows(ty: WeightType) -> Option<RowsFn> {
    match ty {
        WeightType::F16 => fp16::rows().or_else(|| widening(ty)),
        _ => widening(ty),
    }
}

/// The kernel that widens to f32 (the scalar twin's order, `super::rows_scalar`), on every
/// aarch64 CPU.
pub(super) fn widening(ty: WeightType) -> Option<RowsFn> {
    Some(match ty {
        WeightType::F32 => entry::<F32>,
        WeightType::F16 => entry::<F16>,
        WeightType::BF16 => entry::<Bf16>,
        _ => return None,
    })
}
