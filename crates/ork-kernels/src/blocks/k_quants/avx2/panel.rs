//! The M > 1 (prefill) kernel of the k-quants with unsigned quants (Q2_K … Q6_K; IQ4_XS keeps
//! the one-row kernel): a register tile of eight weight rows (one per i32 lane,
//! [`crate::blocks::x86`]'s panel layout) by up to four activation rows.
//!
//! Each super-block of the eight rows is decoded once per call (the AVX2 engine's [`Super`]) and
//! its 256 quants transposed into 64 chunk vectors. Per activation row and super-block, a scale
//! group's exact dot is four (Q4_K, Q5_K: eight, their two 16-value groups share a scale)
//! broadcast-chunk dots, times the group's scale (`vpmulld`, wrapping as the scalar twin);
//! `summ = Σ mn_g · bsum_g` is eight `vpmaddwd` of the rows' (mn, mn) pairs by a broadcast
//! bsum pair. The float step is [`super::super::step`]'s, with weight rows in lanes; every output
//! has the scalar twin's bits. The quants are at most 63, so `vpmaddubsw`'s pair sums stay
//! exact (`2·63·128 < 2¹⁵`) and plain AVX2 runs the panel too.

use super::super::{Engine, KType, Super, Q8K_BSUMS, Q8K_BYTES, QK_K};
use super::Avx2 as Avx2Engine;
use crate::blocks::x86::{bcast4, panel_columns, transpose8, Dot, PANEL_ROWS};
use std::arch::x86_64::*;

/// Activation rows computed together against one panel.
const TILE_M: usize = 4;

/// The smallest M the panel kernel takes (as the 32-weight blocks').
pub(super) const MIN_M: usize = 2;

/// Whether the panel kernel computes `t` (unsigned quants only).
pub(super) const fn fits(t: KType) -> bool {
    !matches!(t, KType::Iq4Xs)
}

/// Eight weight rows, decoded and transposed, per super-block `b`: `q[64b + c]` chunk `c` of
/// the 256 quants, `sc[16b + g]` and `mn[8b + p]` the group scales (i32 lanes) and min pairs
/// (`mn_{2p}` low, `mn_{2p+1}` high i16 of each lane), `d[b]`, `dmin[b]`.
struct Panel {
    q: Vec<__m256i>,
    sc: Vec<__m256i>,
    mn: Vec<__m256i>,
    d: Vec<__m256>,
    dmin: Vec<__m256>,
}

/// Decode the `PANEL_ROWS` rows at `w` (`wrb` bytes each, `nb` super-blocks of `t`) into `p`.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn fill(t: KType, w: &[u8], wrb: usize, p: &mut Panel, s: &mut [Super; PANEL_ROWS]) {
    for b in 0..p.d.len() {
        for (r, s) in s.iter_mut().enumerate() {
            Avx2Engine::decode(t, &w[r * wrb + b * t.bytes()..][..t.bytes()], s);
        }
        // SAFETY (whole block): loads of 32 bytes at 32j (j < 8) of each 256-byte `u`, 32-byte
        // loads of the 8-lane stack arrays; AVX2 as the caller guarantees.
        unsafe {
            for j in 0..QK_K / 32 {
                let mut v = [_mm256_setzero_si256(); PANEL_ROWS];
                for (v, s) in v.iter_mut().zip(s.iter()) {
                    *v = _mm256_loadu_si256(s.u.as_ptr().add(32 * j).cast());
                }
                p.q[64 * b + 8 * j..][..8].copy_from_slice(&transpose8(&v));
            }
            for g in 0..16 {
                let sc: [i32; PANEL_ROWS] = std::array::from_fn(|r| i32::from(s[r].sc[g]));
                p.sc[16 * b + g] = _mm256_loadu_si256(sc.as_ptr().cast());
            }
            for q in 0..8 {
                let pair = |r: usize| {
                    let (lo, hi) = (s[r].mn[2 * q] as u16, s[r].mn[2 * q + 1] as u16);
                    (u32::from(lo) | (u32::from(hi) << 16)) as i32
                };
                let mn: [i32; PANEL_ROWS] = std::array::from_fn(pair);
                p.mn[8 * b + q] = _mm256_loadu_si256(mn.as_ptr().cast());
            }
            let d: [f32; PANEL_ROWS] = std::array::from_fn(|r| s[r].d);
            let dmin: [f32; PANEL_ROWS] = std::array::from_fn(|r| s[r].dmin);
            p.d[b] = _mm256_loadu_ps(d.as_ptr());
            p.dmin[b] = _mm256_loadu_ps(dmin.as_ptr());
        }
    }
}

/// `(sumi, summ)` of super-block `b` of the panel against the `N` Q8_K blocks at `a`, weight
/// rows in lanes; `G` chunks per scale group (4, or 8 where two groups share a scale).
///
/// # Safety
/// Each `a[i]` points at a whole Q8_K block; the CPU has AVX2 and `D`'s instructions.
#[inline(always)]
unsafe fn dots<D: Dot, const N: usize, const G: usize>(
    p: &Panel,
    b: usize,
    a: [*const u8; N],
) -> [(__m256i, __m256i); N] {
    // SAFETY (whole body): panel vectors of super-block b < nb; chunks 4c < 256 of the
    // quants (from byte 4) and the 32 bsum bytes of each block; the ISA as the caller
    // guarantees.
    unsafe {
        let mut sumi = [_mm256_setzero_si256(); N];
        for g in 0..64 / G {
            let w = p.q.as_ptr().add(64 * b + G * g);
            let mut even = [_mm256_setzero_si256(); N];
            let mut odd = [_mm256_setzero_si256(); N];
            for c in (0..G).step_by(2) {
                let (w0, w1) = (*w.add(c), *w.add(c + 1));
                for i in 0..N {
                    let q = a[i].add(4 + 4 * (G * g + c));
                    even[i] = D::dot_acc(even[i], w0, bcast4(q));
                    odd[i] = D::dot_acc(odd[i], w1, bcast4(q.add(4)));
                }
            }
            let sc = p.sc[16 * b + G / 4 * g];
            for i in 0..N {
                let gd = _mm256_add_epi32(even[i], odd[i]);
                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_mullo_epi32(gd, sc));
            }
        }
        let mut res = [(_mm256_setzero_si256(), _mm256_setzero_si256()); N];
        for i in 0..N {
            let mut summ = _mm256_setzero_si256();
            for q in 0..8 {
                let bs = bcast4(a[i].add(Q8K_BSUMS + 4 * q));
                summ = _mm256_add_epi32(summ, _mm256_madd_epi16(p.mn[8 * b + q], bs));
            }
            res[i] = (sumi[i], summ);
        }
        res
    }
}

/// The panel against `N` activation rows (each `nb` Q8_K blocks at `a[i]`): per row, the eight
/// weight rows' results as lanes, super-block by super-block in the scalar twin's float order.
///
/// # Safety
/// As [`dots`] for every block of each row.
#[inline(always)]
unsafe fn tile<D: Dot, const N: usize, const T: u8>(p: &Panel, a: [&[u8]; N]) -> [__m256; N] {
    let t = super::super::ktype(T);
    // SAFETY (whole body): blocks b < nb of each row (the caller's guarantee); register-only
    // float arithmetic; the ISA as the caller guarantees.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..p.d.len() {
            let blocks: [*const u8; N] = std::array::from_fn(|i| a[i][b * Q8K_BYTES..].as_ptr());
            let sums = if matches!(t, KType::Q4 | KType::Q5) {
                dots::<D, N, 8>(p, b, blocks)
            } else {
                dots::<D, N, 4>(p, b, blocks)
            };
            for i in 0..N {
                let da = _mm256_set1_ps(blocks[i].cast::<f32>().read_unaligned());
                let (sumi, summ) = sums[i];
                let scale = _mm256_mul_ps(p.d[b], da);
                if t.has_mins() {
                    let hi = _mm256_add_ps(acc[i], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sumi)));
                    let lo = _mm256_mul_ps(_mm256_mul_ps(p.dmin[b], da), _mm256_cvtepi32_ps(summ));
                    acc[i] = _mm256_sub_ps(hi, lo);
                } else {
                    let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, summ));
                    acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(scale, v));
                }
            }
        }
        acc
    }
}

/// The first `rows / 8 · 8` weight rows of type `T` against all `m` activation rows (the
/// arguments are a [`crate::blocks::RowsFn`]'s); returns how many rows it computed.
///
/// # Safety
/// The lengths are those `Kernel::rows` checks; the CPU has AVX2 and `D`'s instructions.
#[inline(always)]
pub(super) unsafe fn rows<D: Dot, const T: u8>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) -> usize {
    let t = super::super::ktype(T);
    let nb = k / QK_K;
    let (wrb, arb) = (nb * t.bytes(), nb * Q8K_BYTES);
    assert!(w.len() >= rows * wrb && acts.len() >= m * arb && out.len() >= rows * m);
    // SAFETY: register-only; the caller guarantees AVX.
    let (zi, zf) = unsafe { (_mm256_setzero_si256(), _mm256_setzero_ps()) };
    let mut p = Panel {
        q: vec![zi; 64 * nb],
        sc: vec![zi; 16 * nb],
        mn: vec![zi; 8 * nb],
        d: vec![zf; nb],
        dmin: vec![zf; nb],
    };
    let mut supers: Box<[Super; PANEL_ROWS]> = Box::new(std::array::from_fn(|_| Super::zero()));
    let act = |i: usize| &acts[i * arb..][..arb];
    let panels = rows / PANEL_ROWS;
    for pi in 0..panels {
        let r0 = pi * PANEL_ROWS;
        // SAFETY: the ISA as the caller guarantees.
        unsafe {
            fill(
                t,
                &w[r0 * wrb..][..PANEL_ROWS * wrb],
                wrb,
                &mut p,
                &mut supers,
            )
        };
        let o = &mut out[r0 * m..][..PANEL_ROWS * m];
        // SAFETY: whole rows of nb blocks; the ISA as the caller guarantees.
        unsafe {
            panel_columns(
                o,
                m,
                |i| tile::<D, TILE_M, T>(&p, [act(i), act(i + 1), act(i + 2), act(i + 3)]),
                |i| tile::<D, 1, T>(&p, [act(i)])[0],
            )
        };
    }
    panels * PANEL_ROWS
}
