//! The AVX-512 VNNI M > 1 kernel of the 32-weight blocks: [`super::panel`]'s scheme with
//! sixteen weight rows in the sixteen i32 lanes of a zmm instead of eight in a ymm.
//!
//! Every instruction of the inner loop (the `vpdpbusd` of a weight chunk with a broadcast
//! activation chunk, the float step of a block) then serves twice the weight rows, and each
//! broadcast activation chunk is loaded once for sixteen rows. The panel is the 8-row panel's
//! two halves side by side (rows `0..8` in lanes `0..8`, rows `8..16` in lanes `8..16`), so the
//! integer sums, the float step and the fold are lane for lane those of the 8-row panel: the
//! scalar twin's bits. A last group of eight rows runs as a panel whose upper half repeats the
//! lower one, its upper lanes discarded.
//!
//! The float accumulators are taken one at a time (accumulator `j` gathers blocks `j`, `j + 8`,
//! … of an activation row, in that order, as the scalar twin's `acc[b % 8]`), so that only one
//! per activation row is live: eight rows' integer and float sums then fit the 32 zmm registers.

use super::super::act_geometry;
use super::panel::{side, Ints, Side};
use super::{f16x8, Decode};
use crate::blocks::x86::transpose8;
use std::arch::x86_64::*;

/// Weight rows per panel: one per i32 lane of a zmm.
const LANES: usize = 16;

/// Activation rows computed together against one panel (then four, then one): eight rows'
/// sixteen integer chains and eight float accumulators fit the 32 zmm registers, and were a few
/// percent faster than four (`examples/blocks_speed.rs`, within the noise of a loaded machine).
const TILE_M: usize = 8;

/// Whether the activations are flipped to `a + 128` once per call (then multiplied, unsigned,
/// by signed weights `w`, and the block's `128 · Σw` subtracted) rather than read in place as
/// the signed factor of unsigned weights `u = w + OFFSET` (then `OFFSET · Σa` subtracted). In
/// place needs unsigned weights, and pays only where the activation int8 are 4-byte aligned:
/// Q8_1's 36-byte blocks (Q4_1, Q5_1: −2 … +10 %, median +4 %, against the flip at 576–1536
/// rows per call, and no per-call copy, which ork-cpu pays per task of tens of rows); Q8_0's
/// 34-byte blocks split some loads across cache lines, and Q4_0 ran ~8 % slower in place
/// (`examples/blocks_speed.rs`, both builds alternated).
const fn flipped<F: Decode>() -> bool {
    F::SIGNED || !F::MIN
}

/// Sixteen weight rows, decoded and transposed: `q[8b + c]` holds chunk `c` of block `b` of
/// every row (signed weights); `wsum[b]` the rows' `128 · Σw` of block `b`; `d[b]`, `mn[b]`
/// their scales and mins as f32 lanes.
struct Panel {
    q: Vec<__m512i>,
    wsum: Vec<__m512i>,
    d: Vec<__m512>,
    mn: Vec<__m512>,
}

/// `lo` in the lower 256 bits, `hi` in the upper.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: register-only; the caller guarantees AVX-512F.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// `lo` in the lower eight f32 lanes, `hi` in the upper.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn join_ps(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: register-only bit casts and an insert; the caller guarantees AVX-512F.
    unsafe {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
    }
}

/// Decode the weight rows at `w` (`wrb` bytes each, `nb` blocks) into `p`: rows `0..16`, or,
/// with `half`, rows `0..8` in both halves.
///
/// # Safety
/// The CPU has AVX2, F16C, AVX-512F and AVX-512 VNNI.
#[inline(always)]
unsafe fn fill<F: Decode>(w: &[u8], wrb: usize, nb: usize, half: bool, p: &mut Panel) {
    let upper = if half { 0 } else { 8 };
    assert!(w.len() >= (upper + 8) * wrb && nb * F::BYTES <= wrb);
    // SAFETY (whole body): block b < nb of row r < upper + 8 lies in `w` (asserted); the ISA as
    // the caller guarantees.
    unsafe {
        let off = _mm256_set1_epi8(F::OFFSET as i8);
        let ones = _mm512_set1_epi8(1);
        for b in 0..nb {
            let mut v = [[_mm256_setzero_si256(); 8]; 2];
            for (h, v) in v.iter_mut().enumerate() {
                for (r, v) in v.iter_mut().enumerate() {
                    let blk = w.as_ptr().add((h * upper + r) * wrb + b * F::BYTES);
                    *v = if flipped::<F>() {
                        _mm256_sub_epi8(F::decode(blk), off)
                    } else {
                        F::decode(blk)
                    };
                }
            }
            let (lo, hi) = (transpose8(&v[0]), transpose8(&v[1]));
            let mut sum = _mm512_setzero_si512();
            for c in 0..8 {
                let t = join(lo[c], hi[c]);
                p.q[8 * b + c] = t;
                if flipped::<F>() {
                    sum = _mm512_dpbusd_epi32(sum, ones, t);
                }
            }
            p.wsum[b] = _mm512_slli_epi32::<7>(sum);
            let first = w.as_ptr().add(b * F::BYTES);
            let second = first.add(upper * wrb);
            p.d[b] = join_ps(f16x8(first, wrb), f16x8(second, wrb));
            if F::MIN {
                p.mn[b] = join_ps(f16x8(first.add(2), wrb), f16x8(second.add(2), wrb));
            }
        }
    }
}

/// The panel against the activation rows `i0 .. i0 + N` of `a`: per row, the sixteen weight
/// rows' results as lanes.
///
/// # Safety
/// The rows exist in `a`, whose rows have the panel's `nb` blocks; the CPU has AVX-512F and
/// AVX-512 VNNI.
#[inline(always)]
unsafe fn tile<F: Decode, const N: usize>(
    p: &Panel,
    a: &Side,
    acts: &[u8],
    i0: usize,
) -> [__m512; N] {
    let nb = p.d.len();
    // The activation int8: flipped in `a.q` for the signed formats, else the caller's blocks.
    let (ab_len, qs) = act_geometry(F::MIN);
    let (base, stride, at) = if flipped::<F>() {
        (a.q.as_ptr().cast::<u8>(), 32, 0)
    } else {
        (acts.as_ptr(), ab_len, qs)
    };
    assert!(
        acts.len() >= a.d.len() * ab_len && a.q.len() >= if flipped::<F>() { a.d.len() } else { 0 }
    );
    // SAFETY (whole body): blocks b < nb of each activation row (`stride` bytes each from
    // `base`, asserted) and panel vectors 8b .. 8b + 8 exist; the ISA as the caller guarantees.
    unsafe {
        let mut part = [[_mm512_setzero_ps(); 8]; N];
        for j in 0..nb.min(8) {
            let mut acc = [_mm512_setzero_ps(); N];
            for b in (j..nb).step_by(8) {
                let w = p.q.as_ptr().add(8 * b);
                let mut even = [_mm512_setzero_si512(); N];
                let mut odd = [_mm512_setzero_si512(); N];
                for c in (0..8).step_by(2) {
                    let (w0, w1) = (*w.add(c), *w.add(c + 1));
                    for i in 0..N {
                        let q = base.add(stride * ((i0 + i) * a.nb + b) + at + 4 * c);
                        let (q0, q1) = (q.cast::<i32>(), q.add(4).cast::<i32>());
                        let a0 = _mm512_set1_epi32(q0.read_unaligned());
                        let a1 = _mm512_set1_epi32(q1.read_unaligned());
                        // vpdpbusd's first factor is unsigned: the flipped activations, or the
                        // unsigned weights.
                        if flipped::<F>() {
                            even[i] = _mm512_dpbusd_epi32(even[i], a0, w0);
                            odd[i] = _mm512_dpbusd_epi32(odd[i], a1, w1);
                        } else {
                            even[i] = _mm512_dpbusd_epi32(even[i], w0, a0);
                            odd[i] = _mm512_dpbusd_epi32(odd[i], w1, a1);
                        }
                    }
                }
                for i in 0..N {
                    let ab = (i0 + i) * a.nb + b;
                    let dot = _mm512_add_epi32(even[i], odd[i]);
                    let isum = if flipped::<F>() {
                        _mm512_sub_epi32(dot, p.wsum[b])
                    } else if F::OFFSET != 0 {
                        _mm512_sub_epi32(dot, _mm512_set1_epi32(a.off[ab]))
                    } else {
                        dot
                    };
                    let scale = _mm512_mul_ps(p.d[b], _mm512_set1_ps(a.d[ab]));
                    let mut v = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum));
                    if F::MIN {
                        v = _mm512_add_ps(v, _mm512_mul_ps(p.mn[b], _mm512_set1_ps(a.s[ab])));
                    }
                    acc[i] = _mm512_add_ps(acc[i], v);
                }
            }
            for (part, acc) in part.iter_mut().zip(acc) {
                part[j] = acc;
            }
        }
        let mut res = [_mm512_setzero_ps(); N];
        for (res, a) in res.iter_mut().zip(&part) {
            // reduce8, lane by lane: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
            let s0 = _mm512_add_ps(a[0], a[4]);
            let s1 = _mm512_add_ps(a[1], a[5]);
            let s2 = _mm512_add_ps(a[2], a[6]);
            let s3 = _mm512_add_ps(a[3], a[7]);
            *res = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
        }
        res
    }
}

/// The results of activation rows `i .. i + N` (lanes `0..lanes` of each) into `o`, lane `r` of
/// row `i + j` at `o[r · m + i + j]`; returns `N`.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn columns<const N: usize>(
    v: [__m512; N],
    o: &mut [f32],
    i: usize,
    m: usize,
    lanes: usize,
) -> usize {
    for (j, v) in v.into_iter().enumerate() {
        let mut l = [0f32; LANES];
        // SAFETY: 64 writable bytes, unaligned store; AVX-512F as the caller guarantees.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), v) };
        for (r, v) in l.into_iter().take(lanes).enumerate() {
            o[r * m + i + j] = v;
        }
    }
    N
}

/// The first `rows / 8 · 8` weight rows against all `m` activation rows (the arguments are a
/// [`super::RowsFn`]'s): sixteen at a time, then a last eight; returns how many rows it
/// computed (the caller does the rest).
///
/// # Safety
/// The lengths are those `Kernel::rows` checks; the CPU has AVX2, F16C, AVX-512F and AVX-512
/// VNNI.
#[inline(always)]
pub(super) unsafe fn rows<F: Decode>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) -> usize {
    let nb = k / 32;
    let wrb = nb * F::BYTES;
    let ints = if flipped::<F>() {
        Ints::Flipped
    } else {
        Ints::InPlace
    };
    // SAFETY: the ISA as the caller guarantees.
    let a = unsafe { side::<F>(acts, m, nb, ints) };
    // SAFETY: register-only; the caller guarantees AVX-512F.
    let (zi, zf) = unsafe { (_mm512_setzero_si512(), _mm512_setzero_ps()) };
    let mut p = Panel {
        q: vec![zi; 8 * nb],
        wsum: vec![zi; nb],
        d: vec![zf; nb],
        mn: vec![zf; nb],
    };
    let done = rows / 8 * 8;
    for r0 in (0..done).step_by(LANES) {
        let lanes = (done - r0).min(LANES);
        // SAFETY: rows r0 .. r0 + lanes are in `w`; the ISA as the caller guarantees.
        unsafe {
            fill::<F>(
                &w[r0 * wrb..][..lanes * wrb],
                wrb,
                nb,
                lanes < LANES,
                &mut p,
            )
        };
        let o = &mut out[r0 * m..][..lanes * m];
        let mut i = 0;
        while i < m {
            // SAFETY: activation rows i .. i + n <= m of `a`; the ISA as the caller guarantees.
            i += unsafe {
                if i + TILE_M <= m {
                    columns(tile::<F, TILE_M>(&p, &a, acts, i), o, i, m, lanes)
                } else if i + 4 <= m {
                    columns(tile::<F, 4>(&p, &a, acts, i), o, i, m, lanes)
                } else {
                    columns(tile::<F, 1>(&p, &a, acts, i), o, i, m, lanes)
                }
            };
        }
    }
    done
}
