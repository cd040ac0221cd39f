//! x86-64 pieces the block families share: the int8 dot of each ISA ([`Dot`]) and the helpers
//! of the M > 1 panel kernels (`legacy/x86/panel.rs`, `k_quants/avx2/panel.rs`).
//!
//! **The panel layout.** A panel is eight consecutive weight rows decoded once per call into
//! unsigned bytes and transposed in 4-byte chunks: vector `c` of a block holds, in i32 lane `r`,
//! the decoded bytes `4c .. 4c + 4` of row `r`. One activation chunk (4 int8, broadcast to all
//! lanes) times that vector (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`) adds four products to
//! each of the eight rows' sums at once, so a block's exact integer dot of eight rows needs no
//! horizontal reduction, and each decoded weight vector serves every activation row of the
//! call. The float step then runs with rows in lanes: lane `r` of the accumulator `j` of an
//! activation row is the scalar twin's lane `j` of weight row `r`, so the same multiplies and
//! adds happen in the same order (`docs/kernels.md`, "Block kernels").

use std::arch::x86_64::*;

/// Weight rows per panel: one per i32 lane of a ymm.
pub(super) const PANEL_ROWS: usize = 8;

/// The int8 dot of one ISA on 32 bytes: eight i32 lanes, each four adjacent `u·s` products.
pub(super) trait Dot {
    /// Whether `u` may use the whole u8 range: `vpdpbusd` is exact for any bytes, while
    /// `vpmaddubsw` saturates its i16 pair sums once `2·u·|s|` passes 32767 (AVX2 kernels keep
    /// `u ≤ 127` and `|s| ≤ 127`, or `u ≤ 63`).
    const WIDE: bool;

    /// Whether the kernels of this ISA are compiled with AVX-512 BW (byte-masked operations),
    /// which the one-row legacy kernels use to decode Q5's fifth bits (`legacy/x86.rs`).
    const BW: bool = false;

    /// `u` (unsigned bytes) times `s` (signed bytes), four adjacent products per lane.
    ///
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i;

    /// `acc + dot_us(u, s)` (lane-wise, wrapping i32).
    ///
    /// # Safety
    /// As [`Dot::dot_us`].
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// `vpmaddubsw` then `vpmaddwd` by ones.
pub(super) struct Avx2;
/// `vpdpbusd` (AVX-VNNI, VEX).
pub(super) struct AvxVnni;
/// `vpdpbusd` (AVX-512 VNNI + VL, EVEX ymm).
pub(super) struct Avx512Vnni;

impl Dot for Avx2 {
    const WIDE: bool = false;
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 arithmetic; the caller guarantees AVX2.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as above.
        unsafe { _mm256_add_epi32(acc, Self::dot_us(u, s)) }
    }
}

impl Dot for AvxVnni {
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

impl Dot for Avx512Vnni {
    const WIDE: bool = true;
    const BW: bool = true;
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-512 VNNI and VL.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) }
    }
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-512 VNNI and VL.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// The 8 × 8 transpose of i32 lanes: lane `r` of output `c` is lane `c` of input `r`.
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(super) unsafe fn transpose8(v: &[__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        // No closures: they would not get the caller's target features.
        let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
        let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
        let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
        let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
        let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
        // Per 128-bit half, u0 holds column 0 (low half) / 4 (high half) of rows 0..4, etc.
        let u = [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ];
        let w = [
            _mm256_unpacklo_epi64(t4, t6),
            _mm256_unpackhi_epi64(t4, t6),
            _mm256_unpacklo_epi64(t5, t7),
            _mm256_unpackhi_epi64(t5, t7),
        ];
        [
            _mm256_permute2x128_si256::<0x20>(u[0], w[0]),
            _mm256_permute2x128_si256::<0x20>(u[1], w[1]),
            _mm256_permute2x128_si256::<0x20>(u[2], w[2]),
            _mm256_permute2x128_si256::<0x20>(u[3], w[3]),
            _mm256_permute2x128_si256::<0x31>(u[0], w[0]),
            _mm256_permute2x128_si256::<0x31>(u[1], w[1]),
            _mm256_permute2x128_si256::<0x31>(u[2], w[2]),
            _mm256_permute2x128_si256::<0x31>(u[3], w[3]),
        ]
    }
}

/// The 4 bytes at `p` in every i32 lane.
///
/// # Safety
/// 4 readable bytes at `p`; AVX.
#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    // SAFETY: the caller vouches for the bytes and the ISA.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// A panel's `m` activation rows, four at a time while four remain (`tile4(i)`: rows `i ..
/// i + 4`), then one at a time (`tile1(i)`), each result's lane `r` written to `o[r · m + i]`.
///
/// # Safety
/// The CPU has AVX, and whatever `tile4`/`tile1` need.
#[inline(always)]
pub(super) unsafe fn panel_columns(
    o: &mut [f32],
    m: usize,
    mut tile4: impl FnMut(usize) -> [__m256; 4],
    mut tile1: impl FnMut(usize) -> __m256,
) {
    let mut i = 0;
    while i < m {
        let mut lanes = [[0f32; PANEL_ROWS]; 4];
        let n = if i + 4 <= m {
            for (l, v) in lanes.iter_mut().zip(tile4(i)) {
                // SAFETY: 32 writable bytes, unaligned store; AVX as the caller guarantees.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
            }
            4
        } else {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(lanes[0].as_mut_ptr(), tile1(i)) };
            1
        };
        for (j, l) in lanes.into_iter().take(n).enumerate() {
            scatter_rows(l, &mut o[i + j..], m);
        }
        i += n;
    }
}

/// Lane `r` of the result at `out[r · m]` for `r` in `0..PANEL_ROWS` (a panel's column).
#[inline(always)]
pub(super) fn scatter_rows(v: [f32; PANEL_ROWS], out: &mut [f32], m: usize) {
    for (r, v) in v.into_iter().enumerate() {
        out[r * m] = v;
    }
}
