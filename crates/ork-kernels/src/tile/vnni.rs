//! AVX-VNNI kernel: `vpdpbusd` on ymm multiplies u8 by i8 and adds groups of four into i32 lanes
//! without saturation. As in the AVX-512 VNNI kernel (`avx512_vnni.rs`), the **weights** are
//! biased to u8 (one `vpxor` per weight run, `w ^ 0x80 = w + 128`) and the activations stay
//! signed: `Σ_k (w + 128) · a = Σ_k a · w + 128 · Σ_k a`, and the per-row correction
//! `128 · Σ_k a[r, k]` comes with the prepared activations ([`super::PreparedA`]). The lane sums
//! wrap modulo 2^32, so the corrected result is exact whenever the true dot product fits in an
//! i32 (guaranteed by [`super::MAX_K`]). The loops are the shared generic body
//! ([`super::body`]), with AVX2's shape (4 rows × 2 channels, M = 1 in memory order with
//! prefetch, leftover rows a channel pair at a time). Scalar twin: [`super::scalar_tile_dot`].

use super::avx2::{finish_ymm, hsum, prefetch_t0};
use super::body::{body, TileVec};
use std::arch::x86_64::*;

/// Safe entry: checks shapes and that the CPU has AVX-VNNI.
///
/// `a` is `rows × kpad` signed i8 (zero padded), `corr[r] = 128 · Σ_k a[r, k]`, `w` is one tile of
/// `tn × kpad` i8 in tile order, `tn` even.
pub(super) fn tile_dot(a: &[i8], corr: &[i32], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && corr.len() == rows
            && w.len() == tn * kpad
            && tn.is_multiple_of(2)
    );
    assert!(out.len() >= rows * tn && std::arch::is_x86_feature_detected!("avxvnni"));
    // SAFETY: AVX2 + AVX-VNNI are present and the shapes were checked.
    unsafe { tile_dot_vnni(a, corr, kpad, w, tn, out) }
}

/// # Safety
/// The CPU must support AVX2 and AVX-VNNI; `a` is `rows × kpad` i8, `corr.len() == rows`, `w` is
/// `tn × kpad` i8 in tile order, `kpad % 32 == 0`, `tn` even, `out.len() ≥ rows · tn`.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn tile_dot_vnni(a: &[i8], corr: &[i32], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    // SAFETY: forwarded from the caller; AVX2 + AVX-VNNI are enabled here, which is what
    // `AvxVnni` uses.
    unsafe { body::<AvxVnni, 2, 2, true>(a, corr, kpad, w, tn, out) }
}

/// AVX-VNNI for [`body`]: a weight run biased to u8 (`vpxor`), the activation run signed,
/// `vpdpbusd`.
struct AvxVnni;

impl TileVec for AvxVnni {
    type Elem = i8;
    type Acc = __m256i;
    type A = __m256i;
    type W = __m256i;
    const CH: usize = 1;
    const PREFETCH: bool = true;

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: register-only; AVX (caller).
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn load_a(p: *const i8) -> __m256i {
        // SAFETY: 32 readable bytes (caller), an unaligned load; AVX (caller).
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    #[inline(always)]
    unsafe fn load_w(p: *const i8) -> __m256i {
        // SAFETY: 32 readable bytes (caller), an unaligned load; AVX2 (caller).
        // 0x80: w ^ 0x80 = w + 128 as u8.
        unsafe { _mm256_xor_si256(_mm256_loadu_si256(p.cast()), _mm256_set1_epi8(-128)) }
    }

    #[inline(always)]
    unsafe fn madd(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
        // SAFETY: register-only; AVX-VNNI (caller).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }

    #[inline(always)]
    unsafe fn finish(acc: &[__m256i], corr: i32, out: *mut i32) {
        // SAFETY: forwarded from the caller (AVX2 is enabled with AVX-VNNI).
        unsafe { finish_ymm(acc, corr, out) }
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const i8) {
        // SAFETY: forwarded from the caller.
        unsafe { prefetch_t0(p) }
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
