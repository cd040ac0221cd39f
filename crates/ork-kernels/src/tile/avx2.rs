//! AVX2 kernel: both operands widened to i16, `vpmaddwd` into i32 lanes (exact for every i8).
//! Scalar twin: [`super::scalar_tile_dot`].

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
fn hsum(v: __m256i) -> i32 {
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
    let rows = a.len() / kpad;
    let kt_n = kpad / 32;
    let ap = a.as_ptr();
    let wp = w.as_ptr();
    let mut r = 0;
    // 4 rows × 2 channels per step: 8 accumulators, each k-run's weights widened once.
    while r + 4 <= rows {
        for j in (0..tn).step_by(2) {
            let mut acc = [_mm256_setzero_si256(); 8];
            for kt in 0..kt_n {
                // SAFETY: kt < kpad/32 and j + 1 < tn, so both 32-byte runs lie inside `w`;
                // rows r..r+4 and k-run kt lie inside `a`. Unaligned loads are used throughout.
                unsafe {
                    let w0 = _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32) as *const __m256i);
                    let w1 =
                        _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32 + 32) as *const __m256i);
                    let w0l = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w0));
                    let w0h = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w0));
                    let w1l = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w1));
                    let w1h = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w1));
                    for i in 0..4 {
                        let p = ap.add((r + i) * kpad + kt * 32);
                        let al = _mm256_loadu_si256(p as *const __m256i);
                        let ah = _mm256_loadu_si256(p.add(16) as *const __m256i);
                        acc[2 * i] = _mm256_add_epi32(
                            acc[2 * i],
                            _mm256_add_epi32(
                                _mm256_madd_epi16(al, w0l),
                                _mm256_madd_epi16(ah, w0h),
                            ),
                        );
                        acc[2 * i + 1] = _mm256_add_epi32(
                            acc[2 * i + 1],
                            _mm256_add_epi32(
                                _mm256_madd_epi16(al, w1l),
                                _mm256_madd_epi16(ah, w1h),
                            ),
                        );
                    }
                }
            }
            for i in 0..4 {
                out[(r + i) * tn + j] = hsum(acc[2 * i]);
                out[(r + i) * tn + j + 1] = hsum(acc[2 * i + 1]);
            }
        }
        r += 4;
    }
    /// How far ahead of its reads the M = 1 pass prefetches, bytes.
    const AHEAD: usize = 2048;
    // The bytes after this tile: usually the next tile this thread computes (a weight's
    // N-tiles are contiguous and the drivers hand each thread a run of them).
    let next = wp.wrapping_add(tn * kpad);
    // Channels of the single row that the M = 1 pass below computed (0 otherwise).
    let mut done = 0;
    if rows == 1 {
        // Decode (M = 1), where every weight byte is read once, from DRAM. The tile is read in
        // memory order: each k-run's `tn × 32` bytes, every channel's 32 at once, into one
        // accumulator per channel (up to 64 channels; they live on the stack, as 16 registers
        // cannot hold them). The lines `AHEAD` bytes on are prefetched (into the next tile at
        // its end: a thread's tiles are contiguous); a prefetch never faults, so an address past
        // the end of the weight is harmless. `AHEAD` = 2 KiB against a whole tile ahead (18–48
        // KiB, more than L1 holds): a SmolLM2-sized pass of 211 M = 1 matmuls took 3–4 % less
        // (medians of 100 interleaved passes, three runs; 1, 4 and 6 KiB did as well). Reading
        // eight channels per pass over the k-runs instead (registers only, but 256 bytes out of
        // every `tn × 32`, four passes per tile) was slower: the SmolLM2-sized decode pass of
        // `ork bench gemm` took 9.2 against 7.3 ms here (medians of 6 interleaved runs, AVX2-only
        // EPYC), and `ork run` decoded 74.9 against 70.7 tok/s (medians of 8 interleaved runs,
        // same greedy tokens).
        let mut acc = [_mm256_setzero_si256(); 64];
        let tn8 = (tn / 8 * 8).min(64);
        for kt in 0..kt_n {
            let base = kt * tn * 32;
            for l in 0..tn8 / 2 {
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(base + AHEAD + 64 * l).cast());
            }
            // SAFETY: kt < kpad/32 and c < tn, so the 32 bytes at `base + 32 c` lie inside `w`;
            // k-run kt of the single row lies inside `a`.
            unsafe {
                let p = ap.add(kt * 32);
                let al = _mm256_loadu_si256(p as *const __m256i);
                let ah = _mm256_loadu_si256(p.add(16) as *const __m256i);
                for (c, acc) in acc[..tn8].iter_mut().enumerate() {
                    let w = _mm256_loadu_si256(wp.add(base + 32 * c) as *const __m256i);
                    let lo = _mm256_madd_epi16(al, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)));
                    let hi = _mm256_madd_epi16(
                        ah,
                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w)),
                    );
                    *acc = _mm256_add_epi32(*acc, _mm256_add_epi32(lo, hi));
                }
            }
        }
        for (c, v) in acc[..tn8].iter().enumerate() {
            out[c] = hsum(*v);
        }
        done = tn8;
    }
    // Leftover rows, a channel pair at a time; at M = 1 only the channels past the last multiple
    // of 8 (the kernel accepts any even width) or past 64.
    while r < rows {
        for j in (done..tn).step_by(2) {
            let mut acc0 = _mm256_setzero_si256();
            let mut acc1 = _mm256_setzero_si256();
            for kt in 0..kt_n {
                if rows == 1 {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(kt * tn * 32 + j * 32).cast());
                }
                // SAFETY: as above, for the single row r.
                unsafe {
                    let w0 = _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32) as *const __m256i);
                    let w1 =
                        _mm256_loadu_si256(wp.add(kt * tn * 32 + j * 32 + 32) as *const __m256i);
                    let p = ap.add(r * kpad + kt * 32);
                    let al = _mm256_loadu_si256(p as *const __m256i);
                    let ah = _mm256_loadu_si256(p.add(16) as *const __m256i);
                    acc0 = _mm256_add_epi32(
                        acc0,
                        _mm256_madd_epi16(al, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w0))),
                    );
                    acc0 = _mm256_add_epi32(
                        acc0,
                        _mm256_madd_epi16(
                            ah,
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w0)),
                        ),
                    );
                    acc1 = _mm256_add_epi32(
                        acc1,
                        _mm256_madd_epi16(al, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w1))),
                    );
                    acc1 = _mm256_add_epi32(
                        acc1,
                        _mm256_madd_epi16(
                            ah,
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w1)),
                        ),
                    );
                }
            }
            out[r * tn + j] = hsum(acc0);
            out[r * tn + j + 1] = hsum(acc1);
        }
        r += 1;
    }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The AVX2 kernel equals the scalar twin for every even tile width up to 80, not only
        /// the multiples of 8 the shared twin test draws: the M = 1 path's pair-by-pair tail
        /// runs for widths that leave 2, 4 or 6 channels after its multiple of 8, and past its
        /// 64 accumulators.
        #[test]
        fn every_even_tile_width_matches_the_scalar_twin(rows in 1usize..6, kt_n in 1usize..5, pairs in 1usize..41, seed in any::<u64>()) {
            prop_assume!(std::arch::is_x86_feature_detected!("avx2"));
            let (tn, kpad) = (2 * pairs, 32 * kt_n);
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                match s % 6 { 0 => -128, 1 => 127, _ => (s >> 8) as i8 }
            };
            let a: Vec<i8> = (0..rows * kpad).map(|_| next()).collect();
            let w: Vec<i8> = (0..tn * kpad).map(|_| next()).collect();
            let mut want = vec![0i32; rows * tn];
            super::super::scalar_tile_dot(&a, kpad, &w, tn, &mut want);
            let wide: Vec<i16> = a.iter().map(|&v| i16::from(v)).collect();
            let mut got = vec![i32::MIN; rows * tn];
            super::tile_dot(&wide, kpad, &w, tn, &mut got);
            prop_assert_eq!(got, want);
        }
    }
}
