//! Symmetric per-row int8 quantization of activations: the quantizer of the device path's w8a8
//! matmuls (`ork_residency::DeviceMatmul`); the executor's `CpuW8A8Linear` still has its own
//! (see the note there).
//!
//! For a row `x`: `amax = max |x|`, `scale = amax / 127`, and each code is
//! `q = round(clamp(x · (127 / amax), -127, 127))`, rounding half away from zero (`f32::round`).
//! The reciprocal is `127 / amax`, one correctly rounded division (not `1 / scale`, which rounds
//! twice). Clamping before rounding gives the codes rounding first would: whatever rounds beyond
//! ±127 clamps to ±127 either way.
//!
//! **The NaN rule.** A row holding a NaN or an infinity has no scale: every code is 0 and the
//! returned scale is NaN, so the matmul's output for that row is NaN and the caller sees it (a
//! NaN is never read as 0). An all-zero row (either sign of zero) has scale 0 and all codes 0.
//!
//! [`quantize_row_i8_scalar`] is the scalar twin that fixes the result; the AVX2 and NEON loops
//! give the same codes and scale bit for bit (the maximum is exact in any order, and each code's
//! arithmetic is the same IEEE operations in the same order), checked by property tests on each
//! ISA (NEON under qemu-aarch64).

/// Quantize `x` into `q` (`x.len() == q.len()`) and return the scale (see the module docs for
/// the rule, NaN included), with AVX2 or NEON where the CPU has it.
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn quantize_row_i8(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_row_i8: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), the feature `avx2` is compiled for;
        // the lengths are equal (asserted above).
        return unsafe { avx2::quantize(x, q) };
    }
    #[cfg(target_arch = "aarch64")]
    return neon::quantize(x, q);
    #[cfg(not(target_arch = "aarch64"))]
    quantize_row_i8_scalar(x, q)
}

/// The scalar twin of [`quantize_row_i8`]: the same result on every CPU.
///
/// # Panics
/// If the lengths differ.
pub fn quantize_row_i8_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_row_i8: lengths differ");
    // Eight independent maxima so that the pass vectorizes even here (the maximum does not
    // depend on the order); NaN and infinity are looked for in the same pass, since `f32::max`
    // ignores NaN.
    const LANES: usize = 8;
    let (mut lanes, mut bad) = ([0f32; LANES], false);
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = lanes[l].max(c[l].abs());
            bad |= !c[l].is_finite();
        }
    }
    for v in tail {
        lanes[0] = lanes[0].max(v.abs());
        bad |= !v.is_finite();
    }
    let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
    finish(x, q, amax, bad, 0)
}

/// The shared end of every path: the special rows, the scale, and the codes of `x[from..]` (the
/// SIMD loops wrote `q[..from]`).
#[inline]
fn finish(x: &[f32], q: &mut [i8], amax: f32, bad: bool, from: usize) -> f32 {
    if bad || amax == 0.0 {
        q.fill(0);
        return if bad { f32::NAN } else { 0.0 };
    }
    let inv = 127.0 / amax;
    if !inv.is_finite() {
        // Only the scalar path reaches this (the SIMD loops check `inv` first): from == 0.
        const TWO64: f32 = (1u128 << 64) as f32;
        let inv = 127.0 / (amax * TWO64);
        for (o, v) in q.iter_mut().zip(x) {
            *o = code(*v * TWO64, inv) as i8;
        }
        return amax / 127.0;
    }
    for (o, v) in q[from..].iter_mut().zip(&x[from..]) {
        *o = code(*v, inv) as i8;
    }
    amax / 127.0
}

/// One code: `round(clamp(v · inv, -127, 127))` for a finite `v`.
#[inline]
fn code(v: f32, inv: f32) -> i32 {
    round_in_range((v * inv).clamp(-127.0, 127.0))
}

/// `y.round()` (half away from zero) for a finite `|y| ≤ 127`, in a form that vectorizes (`round`
/// is a libm call per value on a baseline x86-64 build) and that the SIMD loops repeat
/// instruction for instruction: `y as i32` truncates toward zero, `y - t` is exact for
/// `|y| < 2^23`, and the fraction decides the step away from zero.
#[inline]
fn round_in_range(y: f32) -> i32 {
    let t = y as i32;
    let f = y - t as f32;
    t + i32::from(f >= 0.5) - i32::from(f <= -0.5)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::quantize_row_i8_scalar`] with AVX2: eight values per step for the maximum,
    /// thirty-two per step for the codes, the rest by the scalar twin's own steps.
    ///
    /// # Safety
    /// The CPU must have AVX2, and `x.len() == q.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
        let (amax, bad) = amax(x);
        let inv = 127.0 / amax;
        if bad || !inv.is_finite() {
            return super::finish(x, q, amax, bad, 0);
        }
        let whole = x.len() - x.len() % 32;
        let (vinv, lo, hi) = (
            _mm256_set1_ps(inv),
            _mm256_set1_ps(-127.0),
            _mm256_set1_ps(127.0),
        );
        // `packs` interleaves 128-bit lanes; this puts the 32 codes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for i in (0..whole).step_by(32) {
            let code = |j: usize| {
                // SAFETY: i + j + 8 <= whole <= x.len(), so the 32 bytes read lie inside `x`;
                // `loadu` takes an unaligned address.
                let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i + j)) };
                let y = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, vinv), lo), hi);
                let t = _mm256_cvttps_epi32(y);
                let f = _mm256_sub_ps(y, _mm256_cvtepi32_ps(t));
                // A true comparison is -1 in every bit: t - (f >= 0.5) + (f <= -0.5).
                let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, _mm256_set1_ps(0.5)));
                let down =
                    _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, _mm256_set1_ps(-0.5)));
                _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
            };
            let ab = _mm256_packs_epi32(code(0), code(8));
            let cd = _mm256_packs_epi32(code(16), code(24));
            let codes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
            // SAFETY: i + 32 <= whole <= q.len() (== x.len()), so the 32 bytes written lie
            // inside `q`; `storeu` takes an unaligned address.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(i).cast::<__m256i>(), codes) };
        }
        super::finish(x, q, amax, false, whole)
    }

    /// The row's largest magnitude, and whether it holds a NaN or an infinity.
    #[target_feature(enable = "avx2")]
    fn amax(x: &[f32]) -> (f32, bool) {
        let whole = x.len() - x.len() % 8;
        let sign = _mm256_set1_ps(-0.0);
        let finite_max = _mm256_set1_ps(f32::MAX);
        let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= whole <= x.len(), so the 32 bytes read lie inside `x`; `loadu`
            // takes an unaligned address.
            let a = _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) });
            m = _mm256_max_ps(m, a);
            // Not-less-or-equal, unordered: true for NaN and for an infinity.
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLE_UQ>(a, finite_max));
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 f32, the 32 bytes written; `storeu` takes any address.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
        let mut is_bad = _mm256_movemask_ps(bad) != 0;
        let mut amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
        for v in &x[whole..] {
            amax = amax.max(v.abs());
            is_bad |= !v.is_finite();
        }
        (amax, is_bad)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// [`super::quantize_row_i8_scalar`] with NEON (the aarch64 baseline): four values per step
    /// for the maximum, sixteen per step for the codes, the rest by the scalar twin's own steps.
    ///
    /// # Panics
    /// If the lengths differ.
    pub(super) fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
        assert_eq!(x.len(), q.len(), "quantize_row_i8: lengths differ");
        let (amax, bad) = amax(x);
        let inv = 127.0 / amax;
        if bad || !inv.is_finite() {
            return super::finish(x, q, amax, bad, 0);
        }
        let whole = x.len() - x.len() % 16;
        for i in (0..whole).step_by(16) {
            let code = |j: usize| {
                // SAFETY: i + j + 4 <= whole <= x.len(), so the 16 bytes read lie inside `x`;
                // `ld1` takes an unaligned address; NEON is the aarch64 baseline.
                unsafe {
                    let v = vld1q_f32(x.as_ptr().add(i + j));
                    let y = vminq_f32(
                        vmaxq_f32(vmulq_n_f32(v, inv), vdupq_n_f32(-127.0)),
                        vdupq_n_f32(127.0),
                    );
                    let t = vcvtq_s32_f32(y);
                    let f = vsubq_f32(y, vcvtq_f32_s32(t));
                    // A true comparison is -1 in every bit: t - (f >= 0.5) + (f <= -0.5).
                    let up = vreinterpretq_s32_u32(vcgeq_f32(f, vdupq_n_f32(0.5)));
                    let down = vreinterpretq_s32_u32(vcleq_f32(f, vdupq_n_f32(-0.5)));
                    vqmovn_s32(vaddq_s32(vsubq_s32(t, up), down))
                }
            };
            // SAFETY: i + 16 <= whole <= q.len() (== x.len()), so the 16 bytes written lie
            // inside `q`; `st1` takes an unaligned address; NEON is the aarch64 baseline.
            unsafe {
                let lo = vqmovn_s16(vcombine_s16(code(0), code(4)));
                let hi = vqmovn_s16(vcombine_s16(code(8), code(12)));
                vst1q_s8(q.as_mut_ptr().add(i), vcombine_s8(lo, hi));
            }
        }
        super::finish(x, q, amax, false, whole)
    }

    /// The row's largest magnitude, and whether it holds a NaN or an infinity.
    fn amax(x: &[f32]) -> (f32, bool) {
        let whole = x.len() - x.len() % 4;
        // SAFETY (every block below): NEON is the aarch64 baseline; the only memory access is
        // the 16-byte read at i, i + 4 <= whole <= x.len(), inside `x` (`ld1` takes an
        // unaligned address).
        let (mut m, mut ok) = unsafe { (vdupq_n_f32(0.0), vdupq_n_u32(u32::MAX)) };
        for i in (0..whole).step_by(4) {
            // SAFETY: see above.
            unsafe {
                let a = vabsq_f32(vld1q_f32(x.as_ptr().add(i)));
                m = vmaxq_f32(m, a);
                // `a <= f32::MAX` is false for NaN and for an infinity.
                ok = vandq_u32(ok, vcleq_f32(a, vdupq_n_f32(f32::MAX)));
            }
        }
        // SAFETY: see above (register-only reductions).
        let (mut amax, mut bad) = unsafe { (vmaxvq_f32(m), vminvq_u32(ok) == 0) };
        if bad {
            // `fmax` of a NaN lane is NaN; the row is refused anyway.
            amax = 0.0;
        }
        for v in &x[whole..] {
            amax = amax.max(v.abs());
            bad |= !v.is_finite();
        }
        (amax, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A quantizer: codes into the slice, the scale returned.
    type Quantize = fn(&[f32], &mut [i8]) -> f32;

    /// Every path this CPU has, the scalar twin first.
    fn paths() -> Vec<(&'static str, Quantize)> {
        let mut v: Vec<(&'static str, Quantize)> = vec![("scalar", quantize_row_i8_scalar)];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2; the lengths are equal in every call below.
            v.push(("avx2", |x, q| unsafe { avx2::quantize(x, q) }));
        }
        #[cfg(target_arch = "aarch64")]
        v.push(("neon", neon::quantize));
        v.push(("dispatch", quantize_row_i8));
        v
    }

    /// Every path's codes and scale, checked against the scalar twin bit for bit.
    fn same_on_every_path(x: &[f32]) -> (Vec<i8>, f32) {
        let mut want = vec![0x55i8; x.len()];
        let s = quantize_row_i8_scalar(x, &mut want);
        for (name, f) in paths() {
            let mut got = vec![0x55i8; x.len()];
            let g = f(x, &mut got);
            assert_eq!(got, want, "{name}: codes of {x:?}");
            assert!(
                g.to_bits() == s.to_bits() || (g.is_nan() && s.is_nan()),
                "{name}: scale {g} vs {s}"
            );
        }
        (want, s)
    }

    #[test]
    fn the_stated_rule_on_every_path() {
        assert_eq!(
            same_on_every_path(&[0.0, -0.0, 0.0, 0.0]),
            (vec![0; 4], 0.0)
        );
        let (q, s) = same_on_every_path(&[-2.0, 1.0, 0.0, 2.0]);
        assert_eq!(q, [-127, 64, 0, 127]);
        assert_eq!(s, 2.0 / 127.0);
        // Half away from zero: 0.5 · 127 / 127 steps up, -0.5 steps down.
        let (q, _) = same_on_every_path(&[127.0, 0.5, -0.5, 1.5, -2.5, 126.5]);
        assert_eq!(q, [127, 1, -1, 2, -3, 127]);
        assert_eq!(same_on_every_path(&[]), (vec![], 0.0));
        // A row too small for `127 / amax`: the codes of the same row 2^64 times larger.
        let tiny = [
            1e-40f32, -5e-41, 0.0, 2e-45, 1e-40, 3e-41, -1e-40, 7e-41, 1e-41,
        ];
        let big: Vec<f32> = tiny.iter().map(|v| v * (1u128 << 64) as f32).collect();
        let (q, s) = same_on_every_path(&tiny);
        assert_eq!(q, same_on_every_path(&big).0);
        assert_eq!(q[0], 127);
        assert_eq!(s, 1e-40f32 / 127.0);
    }

    /// The NaN rule: a NaN or an infinity anywhere (in the SIMD body or the tail) gives scale
    /// NaN and all codes 0, never a NaN read as 0.
    #[test]
    fn a_nan_or_an_infinity_gives_a_nan_scale_and_zero_codes() {
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for len in [1, 5, 8, 17, 33, 64, 70] {
                for at in [0, len / 2, len - 1] {
                    let mut x: Vec<f32> = (0..len).map(|i| i as f32 - 3.5).collect();
                    x[at] = bad;
                    let (q, s) = same_on_every_path(&x);
                    assert!(s.is_nan(), "{bad} at {at} of {len}");
                    assert!(q.iter().all(|&c| c == 0));
                }
            }
        }
    }

    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => -1e4f32..1e4,
            2 => any::<f32>(),
            1 => Just(0.0f32),
            1 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
            1 => Just(f32::MAX),
            1 => Just(f32::MIN_POSITIVE / 8.0),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every ISA this CPU has gives the scalar twin's codes and scale, bit for bit, at every
        /// length (bodies and tails) and for every kind of value.
        #[test]
        fn simd_is_the_scalar_twin_bit_for_bit(x in proptest::collection::vec(value(), 0..200)) {
            let (q, s) = same_on_every_path(&x);
            if s.is_finite() && s > 1e-30 {
                // Every code is within half a step of its value.
                for (c, v) in q.iter().zip(&x) {
                    let (c, s, v) = (f64::from(*c), f64::from(s), f64::from(*v));
                    prop_assert!((c * s - v).abs() <= 0.5001 * s, "{c} · {s} vs {v}");
                }
            }
        }
    }

    /// The value next to `y` towards +∞ (`up`) or −∞.
    fn step(y: f32, up: bool) -> f32 {
        if up {
            y.next_up()
        } else {
            y.next_down()
        }
    }

    #[test]
    fn rounding_equals_round_at_every_integer_and_half_and_their_neighbours() {
        for i in -128..=128 {
            for base in [i as f32, i as f32 + 0.5] {
                for up in [false, true] {
                    let mut y = base;
                    for _ in 0..4 {
                        let c = y.clamp(-127.0, 127.0);
                        assert_eq!(
                            round_in_range(c),
                            y.round().clamp(-127.0, 127.0) as i32,
                            "{y}"
                        );
                        y = step(y, up);
                    }
                }
            }
        }
    }

    proptest! {
        /// Quantized codes equal `(x / scale).round()` clamped, the definition, for any row.
        #[test]
        fn quantize_row_equals_its_definition(x in proptest::collection::vec(-1e4f32..1e4, 1..300)) {
            let mut q = vec![0i8; x.len()];
            let scale = quantize_row_i8_scalar(&x, &mut q);
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            if amax == 0.0 {
                prop_assert_eq!(scale, 0.0);
            } else {
                let inv = 127.0 / amax;
                for (&c, &v) in q.iter().zip(&x) {
                    prop_assert_eq!(c, (v * inv).round().clamp(-127.0, 127.0) as i8, "{}", v);
                }
            }
        }

        /// The rounding equals `round` on any value in range.
        #[test]
        fn rounding_equals_round(y in -127f32..=127.0) {
            prop_assert_eq!(round_in_range(y), y.round() as i32);
        }
    }
}
