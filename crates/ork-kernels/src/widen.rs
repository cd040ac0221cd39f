//! f16 → f32 for the KV cache, eight values at a time with F16C where the CPU has it, and with
//! NEON's `fcvtl`/`fcvtl2` on aarch64.
//!
//! `half`'s slice conversion calls its F16C routine through a function pointer for every eight
//! values; at a few hundred thousand values per decoded token (an f16 cache read by attention)
//! that call is most of the cost, so the loop lives here, compiled for F16C. On aarch64 the
//! conversion instructions are part of the baseline (Armv8.0 Advanced SIMD; FEAT_FP16 adds half
//! precision arithmetic, which this does not use), so that loop needs no detection; it was tested
//! under qemu-aarch64 only, not timed (`docs/kernels.md`). The conversion is exact either way
//! (every f16 is an f32), so the results never depend on the path.

use half::f16;

/// `dst[i] = src[i]` as f32 (`src.len() == dst.len()`).
#[inline]
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has F16C and AVX (checked just above), the features `f16c` is
        // compiled for.
        unsafe { f16c(src, dst) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    fcvtl(src, dst);
    #[cfg(not(target_arch = "aarch64"))]
    portable(src, dst);
}

/// Without F16C (and the scalar twin of both SIMD loops): `half`'s slice conversion, which uses
/// the CPU's conversion instructions where it finds them.
// On aarch64 only the tests call it (the `fcvtl` loop always runs there).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
fn portable(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let whole = src.len() - src.len() % 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= src.len() == dst.len() (asserted by the caller), so the 16
        // bytes read from `src` and the 32 written to `dst` lie inside them; both intrinsics
        // take unaligned addresses.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for (d, s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = s.to_f32();
    }
}

/// The eight f16 in `h` as two f32 vectors (`fcvtl` widens the low four halves, `fcvtl2` the
/// high four; both Armv8.0 Advanced SIMD, always present on aarch64; their intrinsics,
/// `vcvt_f32_f16`/`vcvt_high_f32_f16`, are stable only from Rust 1.94, above the workspace's
/// minimum). Exact. The block kernels use it too (`blocks::neon`).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn widen_f16(
    h: std::arch::aarch64::uint16x8_t,
) -> (
    std::arch::aarch64::float32x4_t,
    std::arch::aarch64::float32x4_t,
) {
    use std::arch::aarch64::float32x4_t;
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register-only instructions of the aarch64 baseline.
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    (lo, hi)
}

/// The aarch64 loop: eight halves at a time through [`widen_f16`].
#[cfg(target_arch = "aarch64")]
fn fcvtl(src: &[f16], dst: &mut [f32]) {
    use std::arch::aarch64::{vld1q_u16, vst1q_f32};
    assert_eq!(src.len(), dst.len());
    let whole = src.len() - src.len() % 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= src.len() == dst.len() (asserted above), so the 16 bytes read
        // from `src` (an f16 is a u16 in memory) and the 32 written to `dst` lie inside them;
        // `ld1`/`st1` take unaligned addresses; NEON is part of the aarch64 baseline.
        unsafe {
            let (lo, hi) = widen_f16(vld1q_u16(src.as_ptr().add(i).cast::<u16>()));
            vst1q_f32(dst.as_mut_ptr().add(i), lo);
            vst1q_f32(dst.as_mut_ptr().add(i + 4), hi);
        }
    }
    for (d, s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = s.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    /// Every f16 bit pattern (NaNs, infinities, subnormals included), at every remainder
    /// length, widens to what `half`'s scalar conversion gives, on this CPU's path and on the
    /// portable one.
    #[test]
    fn widening_is_half_s_conversion_for_every_value() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut got = vec![0.0f32; all.len()];
        let mut portable = vec![0.0f32; all.len()];
        super::f16_to_f32(&all, &mut got);
        super::portable(&all, &mut portable);
        for ((h, g), p) in all.iter().zip(&got).zip(&portable) {
            let want = h.to_f32();
            for g in [g, p] {
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "{:#06x}: {g} vs {want}",
                    h.to_bits()
                );
            }
        }
        for len in 0..20 {
            let mut d = vec![0.0f32; len];
            super::f16_to_f32(&all[100..100 + len], &mut d);
            assert!(d
                .iter()
                .zip(&got[100..])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    /// The aarch64 loop gives, for every f16 bit pattern at every start and remainder length,
    /// exactly the bits of `half`'s scalar conversion (NaNs too: `fcvtl` quiets a signalling NaN
    /// and keeps its payload, as `half` does).
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn fcvtl_is_the_scalar_conversion_bit_for_bit() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let want: Vec<u32> = all.iter().map(|h| h.to_f32().to_bits()).collect();
        let mut got = vec![0.0f32; all.len()];
        super::fcvtl(&all, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), *w, "{i:#06x}");
        }
        for start in [0, 1, 3, 0x7bff, 0xfc00] {
            for len in 0..20 {
                let mut d = vec![0.0f32; len];
                super::fcvtl(&all[start..start + len], &mut d);
                let bits: Vec<u32> = d.iter().map(|x| x.to_bits()).collect();
                assert_eq!(bits, want[start..start + len], "start {start} len {len}");
            }
        }
    }
}
