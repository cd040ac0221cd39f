//! AVX-VNNI kernel: `vpdpbusd` multiplies u8 by i8 and adds groups of four into i32 lanes without
//! saturation. Activations arrive biased, `u = a + 128` (0..=255), so
//! `Σ u·w = Σ a·w + 128 · Σ w`; the kernel subtracts `128 · Σ_k w[j, k]` per channel. The lane
//! sums wrap modulo 2^32, so the corrected result is exact whenever the true dot product fits in
//! an i32 (guaranteed by [`super::MAX_K`]). Scalar twin: [`super::scalar_tile_dot`].

use std::arch::x86_64::*;

/// Safe entry: checks shapes and that the CPU has AVX-VNNI.
pub(super) fn tile_dot(a: &[u8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && w.len() == tn * kpad
            && tn.is_multiple_of(4)
            && tn <= 64
    );
    assert!(out.len() >= rows * tn && std::arch::is_x86_feature_detected!("avxvnni"));
    // SAFETY: AVX2 + AVX-VNNI are present and the shapes were checked.
    unsafe { tile_dot_vnni(a, kpad, w, tn, out) }
}

/// Sum of the eight i32 lanes (register-only, safe under `target_feature`).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// # Safety
/// The CPU must support AVX2 and AVX-VNNI; `a` is `rows × kpad` biased u8, `w` is `tn × kpad` i8
/// in tile order, `kpad % 32 == 0`, `tn` a multiple of 4 and ≤ 64, `out.len() ≥ rows · tn`.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn tile_dot_vnni(a: &[u8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    let kt_n = kpad / 32;
    let ap = a.as_ptr();
    let wp = w.as_ptr();
    // Σ_k w[j, k] · 128 per channel, from one vpdpbusd pass with a vector of 128s. Only the
    // 4-row blocks use it; single rows (decode) fuse the correction into their own loop, which
    // halves their weight reads.
    let mut corr = [0i32; 64];
    let c128 = _mm256_set1_epi8(-128); // 0x80 = 128 as u8
    let blocks = rows / 4;
    for (j, c) in corr
        .iter_mut()
        .enumerate()
        .take(if blocks > 0 { tn } else { 0 })
    {
        let mut s = _mm256_setzero_si256();
        for kt in 0..kt_n {
            // SAFETY: kt < kpad/32, j < tn: the run lies inside `w`.
            unsafe {
                let wv = _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32) as *const __m256i);
                s = _mm256_dpbusd_avx_epi32(s, c128, wv);
            }
        }
        *c = hsum(s);
    }
    let mut r = 0;
    while r + 4 <= rows {
        for j in (0..tn).step_by(2) {
            let mut acc = [_mm256_setzero_si256(); 8];
            for kt in 0..kt_n {
                // SAFETY: both weight runs (j, j+1 < tn) and the four activation runs
                // (rows r..r+4, k-run kt) lie inside their slices.
                unsafe {
                    let w0 = _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32) as *const __m256i);
                    let w1 =
                        _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32 + 32) as *const __m256i);
                    for i in 0..4 {
                        let av =
                            _mm256_loadu_si256(ap.add((r + i) * kpad + kt * 32) as *const __m256i);
                        acc[2 * i] = _mm256_dpbusd_avx_epi32(acc[2 * i], av, w0);
                        acc[2 * i + 1] = _mm256_dpbusd_avx_epi32(acc[2 * i + 1], av, w1);
                    }
                }
            }
            for i in 0..4 {
                out[(r + i) * tn + j] = hsum(acc[2 * i]).wrapping_sub(corr[j]);
                out[(r + i) * tn + j + 1] = hsum(acc[2 * i + 1]).wrapping_sub(corr[j + 1]);
            }
        }
        r += 4;
    }
    while r < rows {
        // Four channels at a time: four independent dpbusd chains per k-run hide the latency.
        for j in (0..tn).step_by(4) {
            let mut acc = [_mm256_setzero_si256(); 4];
            let mut cor = [_mm256_setzero_si256(); 4];
            for kt in 0..kt_n {
                // SAFETY: the activation run (row r, k-run kt) and the four weight runs
                // (j..j+4 ≤ tn, tn a multiple of 4) lie inside their slices.
                unsafe {
                    let av = _mm256_loadu_si256(ap.add(r * kpad + kt * 32) as *const __m256i);
                    for c in 0..4 {
                        let wv = _mm256_loadu_si256(
                            wp.add(kt * tn * 32 + (j + c) * 32) as *const __m256i
                        );
                        acc[c] = _mm256_dpbusd_avx_epi32(acc[c], av, wv);
                        cor[c] = _mm256_dpbusd_avx_epi32(cor[c], c128, wv);
                    }
                }
            }
            for c in 0..4 {
                out[r * tn + j + c] = hsum(acc[c]).wrapping_sub(hsum(cor[c]));
            }
        }
        r += 1;
    }
}

/// Peak-rate loop for the roofline: `iters × 10` independent `vpdpbusd` (32 multiply-adds each),
/// operands in registers. Returns a value derived from every lane so nothing is elided.
pub(super) fn peak(iters: u64) -> i32 {
    assert!(std::arch::is_x86_feature_detected!("avxvnni"));
    // SAFETY: AVX2 + AVX-VNNI present (checked above); the function touches no memory.
    unsafe { peak_vnni(iters) }
}

/// Multiply-adds per iteration of [`peak`].
pub(super) const PEAK_MACS_PER_ITER: u64 = 10 * 32;

#[target_feature(enable = "avx2,avxvnni")]
fn peak_vnni(iters: u64) -> i32 {
    let mut a = _mm256_set1_epi8(3);
    let b = _mm256_set1_epi8(-5);
    let mut acc = [_mm256_setzero_si256(); 10];
    for _ in 0..iters {
        a = std::hint::black_box(a);
        for x in acc.iter_mut() {
            *x = _mm256_dpbusd_avx_epi32(*x, a, b);
        }
    }
    acc.iter().fold(0i32, |s, &v| s.wrapping_add(hsum(v)))
}
