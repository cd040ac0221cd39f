//! AVX2 float kernels: sixteen lanes in two ymm per activation row, `vmulps` then `vaddps`
//! (the scalar twin's order, `super::rows_scalar`); f16 widens with F16C, bf16 by a 16-bit
//! shift. Each weight chunk is widened once for up to four activation rows.

use super::{drive, finish, Bf16, Elem, RowsFn, Tile, WeightType, F16, F32};
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

/// `R` weight rows against `N` activation rows: `R · N` independent sets of sixteen lanes
/// (decode uses `R = 4`, `N = 1`, so four add chains run at once; prefill `R = 1`, `N = 4`).
///
/// # Safety
/// Every `wr[j]` and `ar[i]` hold the same whole number of values; AVX2 and F16C.
#[inline(always)]
unsafe fn tile<E: Load, const R: usize, const N: usize>(
    wr: [&[u8]; R],
    ar: [&[u8]; N],
) -> [[f32; N]; R] {
    let k = wr[0].len() / E::BYTES;
    let whole = k - k % 16;
    // SAFETY: register-only; the caller guarantees AVX.
    let mut acc = [[[unsafe { _mm256_setzero_ps() }; 2]; N]; R];
    for c in (0..whole).step_by(16) {
        // SAFETY: values c .. c + 16 <= whole lie inside every row.
        unsafe {
            for j in 0..R {
                let p = wr[j].as_ptr().add(c * E::BYTES);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(512).cast());
                let w = [E::load8(p), E::load8(p.add(8 * E::BYTES))];
                for i in 0..N {
                    let q = ar[i].as_ptr().add(c * E::BYTES);
                    let a = [E::load8(q), E::load8(q.add(8 * E::BYTES))];
                    acc[j][i][0] = _mm256_add_ps(acc[j][i][0], _mm256_mul_ps(w[0], a[0]));
                    acc[j][i][1] = _mm256_add_ps(acc[j][i][1], _mm256_mul_ps(w[1], a[1]));
                }
            }
        }
    }
    // Plain loops: a closure would not be compiled with the caller's target features.
    let mut res = [[0f32; N]; R];
    for j in 0..R {
        for i in 0..N {
            let mut lanes = [0f32; 16];
            // SAFETY: 64 writable bytes; unaligned stores.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][i][0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[j][i][1]);
            }
            res[j][i] = finish::<E>(lanes, wr[j], ar[i], whole);
        }
    }
    res
}

/// `tile` compiled for AVX2 and F16C.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_avx2<E: Load, const R: usize, const N: usize>(
    wr: [&[u8]; R],
    ar: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: forwarded.
    unsafe { tile::<E, R, N>(wr, ar) }
}

/// Safe entry (`RowsFn`): [`rows`] hands it out only on a CPU with AVX2 and F16C, and
/// `Kernel::rows` checks the lengths.
fn entry<E: Load>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let t = (
        tile_avx2::<E, 4, 1> as Tile<4, 1>,
        tile_avx2::<E, 1, 4> as Tile<1, 4>,
        tile_avx2::<E, 1, 1> as Tile<1, 1>,
    );
    // SAFETY: see the doc comment.
    unsafe { drive(k * E::BYTES, w, rows, acts, m, out, t) }
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
