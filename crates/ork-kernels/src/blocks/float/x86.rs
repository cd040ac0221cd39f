//! AVX2 float kernels: sixteen lanes in two ymm per activation row, `vmulps` then `vaddps`
//! (the scalar twin's order, `super::rows_scalar`); f16 widens with F16C, bf16 by a 16-bit
//! shift. Each weight chunk is widened once for up to four activation rows.

use super::{finish, Bf16, Elem, RowsFn, WeightType, F16, F32};
use std::arch::x86_64::*;

/// Eight values widened to f32.
trait Load: Elem {
    /// # Safety
    /// `8 · BYTES` readable bytes at `p`; AVX2 and F16C.
    unsafe fn load8(p: *const u8) -> __m256;
}

impl Load for F32 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 32 readable bytes (caller); unaligned load.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
}

impl Load for F16 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes (caller); F16C (caller).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

impl Load for Bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes (caller); AVX2 (caller).
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// One weight row against `N` activation rows.
///
/// # Safety
/// `wr` and every `ar[i]` hold the same whole number of values; AVX2 and F16C.
#[inline(always)]
unsafe fn row<E: Load, const N: usize>(wr: &[u8], ar: [&[u8]; N]) -> [f32; N] {
    let k = wr.len() / E::BYTES;
    let whole = k - k % 16;
    // SAFETY: register-only; the caller guarantees AVX.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; 2]; N];
    for c in (0..whole).step_by(16) {
        // SAFETY: values c .. c + 16 <= whole lie inside every row.
        unsafe {
            let p = wr.as_ptr().add(c * E::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(512).cast());
            let w = [E::load8(p), E::load8(p.add(8 * E::BYTES))];
            for i in 0..N {
                let q = ar[i].as_ptr().add(c * E::BYTES);
                let a = [E::load8(q), E::load8(q.add(8 * E::BYTES))];
                acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_mul_ps(w[0], a[0]));
                acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_mul_ps(w[1], a[1]));
            }
        }
    }
    std::array::from_fn(|i| {
        let mut lanes = [0f32; 16];
        // SAFETY: 64 writable bytes; unaligned stores.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[i][1]);
        }
        finish::<E>(lanes, wr, ar[i], whole)
    })
}

/// # Safety
/// The lengths `Kernel::rows` checks; AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn body<E: Load>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let rb = k * E::BYTES;
    let arow = |i: usize| &acts[i * rb..][..rb];
    for r in 0..rows {
        let wr = &w[r * rb..][..rb];
        let o = &mut out[r * m..][..m];
        let mut i = 0;
        while i + 4 <= m {
            let ix: [usize; 4] = std::array::from_fn(|j| i + j);
            // SAFETY: equal row lengths; ISA as the caller guarantees.
            o[i..i + 4].copy_from_slice(&unsafe { row::<E, 4>(wr, ix.map(arow)) });
            i += 4;
        }
        for (j, o) in o.iter_mut().enumerate().skip(i) {
            // SAFETY: as above.
            *o = unsafe { row::<E, 1>(wr, [arow(j)]) }[0];
        }
    }
}

/// Safe entry (`RowsFn`): [`rows`] hands it out only on a CPU with AVX2 and F16C, and
/// `Kernel::rows` checks the lengths.
fn entry<E: Load>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    // SAFETY: see the doc comment.
    unsafe { body::<E>(k, w, rows, acts, m, out) }
}

/// The AVX2 kernel for `ty` (every x86 SIMD ISA runs it), if the CPU has AVX2 and F16C.
pub(super) fn rows(ty: WeightType) -> Option<RowsFn> {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    Some(match ty {
        WeightType::F32 => entry::<F32>,
        WeightType::F16 => entry::<F16>,
        WeightType::BF16 => entry::<Bf16>,
        _ => return None,
    })
}
