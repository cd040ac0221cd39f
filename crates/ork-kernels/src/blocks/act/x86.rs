//! AVX2 Q8_0 / Q8_1 quantizers: the scalar twin's arithmetic (`super::q8_scalar`) eight lanes
//! at a time: `vmulps` by the block's `id`, `vroundps` to nearest even, `vcvtps2dq`, packs.

use super::{header, scale, QuantFn};
use std::arch::x86_64::*;

/// The AVX2 quantizer (Q8_1 if `sum`), if the CPU has AVX2 and F16C.
pub(super) fn q8(sum: bool) -> Option<QuantFn> {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    Some(if sum { q8_1 } else { q8_0 })
}

fn q8_0(x: &[f32], dst: &mut [u8]) {
    // SAFETY: `q8` hands this out only on a CPU with AVX2.
    unsafe { q8_avx2(x, dst, false) }
}

fn q8_1(x: &[f32], dst: &mut [u8]) {
    // SAFETY: as `q8_0`.
    unsafe { q8_avx2(x, dst, true) }
}

/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn q8_avx2(x: &[f32], dst: &mut [u8], sum: bool) {
    let bytes = if sum { 36 } else { 34 };
    let qs = bytes - 32;
    let abs = _mm256_set1_ps(f32::from_bits(0x7fff_ffff));
    let inf = _mm256_set1_ps(f32::INFINITY);
    // Plain loops, no closures: a closure is not compiled with this function's target
    // features, and the intrinsics would not inline into it.
    for (xb, yb) in x.chunks_exact(32).zip(dst.chunks_exact_mut(bytes)) {
        let mut v = [_mm256_setzero_ps(); 4];
        let (mut m, mut fin) = (_mm256_setzero_ps(), 0xff);
        for (j, v) in v.iter_mut().enumerate() {
            // SAFETY: `xb` holds 32 floats; unaligned load of eight.
            *v = unsafe { _mm256_loadu_ps(xb[8 * j..].as_ptr()) };
            let a = _mm256_and_ps(*v, abs);
            // Ordered `< inf` is false for NaN and ±inf.
            fin &= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(a, inf));
            m = _mm256_max_ps(m, a);
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        let sc = scale(_mm_cvtss_f32(m), fin == 0xff);
        let id = _mm256_set1_ps(sc.map_or(0.0, |(_, id)| id));
        let mut i = [_mm256_setzero_si256(); 4];
        if sc.is_some() {
            for (i, v) in i.iter_mut().zip(v) {
                let r = _mm256_mul_ps(v, id);
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(r);
                *i = _mm256_cvtps_epi32(r);
            }
        }
        let qsum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(qsum),
            _mm256_extracti128_si256::<1>(qsum),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `yb[qs..]` is exactly 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(yb[qs..].as_mut_ptr().cast(), p) };
        header(yb, sc.map(|(d, _)| d), _mm_cvtsi128_si32(s), sum);
    }
}
