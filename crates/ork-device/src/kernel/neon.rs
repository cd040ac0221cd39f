//! NEON kernel (aarch64): `smull` widens i8 products to i16 (exact: |a·w| ≤ 16384), `sadalp`
//! pairwise-adds them into i32 lanes (exact). Compiled for aarch64 only; it has NOT been run in
//! ork's development environment (x86-64) — its proptest runs on the first aarch64 build.
//! Scalar twin: [`super::scalar_tile_dot`].

use std::arch::aarch64::*;

/// Safe entry: checks shapes (NEON is mandatory on aarch64).
pub(super) fn tile_dot(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad % 32 == 0 && a.len() == rows * kpad && w.len() == tn * kpad && out.len() >= rows * tn
    );
    // SAFETY: shapes checked; NEON is part of the aarch64 baseline.
    unsafe { tile_dot_neon(a, kpad, w, tn, out) }
}

/// # Safety
/// `a` is `rows × kpad` i8, `w` is `tn × kpad` i8 in tile order, `kpad % 32 == 0`,
/// `out.len() ≥ rows · tn`.
#[target_feature(enable = "neon")]
unsafe fn tile_dot_neon(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    for r in 0..rows {
        for j in 0..tn {
            let mut acc = vdupq_n_s32(0);
            for kt in 0..kpad / 32 {
                // SAFETY: the 32-byte runs of row r / channel j at k-tile kt lie inside `a` / `w`.
                unsafe {
                    let pa = a.as_ptr().add(r * kpad + kt * 32);
                    let pw = w.as_ptr().add(kt * tn * 32 + j * 32);
                    for h in 0..2 {
                        let av = vld1q_s8(pa.add(16 * h));
                        let wv = vld1q_s8(pw.add(16 * h));
                        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(av), vget_low_s8(wv)));
                        acc = vpadalq_s16(acc, vmull_high_s8(av, wv));
                    }
                }
            }
            out[r * tn + j] = vaddvq_s32(acc);
        }
    }
}
