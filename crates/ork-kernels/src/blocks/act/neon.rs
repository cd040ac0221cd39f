//! NEON Q8_0 / Q8_1 quantizers: the scalar twin's arithmetic (`super::q8_scalar`) four lanes at
//! a time: `fmul` by the block's `id`, `fcvtns` (round to nearest even), saturating narrows.
//! (ork's `id = 127 / amax` is ggml's x86 formula, not its NEON `1 / d`: module docs of `act`.)

use super::{header, scale};
use std::arch::aarch64::*;

pub(super) fn q8_0(x: &[f32], dst: &mut [u8]) {
    q8_neon(x, dst, false)
}

pub(super) fn q8_1(x: &[f32], dst: &mut [u8]) {
    q8_neon(x, dst, true)
}

/// NEON is the aarch64 baseline, so this needs no detection.
fn q8_neon(x: &[f32], dst: &mut [u8], sum: bool) {
    let bytes = if sum { 36 } else { 34 };
    for (xb, yb) in x.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
        let (q, sc) = block(xb);
        let qsum = q.iter().map(|&q| q as i32).sum();
        yb[bytes - 32..].copy_from_slice(&q.map(|q| q as u8));
        header(yb, sc.map(|(d, _)| d), qsum, sum);
    }
}

/// One block of 32: its int8 and its `scale`.
#[inline(always)]
fn block(xb: &[f32]) -> ([i8; 32], Option<(f32, f32)>) {
    let mut q = [0i8; 32];
    // SAFETY: `xb` holds 32 floats (eight unaligned loads of four), `q` 32 bytes (two stores);
    // the rest is register-only NEON, the aarch64 baseline.
    let sc = unsafe {
        let v: [float32x4_t; 8] = std::array::from_fn(|j| vld1q_f32(xb[4 * j..].as_ptr()));
        let a = v.map(|v| vabsq_f32(v));
        // Ordered `< inf` is false for NaN and ±inf.
        let inf = vdupq_n_f32(f32::INFINITY);
        let fin = a.iter().fold(vdupq_n_u32(u32::MAX), |f, a| {
            vandq_u32(f, vcltq_f32(*a, inf))
        });
        let m = a.iter().fold(vdupq_n_f32(0.0), |m, a| vmaxq_f32(m, *a));
        let sc = scale(vmaxvq_f32(m), vminvq_u32(fin) == u32::MAX);
        if let Some((_, id)) = sc {
            let i = v.map(|v| vcvtnq_s32_f32(vmulq_n_f32(v, id)));
            let h: [int16x8_t; 4] = std::array::from_fn(|j| {
                vcombine_s16(vqmovn_s32(i[2 * j]), vqmovn_s32(i[2 * j + 1]))
            });
            vst1q_s8(
                q.as_mut_ptr(),
                vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])),
            );
            vst1q_s8(
                q[16..].as_mut_ptr(),
                vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])),
            );
        }
        sc
    };
    (q, sc)
}
