//! NEON float kernels: sixteen lanes in four q registers per activation row, `fmul` then
//! `fadd` (the scalar twin's order, `super::rows_scalar`); f16 widens with `fcvtl`, bf16 by a
//! 16-bit shift. Each weight chunk is widened once for up to four activation rows.

use super::super::neon::widen_f16;
use super::{finish, Bf16, Elem, RowsFn, WeightType, F16, F32};
use std::arch::aarch64::*;

/// Sixteen values widened to f32.
trait Load: Elem {
    /// # Safety
    /// `16 · BYTES` readable bytes at `p`.
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4];
}

impl Load for F32 {
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: 64 readable bytes (caller); unaligned loads.
        std::array::from_fn(|j| unsafe { vld1q_f32(p.add(16 * j).cast()) })
    }
}

impl Load for F16 {
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: 32 readable bytes (caller).
        let (h0, h1) = unsafe { (vld1q_u16(p.cast()), vld1q_u16(p.add(16).cast())) };
        let ((a, b), (c, d)) = (widen_f16(h0), widen_f16(h1));
        [a, b, c, d]
    }
}

impl Load for Bf16 {
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

/// One weight row against `N` activation rows.
///
/// # Safety
/// `wr` and every `ar[i]` hold the same whole number of values.
#[inline(always)]
unsafe fn row<E: Load, const N: usize>(wr: &[u8], ar: [&[u8]; N]) -> [f32; N] {
    let k = wr.len() / E::BYTES;
    let whole = k - k % 16;
    // SAFETY: register-only; NEON is the aarch64 baseline.
    let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 4]; N];
    for c in (0..whole).step_by(16) {
        // SAFETY: values c .. c + 16 <= whole lie inside every row.
        unsafe {
            let w = E::load16(wr.as_ptr().add(c * E::BYTES));
            for i in 0..N {
                let a = E::load16(ar[i].as_ptr().add(c * E::BYTES));
                for j in 0..4 {
                    acc[i][j] = vaddq_f32(acc[i][j], vmulq_f32(w[j], a[j]));
                }
            }
        }
    }
    std::array::from_fn(|i| {
        let mut lanes = [0f32; 16];
        for (j, v) in acc[i].iter().enumerate() {
            // SAFETY: 16 writable bytes at lane 4j.
            unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * j), *v) };
        }
        finish::<E>(lanes, wr, ar[i], whole)
    })
}

/// Safe entry (`RowsFn`): NEON is the aarch64 baseline, `Kernel::rows` checks the lengths.
fn entry<E: Load>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let rb = k * E::BYTES;
    let arow = |i: usize| &acts[i * rb..][..rb];
    for r in 0..rows {
        let wr = &w[r * rb..][..rb];
        let o = &mut out[r * m..][..m];
        let mut i = 0;
        while i + 4 <= m {
            let ix: [usize; 4] = std::array::from_fn(|j| i + j);
            // SAFETY: equal row lengths.
            o[i..i + 4].copy_from_slice(&unsafe { row::<E, 4>(wr, ix.map(arow)) });
            i += 4;
        }
        for (j, o) in o.iter_mut().enumerate().skip(i) {
            // SAFETY: as above.
            *o = unsafe { row::<E, 1>(wr, [arow(j)]) }[0];
        }
    }
}

/// The NEON kernel for `ty` (both aarch64 ISAs run it).
pub(super) fn rows(ty: WeightType) -> Option<RowsFn> {
    Some(match ty {
        WeightType::F32 => entry::<F32>,
        WeightType::F16 => entry::<F16>,
        WeightType::BF16 => entry::<Bf16>,
        _ => return None,
    })
}
