//! The k-quants on x86-64 AVX2: the shared driver ([`super::drive`]) compiled with AVX2 enabled
//! (so the plain-Rust decode vectorizes to 256-bit code), and the integer dot in intrinsics.
//!
//! Dot: per 32 values, `vpmaddubsw` of the unsigned quants (`u ≤ 63`) with the signed
//! activations gives 16 i16 pair sums, exact (`|2·63·128| = 16128 < 2¹⁵`, even for `a = −128`);
//! `vpmaddwd` with the two groups' scales (each lane's pair sum times a scale `|sc| ≤ 128`, pairs
//! added) gives exact i32 lanes; lanes and chunks add in i32 (wrapping, as the scalar twin), and
//! the mins term is one `vpmaddwd` of the 16 `mn_g` with the 16 `bsum_g`. Integer sums are exact
//! in any order, and the float step is the shared [`super::combine`], so the result equals the
//! scalar twin bit for bit.

use std::arch::x86_64::*;

use super::{drive, ktype, Engine, KType, Super, Q8K_BSUMS, Q8K_BYTES, QK_K};
use crate::blocks::RowsFn;

/// The AVX2 rows kernel of `t`.
pub(super) fn rows(t: KType) -> RowsFn {
    match t {
        KType::Q2 => rows_ty::<{ KType::Q2 as u8 }>,
        KType::Q3 => rows_ty::<{ KType::Q3 as u8 }>,
        KType::Q4 => rows_ty::<{ KType::Q4 as u8 }>,
        KType::Q5 => rows_ty::<{ KType::Q5 as u8 }>,
        KType::Q6 => rows_ty::<{ KType::Q6 as u8 }>,
    }
}

/// Safe entry: checks that the CPU has AVX2 (the dispatcher hands this kernel out only then).
fn rows_ty<const T: u8>(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    assert!(
        is_x86_feature_detected!("avx2"),
        "the AVX2 k-quant kernel needs a CPU with AVX2"
    );
    // SAFETY: the CPU has AVX2 (asserted just above); `drive` checks the slice lengths.
    unsafe { rows_avx2::<T>(k, w, rows, acts, m, out) }
}

/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2<const T: u8>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) {
    drive::<Avx2>(ktype(T), k, w, rows, acts, m, out);
}

/// The AVX2 engine. Private: only [`rows_avx2`] (reached after the AVX2 check) uses it.
struct Avx2;

impl Engine for Avx2 {
    #[inline(always)]
    fn decode(ty: KType, blk: &[u8], s: &mut Super) {
        super::decode(ty, blk, s);
    }

    #[inline(always)]
    fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
        assert!(a.len() >= Q8K_BYTES);
        // SAFETY: `a` holds a whole Q8_K block (asserted); this engine only runs inside
        // `rows_avx2`, whose caller checked that the CPU has AVX2.
        unsafe { dot(s, a) }
    }
}

/// # Safety
/// The CPU must have AVX2; `a` must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
    // Per 128-bit lane: bytes 0,1 (the first scale of a pair) eight times, then 2,3 eight times.
    let pick = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    );
    let q = a.as_ptr().wrapping_add(4);
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    for c in (0..QK_K / 32).step_by(2) {
        // SAFETY: `s.u` has 256 bytes and `q` 256 bytes (the block holds `Q8K_BYTES`), so the
        // 32-byte loads at `32c` and `32c + 32` (c ≤ 6) are in bounds; `s.sc` has 16 i16, so the
        // unaligned i32 reads at `2c` and `2c + 2` are too.
        unsafe {
            let u0 = _mm256_loadu_si256(s.u.as_ptr().add(32 * c).cast());
            let u1 = _mm256_loadu_si256(s.u.as_ptr().add(32 * c + 32).cast());
            let x0 = _mm256_loadu_si256(q.add(32 * c).cast());
            let x1 = _mm256_loadu_si256(q.add(32 * c + 32).cast());
            let sc0 = s.sc.as_ptr().add(2 * c).cast::<i32>().read_unaligned();
            let sc1 = s.sc.as_ptr().add(2 * c + 2).cast::<i32>().read_unaligned();
            let s0 = _mm256_shuffle_epi8(_mm256_set1_epi32(sc0), pick);
            let s1 = _mm256_shuffle_epi8(_mm256_set1_epi32(sc1), pick);
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, x0), s0);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, x1), s1);
            acc0 = _mm256_add_epi32(acc0, p0);
            acc1 = _mm256_add_epi32(acc1, p1);
        }
    }
    // SAFETY: `s.mn` has 16 i16 (32 bytes); the block's bsums are its last 32 bytes.
    let mins = unsafe {
        let mn = _mm256_loadu_si256(s.mn.as_ptr().cast());
        let bs = _mm256_loadu_si256(a.as_ptr().add(Q8K_BSUMS).cast());
        _mm256_madd_epi16(mn, bs)
    };
    (hsum(_mm256_add_epi32(acc0, acc1)), hsum(mins))
}

/// Wrapping sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
    _mm_cvtsi128_si32(x)
}
