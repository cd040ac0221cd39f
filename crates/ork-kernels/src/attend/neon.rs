//! [`super::dot4`]'s body with NEON's `fmla` (baseline Advanced SIMD on aarch64): LLVM
//! vectorizes the portable loop across the four keys instead of along each key's lanes (a
//! transpose of every load), so the lanes are spelled here. Lane `l` of key `r` is the portable
//! loop's fused chain (`vfmaq_f32(a, b, c)` is `a + b·c` rounded once per lane), and the lanes
//! are summed in the same order, four keys at once after a transpose: the same bits, which the
//! module's tests check. Out of line, so that `scripts/kernel_cycles.py` finds it by name.

use core::arch::aarch64::*;

use super::{KEYS, LANES};

/// Each key's dot product with `q` over `q[..body]` (`body` a multiple of [`LANES`], every row
/// at least `body` long): [`LANES`] fused chains, summed in lane order from `0.0`.
#[inline(never)]
pub(super) fn sums4(q: &[f32], k: [&[f32]; KEYS], body: usize) -> [f32; KEYS] {
    assert!(body % LANES == 0 && q.len() >= body && k.iter().all(|k| k.len() >= body));
    let mut out = [0.0f32; KEYS];
    // SAFETY: every load reads `[c, c + 8)` with `c + 8 <= body`, within `q` and each key row
    // (asserted above); the store writes the four floats of `out`. Advanced SIMD is baseline
    // on aarch64.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        // a[2r]: key r's lanes 0..4; a[2r + 1]: its lanes 4..8.
        let mut a = [zero; 2 * KEYS];
        let (qp, kp) = (q.as_ptr(), k.map(|k| k.as_ptr()));
        let mut c = 0;
        while c < body {
            let x0 = vld1q_f32(qp.add(c));
            let x1 = vld1q_f32(qp.add(c + 4));
            for r in 0..KEYS {
                a[2 * r] = vfmaq_f32(a[2 * r], x0, vld1q_f32(kp[r].add(c)));
                a[2 * r + 1] = vfmaq_f32(a[2 * r + 1], x1, vld1q_f32(kp[r].add(c + 4)));
            }
            c += LANES;
        }
        // Lane l of every key side by side, then summed lane after lane: each key's order.
        let [l0, l1, l2, l3] = transpose(a[0], a[2], a[4], a[6]);
        let [l4, l5, l6, l7] = transpose(a[1], a[3], a[5], a[7]);
        let mut s = vaddq_f32(zero, l0);
        s = vaddq_f32(s, l1);
        s = vaddq_f32(s, l2);
        s = vaddq_f32(s, l3);
        s = vaddq_f32(s, l4);
        s = vaddq_f32(s, l5);
        s = vaddq_f32(s, l6);
        s = vaddq_f32(s, l7);
        vst1q_f32(out.as_mut_ptr(), s);
    }
    out
}

/// Columns of the 4 × 4 matrix whose rows are `r0..r3`: `[c0, c1, c2, c3]`, `c_l` holding lane
/// `l` of each row in row order.
#[inline(always)]
fn transpose(
    r0: float32x4_t,
    r1: float32x4_t,
    r2: float32x4_t,
    r3: float32x4_t,
) -> [float32x4_t; 4] {
    // SAFETY: register-only baseline Advanced SIMD operations.
    unsafe {
        let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
        let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
        let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
        let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
        [
            vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)),
            vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)),
        ]
    }
}
