//! [`super::dots`]' body, one or two heads at once, with NEON's `fmla` (baseline Advanced SIMD on aarch64): LLVM
//! vectorizes the portable loop across the four keys instead of along each key's lanes (a
//! transpose of every load), so the lanes are spelled here. Lane `l` of key `r` is the portable
//! loop's fused chain (`vfmaq_f32(a, b, c)` is `a + b·c` rounded once per lane), and the lanes
//! are summed in the same order, four keys at once after a transpose: the same bits, which the
//! module's tests check. Out of line, so that `scripts/kernel_cycles.py` finds it by name.

use core::arch::aarch64::*;

use super::{KEYS, LANES};

/// Each key's dot product with each query row `q[h]` over `q[h][..body]` (`body` a multiple of
/// [`LANES`], every row at least `body` long): [`LANES`] fused chains, summed in lane order from
/// `0.0`. `H` query rows (heads) at once share each key load: with two, a pass of eight values
/// makes 16 `fmla` of six paired loads.
#[inline(never)]
pub(super) fn sums<const H: usize>(
    q: [&[f32]; H],
    k: [&[f32]; KEYS],
    body: usize,
) -> [[f32; KEYS]; H] {
    assert!(body.is_multiple_of(LANES));
    assert!(q.iter().all(|q| q.len() >= body) && k.iter().all(|k| k.len() >= body));
    let mut out = [[0.0f32; KEYS]; H];
    // SAFETY: every load reads `[c, c + 8)` with `c + 8 <= body`, within each query row and
    // each key row (asserted above); the stores write the four floats of each `out[h]`.
    // Advanced SIMD is baseline on aarch64.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        // a[h][2r]: head h, key r's lanes 0..4; a[h][2r + 1]: its lanes 4..8.
        let mut a = [[zero; 2 * KEYS]; H];
        let (qp, kp) = (q.map(|q| q.as_ptr()), k.map(|k| k.as_ptr()));
        let mut c = 0;
        while c < body {
            let x = qp.map(|p| (vld1q_f32(p.add(c)), vld1q_f32(p.add(c + 4))));
            for r in 0..KEYS {
                let (y0, y1) = (vld1q_f32(kp[r].add(c)), vld1q_f32(kp[r].add(c + 4)));
                for h in 0..H {
                    a[h][2 * r] = vfmaq_f32(a[h][2 * r], x[h].0, y0);
                    a[h][2 * r + 1] = vfmaq_f32(a[h][2 * r + 1], x[h].1, y1);
                }
            }
            c += LANES;
        }
        for (o, a) in out.iter_mut().zip(&a) {
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
            vst1q_f32(o.as_mut_ptr(), s);
        }
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

/// Values a [`weighted2`] call sums per head.
pub(super) const SPAN2: usize = 32;

/// Two heads' weighted sums of [`SPAN2`] values of the value rows at `rows` (row `r`'s values
/// `values[r·d + off..][..SPAN2]`): `out[h][l] = Σ_j (w[h][j] · inv[h]) · value`, fused, rows
/// in order — the portable loop's chain for each value. The two heads share each row's loads.
#[inline(never)]
pub(super) fn weighted2(
    w: [&[f32]; 2],
    inv: [f32; 2],
    values: &[f32],
    d: usize,
    off: usize,
    rows: &[usize],
) -> [[f32; SPAN2]; 2] {
    let n = rows.len();
    let w = w.map(|w| &w[..n]);
    let mut out = [[0.0f32; SPAN2]; 2];
    // SAFETY: each row's loads read `v`, a bounds-checked slice of `SPAN2` floats; the stores
    // write the `SPAN2` floats of each `out[h]`. Advanced SIMD is baseline on aarch64.
    unsafe {
        let mut a = [[vdupq_n_f32(0.0); SPAN2 / 4]; 2];
        for (j, &r) in rows.iter().enumerate() {
            let v = values[r * d + off..][..SPAN2].as_ptr();
            let s = [w[0][j] * inv[0], w[1][j] * inv[1]];
            let [a0, a1] = &mut a;
            for (i, (a0, a1)) in a0.iter_mut().zip(a1.iter_mut()).enumerate() {
                let x = vld1q_f32(v.add(4 * i));
                *a0 = vfmaq_n_f32(*a0, x, s[0]);
                *a1 = vfmaq_n_f32(*a1, x, s[1]);
            }
        }
        for (o, a) in out.iter_mut().zip(&a) {
            for (i, a) in a.iter().enumerate() {
                vst1q_f32(o.as_mut_ptr().add(4 * i), *a);
            }
        }
    }
    out
}
