//! AVX2 kernel: both operands widened to i16, `vpmaddwd` into i32 lanes (exact for every i8).
//! Scalar twin: [`super::scalar_tile_dot`].

use super::body::{body, TileVec};
use std::arch::x86_64::*;

/// Safe entry: checks shapes and that the CPU has AVX2 (the dispatcher only picks this kernel
/// when it does).
pub(super) fn tile_dot(a: &[i16], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && w.len() == tn * kpad
            && tn.is_multiple_of(2)
    );
    assert!(out.len() >= rows * tn && std::arch::is_x86_feature_detected!("avx2"));
    // SAFETY: AVX2 is present (checked above) and the shapes were checked, which is what
    // `tile_dot_avx2` requires.
    unsafe { tile_dot_avx2(a, kpad, w, tn, out) }
}

/// Sum of the eight i32 lanes (register-only, safe under `target_feature`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// # Safety
/// The CPU must support AVX2; `a` is `rows × kpad` i16, `w` is `tn × kpad` i8 in tile order,
/// `kpad % 32 == 0`, `tn` even, `out.len() ≥ rows · tn`.
#[target_feature(enable = "avx2")]
unsafe fn tile_dot_avx2(a: &[i16], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    // 4 rows × 2 channels per block (8 accumulators); M = 1 in memory order with prefetch (see
    // `body`); leftover rows a channel pair at a time. Reading eight channels per pass over the
    // k-runs at M = 1 instead (registers only, but 256 bytes out of every `tn × 32`, four passes
    // per tile) was slower: the SmolLM2-sized decode pass of `ork bench gemm` took 9.2 against
    // 7.3 ms here (medians of 6 interleaved runs, AVX2-only EPYC), and `ork run` decoded 74.9
    // against 70.7 tok/s (medians of 8 interleaved runs, same greedy tokens).
    // SAFETY: forwarded from the caller; AVX2 is enabled here, which is what `Avx2` uses.
    unsafe { body::<Avx2, 2, 2, true>(a, &[], kpad, w, tn, out) }
}

/// AVX2 for [`body`]: activations pre-widened to i16, each weight run sign-extended to i16 in
/// two ymm (`vpmovsxbw`), `vpmaddwd` pairs of exact products into i32 lanes.
struct Avx2;

impl TileVec for Avx2 {
    type Elem = i16;
    type Acc = __m256i;
    type A = (__m256i, __m256i);
    type W = (__m256i, __m256i);
    const CH: usize = 1;
    const PREFETCH: bool = true;

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: register-only; AVX (caller).
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn load_a(p: *const i16) -> Self::A {
        // SAFETY: 32 readable i16 (caller), unaligned loads; AVX (caller).
        unsafe {
            (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(16).cast()),
            )
        }
    }

    #[inline(always)]
    unsafe fn load_w(p: *const i8) -> Self::W {
        // SAFETY: 32 readable bytes (caller), an unaligned load; AVX2 (caller).
        unsafe {
            let w = _mm256_loadu_si256(p.cast());
            (
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)),
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w)),
            )
        }
    }

    #[inline(always)]
    unsafe fn madd(acc: __m256i, a: Self::A, w: Self::W) -> __m256i {
        // SAFETY: register-only; AVX2 (caller).
        unsafe {
            let lo = _mm256_madd_epi16(a.0, w.0);
            let hi = _mm256_madd_epi16(a.1, w.1);
            _mm256_add_epi32(acc, _mm256_add_epi32(lo, hi))
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: &[__m256i], corr: i32, out: *mut i32) {
        // SAFETY: forwarded from the caller.
        unsafe { finish_ymm(acc, corr, out) }
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const i8) {
        // SAFETY: forwarded from the caller.
        unsafe { prefetch_t0(p) }
    }
}

/// [`TileVec::finish`] for one channel per ymm accumulator (AVX2, AVX-VNNI): `out[c] =
/// hsum(acc[c]) − corr`.
///
/// # Safety
/// `acc.len()` writable outputs at `out`; AVX2.
#[inline(always)]
pub(super) unsafe fn finish_ymm(acc: &[__m256i], corr: i32, out: *mut i32) {
    for (c, &v) in acc.iter().enumerate() {
        // SAFETY: `acc.len()` writable outputs at `out` (caller); AVX2 (caller).
        unsafe { *out.add(c) = hsum(v).wrapping_sub(corr) };
    }
}

/// [`TileVec::prefetch`] into all cache levels (`prefetcht0`).
///
/// # Safety
/// SSE; a prefetch never faults, whatever the address.
#[inline(always)]
pub(super) unsafe fn prefetch_t0(p: *const i8) {
    // SAFETY: a prefetch never faults, whatever the address; SSE (caller).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
}

/// Peak-rate loop for the roofline: `iters × 10` independent `vpmaddwd` + `vpaddd` (16
/// multiply-adds each), operands in registers.
pub(super) fn peak(iters: u64) -> i32 {
    assert!(std::arch::is_x86_feature_detected!("avx2"));
    // SAFETY: AVX2 present (checked above); the function touches no memory.
    unsafe { peak_avx2(iters) }
}

/// Multiply-adds per iteration of [`peak`].
pub(super) const PEAK_MACS_PER_ITER: u64 = 10 * 16;

#[target_feature(enable = "avx2")]
fn peak_avx2(iters: u64) -> i32 {
    let mut a = _mm256_set1_epi16(3);
    let b = _mm256_set1_epi16(-5);
    let mut acc = [_mm256_setzero_si256(); 10];
    for _ in 0..iters {
        a = std::hint::black_box(a);
        for x in acc.iter_mut() {
            *x = _mm256_add_epi32(*x, _mm256_madd_epi16(a, b));
        }
    }
    acc.iter().fold(0i32, |s, &v| s.wrapping_add(hsum(v)))
}
