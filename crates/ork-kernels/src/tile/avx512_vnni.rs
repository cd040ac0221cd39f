//! AVX-512 VNNI kernel: `vpdpbusd` on zmm registers (64 multiply-adds per instruction).
//!
//! `vpdpbusd` multiplies u8 by i8, so one operand must be made unsigned. The AVX-VNNI kernel
//! biases the activations and pays a second `vpdpbusd` per weight vector (or a per-tile pass) for
//! the `128 · Σ_k w` correction; here the **weights** are biased instead, with one `vpxord` per
//! weight vector (`w ^ 0x80 = w + 128` as u8), and the activations stay signed:
//! `Σ_k (w + 128) · a = Σ_k a · w + 128 · Σ_k a`. The correction `128 · Σ_k a[r, k]` is one
//! number per activation row, computed once per task ([`super::PreparedA`]). The lane sums wrap
//! modulo 2^32, so the corrected result is exact whenever the true dot product fits in an i32
//! (guaranteed by [`super::MAX_K`]; `|128 · Σ a| ≤ 2^30` there too).
//!
//! One zmm of weights is the 32-byte k-runs of two neighbouring channels (the tile stores the runs
//! of one k-tile channel after channel, see [`super`]); the activation run is broadcast to both
//! halves. Each accumulator therefore holds 8 partial sums of two channels, and a block of 16
//! accumulators is reduced by an add tree ([`reduce16`]) to 32 outputs in two registers.
//!
//! * Decode (single rows): 32 channels × 1 row per block, 16 accumulators.
//! * Prefill (4-row blocks): 8 channels × 4 rows per block, each weight vector loaded and biased
//!   once for the 4 rows.
//!
//! The loops are the shared generic body ([`super::body`]); this file supplies the vector
//! operations ([`Avx512Vnni`]).
//!
//! Scalar twin: [`super::scalar_tile_dot`].

use super::body::{body, TileVec};
use std::arch::x86_64::*;

/// Whether this CPU (and OS) can run the kernel: AVX-512 Foundation and AVX-512 VNNI.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Safe entry: checks shapes and that the CPU has AVX-512 F + VNNI.
///
/// `a` is `rows × kpad` signed i8 (zero padded), `corr[r] = 128 · Σ_k a[r, k]`, `w` is one tile of
/// `tn × kpad` i8 in tile order, `tn` a multiple of 8.
pub(super) fn tile_dot(a: &[i8], corr: &[i32], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && corr.len() == rows
            && w.len() == tn * kpad
            && tn.is_multiple_of(8)
    );
    assert!(out.len() >= rows * tn && available());
    // SAFETY: AVX-512 F + VNNI are present (checked above) and the shapes were checked, which is
    // what `tile_dot_avx512` requires.
    unsafe { tile_dot_avx512(a, corr, kpad, w, tn, out) }
}

/// Sums within each 128-bit lane of four accumulators: lane `L` of the result is
/// `[Σ x_L, Σ y_L, Σ z_L, Σ w_L]`, each the sum of the accumulator's four i32 in lane `L`.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce4(x: __m512i, y: __m512i, z: __m512i, w: __m512i) -> __m512i {
    // [x0+x2, y0+y2, x1+x3, y1+y3] per lane.
    let s0 = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
    let s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(z, w), _mm512_unpackhi_epi32(z, w));
    _mm512_add_epi32(_mm512_unpacklo_epi64(s0, s1), _mm512_unpackhi_epi64(s0, s1))
}

/// Finish eight accumulators (two [`reduce4`] results; accumulator `i` holds channel `2i` in its
/// low 256 bits and `2i + 1` in its high 256 bits): output lane `c` is the full sum of
/// channel `c` (0..16), in order.
#[inline]
#[target_feature(enable = "avx512f")]
fn combine(va: __m512i, vb: __m512i) -> __m512i {
    // Lanes 0 and 1 of a reduce4 result hold the even channels' halves, lanes 2 and 3 the odd.
    let p = _mm512_shuffle_i64x2::<0b10_00_10_00>(va, vb); // va.L0, va.L2, vb.L0, vb.L2
    let q = _mm512_shuffle_i64x2::<0b11_01_11_01>(va, vb); // va.L1, va.L3, vb.L1, vb.L3
    let r = _mm512_add_epi32(p, q);
    // r holds [2i for i in 0..4], [2i+1 for i in 0..4], then the same for accumulators 4..8.
    let order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    _mm512_permutexvar_epi32(order, r)
}

/// Reduce 16 accumulators (accumulator `i` = channels `2i`, `2i + 1` as in [`combine`]) to the 32
/// channel sums, in order: channels 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(acc: &[__m512i; 16]) -> (__m512i, __m512i) {
    let v0 = reduce4(acc[0], acc[1], acc[2], acc[3]);
    let v1 = reduce4(acc[4], acc[5], acc[6], acc[7]);
    let v2 = reduce4(acc[8], acc[9], acc[10], acc[11]);
    let v3 = reduce4(acc[12], acc[13], acc[14], acc[15]);
    (combine(v0, v1), combine(v2, v3))
}

/// # Safety
/// The CPU must support AVX-512 F and VNNI; `a` is `rows × kpad` i8, `corr.len() == rows`, `w` is
/// `tn × kpad` i8 in tile order, `kpad % 32 == 0`, `tn % 8 == 0`, `out.len() ≥ rows · tn`.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn tile_dot_avx512(
    a: &[i8],
    corr: &[i32],
    kpad: usize,
    w: &[i8],
    tn: usize,
    out: &mut [i32],
) {
    // Prefill: 4 rows × 8 channels (4 zmm of weights, 16 accumulators). Decode and leftover
    // rows: one row × 32 channels (16 independent accumulator chains in registers), the rest of
    // the tile 8 channels at a time; no memory-order pass (32 zmm of accumulators would not
    // leave registers for the operands).
    // SAFETY: forwarded from the caller; AVX-512 F + VNNI are enabled here, which is what
    // `Avx512Vnni` uses.
    unsafe { body::<Avx512Vnni, 4, 16, false>(a, corr, kpad, w, tn, out) }
}

/// AVX-512 VNNI for [`body`]: a weight vector is the k-runs of two neighbouring channels, biased
/// to u8 (`vpxord`); the activation run is broadcast to both halves; `vpdpbusd`.
struct Avx512Vnni;

impl TileVec for Avx512Vnni {
    type Elem = i8;
    type Acc = __m512i;
    type A = __m512i;
    type W = __m512i;
    const CH: usize = 2;
    const PREFETCH: bool = false;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        // SAFETY: register-only; AVX-512 F (caller).
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn load_a(p: *const i8) -> __m512i {
        // SAFETY: 32 readable bytes (caller), an unaligned load; AVX-512 F (caller).
        unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())) }
    }

    #[inline(always)]
    unsafe fn load_w(p: *const i8) -> __m512i {
        // SAFETY: 64 readable bytes (caller), an unaligned load; AVX-512 F (caller).
        // 0x80: w ^ 0x80 = w + 128 as u8.
        unsafe { _mm512_xor_si512(_mm512_loadu_si512(p.cast()), _mm512_set1_epi8(-128)) }
    }

    #[inline(always)]
    unsafe fn madd(acc: __m512i, a: __m512i, w: __m512i) -> __m512i {
        // SAFETY: register-only; AVX-512 VNNI (caller).
        unsafe { _mm512_dpbusd_epi32(acc, w, a) }
    }

    /// `acc.len()` must be a multiple of 4 (8 channels): blocks of 16 accumulators through
    /// [`reduce16`], then blocks of 4 through [`reduce4`] and [`combine`].
    #[inline(always)]
    unsafe fn finish(acc: &[__m512i], corr: i32, out: *mut i32) {
        // SAFETY: `2 · acc.len()` writable outputs at `out` (caller); AVX-512 F (caller).
        unsafe {
            let c = _mm512_set1_epi32(corr);
            let mut blocks = acc.chunks_exact(16);
            let mut o = out;
            for b in &mut blocks {
                let (lo, hi) = reduce16(b.try_into().expect("chunks of 16"));
                _mm512_storeu_si512(o.cast(), _mm512_sub_epi32(lo, c));
                _mm512_storeu_si512(o.add(16).cast(), _mm512_sub_epi32(hi, c));
                o = o.add(32);
            }
            for b in blocks.remainder().chunks_exact(4) {
                let v = reduce4(b[0], b[1], b[2], b[3]);
                let s = _mm512_sub_epi32(combine(v, v), c);
                _mm256_storeu_si256(o.cast(), _mm512_castsi512_si256(s));
                o = o.add(8);
            }
        }
    }

    /// With `G = 4` (8 channels × 4 rows) one [`reduce16`] for the block, as the kernel had it
    /// before the shared body: finishing row by row (a [`reduce4`] and a half-used [`combine`]
    /// per row) made the SmolLM2-sized prefill matmul (M = 128, K = 576, N = 1536) 5 % slower
    /// (`tile_speed`, medians of 10 interleaved runs).
    #[inline(always)]
    unsafe fn finish4<const G: usize>(
        acc: &[[__m512i; G]; 4],
        corr: [i32; 4],
        out: *mut i32,
        tn: usize,
    ) {
        // SAFETY: the caller guarantees rows 0..4 × 2·G channels writable at `out` (row stride
        // `tn`); AVX-512 F (caller).
        unsafe {
            if G != 4 {
                for (i, acc) in acc.iter().enumerate() {
                    Self::finish(acc, corr[i], out.add(i * tn));
                }
                return;
            }
            // Accumulator 4i + p: row i, channels 2p, 2p + 1.
            let flat: [__m512i; 16] = std::array::from_fn(|x| acc[x / 4][x % 4]);
            // Lanes 0..8 of `lo` are row 0, 8..16 row 1; `hi` the same for rows 2 and 3.
            let (lo, hi) = reduce16(&flat);
            let c01 = _mm512_mask_set1_epi32(_mm512_set1_epi32(corr[0]), 0xFF00, corr[1]);
            let c23 = _mm512_mask_set1_epi32(_mm512_set1_epi32(corr[2]), 0xFF00, corr[3]);
            for (i, v) in [
                (0, _mm512_sub_epi32(lo, c01)),
                (2, _mm512_sub_epi32(hi, c23)),
            ] {
                _mm256_storeu_si256(out.add(i * tn).cast(), _mm512_castsi512_si256(v));
                _mm256_storeu_si256(
                    out.add((i + 1) * tn).cast(),
                    _mm512_extracti64x4_epi64::<1>(v),
                );
            }
        }
    }

    #[inline(always)]
    unsafe fn prefetch(_: *const i8) {}
}

/// Peak-rate loop for the roofline: `iters × 10` independent `vpdpbusd` on zmm (64 multiply-adds
/// each), operands in registers. Returns a value derived from every lane so nothing is elided.
pub(super) fn peak(iters: u64) -> i32 {
    assert!(available());
    // SAFETY: AVX-512 F + VNNI present (checked above); the function touches no memory.
    unsafe { peak_avx512(iters) }
}

/// Multiply-adds per iteration of [`peak`].
pub(super) const PEAK_MACS_PER_ITER: u64 = 10 * 64;

#[target_feature(enable = "avx512f,avx512vnni")]
fn peak_avx512(iters: u64) -> i32 {
    let mut a = _mm512_set1_epi8(3);
    let b = _mm512_set1_epi8(-5);
    let mut acc = [_mm512_setzero_si512(); 10];
    for _ in 0..iters {
        a = std::hint::black_box(a);
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    acc.iter()
        .fold(0i32, |s, &v| s.wrapping_add(_mm512_reduce_add_epi32(v)))
}
