//! The M > 1 (prefill) kernel of the 32-weight blocks: a register tile of eight weight rows
//! (one per i32 lane, [`crate::blocks::x86`]'s panel layout) by up to four activation rows.
//!
//! Each block's decoded weights are stored unsigned, `u = w + OFFSET` (Q4_0 8, Q5_0 16, Q4_1 and
//! Q5_1 0 as the decoders give them; Q8_0 and IQ4_NL, signed, flipped by `+ 128`, which needs
//! the exact `vpdpbusd`: on plain AVX2 those two types keep the one-row kernel). The block's
//! exact `isum = Σ u·a − OFFSET · Σa` then takes the scalar twin's float step
//! `(d_w · d_a) · isum [+ m_w · s_a]` with weight rows in lanes, into accumulator `b % 8` of its
//! activation row, and the eight accumulators fold as [`super::super::order::reduce8`] does, lane
//! by lane: every output has the scalar twin's bits.

use super::super::{act_geometry, ActRow, Acts};
use super::{f16x8, Decode};
use crate::blocks::x86::{bcast4, scatter_rows, transpose8, Dot, PANEL_ROWS};
use std::arch::x86_64::*;

/// Activation rows computed together against one panel (each weight vector loaded once for
/// them; eight independent `vpdpbusd` chains with two per row).
const TILE_M: usize = 4;

/// The smallest M the panel kernel takes: below it the transpose costs more than it saves
/// (`examples/blocks_speed.rs`, docs/kernels.md).
pub(super) const MIN_M: usize = 2;

/// Eight weight rows, decoded and transposed: `q[8b + c]` holds chunk `c` of block `b` of every
/// row; `d[b]`, `mn[b]` the rows' scales and mins of block `b` as f32 lanes.
struct Panel {
    q: Vec<__m256i>,
    d: Vec<__m256>,
    mn: Vec<__m256>,
}

/// What `u` is offset by from the signed weight.
const fn offset<F: Decode>() -> i32 {
    if F::SIGNED {
        128
    } else {
        F::OFFSET
    }
}

/// Whether the panel kernel computes `F` exactly with the dot `D`.
pub(super) const fn fits<F: Decode, D: Dot>() -> bool {
    D::WIDE || !F::SIGNED
}

/// Decode the `PANEL_ROWS` rows at `w` (`wrb` bytes each, `nb` blocks) into `p`.
///
/// # Safety
/// `w` holds `PANEL_ROWS · wrb` bytes; the CPU has AVX2 and F16C.
#[inline(always)]
unsafe fn fill<F: Decode>(w: &[u8], wrb: usize, nb: usize, p: &mut Panel) {
    debug_assert!(w.len() >= PANEL_ROWS * wrb);
    // SAFETY (whole body): block b < nb of row r < PANEL_ROWS lies in `w`; the ISA as the
    // caller guarantees.
    unsafe {
        let flip = _mm256_set1_epi8(if F::SIGNED { -128 } else { 0 });
        for b in 0..nb {
            let mut v = [_mm256_setzero_si256(); PANEL_ROWS];
            for (r, v) in v.iter_mut().enumerate() {
                let blk = w.as_ptr().add(r * wrb + b * F::BYTES);
                *v = _mm256_xor_si256(F::decode(blk), flip);
            }
            p.q[8 * b..8 * b + 8].copy_from_slice(&transpose8(&v));
            let first = w.as_ptr().add(b * F::BYTES);
            p.d[b] = f16x8(first, wrb);
            if F::MIN {
                p.mn[b] = f16x8(first.add(2), wrb);
            }
        }
    }
}

/// The panel against `N` activation rows: per row, the eight weight rows' results as lanes.
///
/// # Safety
/// Every `a[i]` has the panel's `nb` blocks; the CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn tile<F: Decode, D: Dot, const N: usize>(p: &Panel, a: [ActRow<'_>; N]) -> [__m256; N] {
    let (ab_len, qs) = act_geometry(F::MIN);
    let nb = p.d.len();
    // SAFETY (whole body): blocks b < nb of each activation row (32 int8 at `qs` of each) and
    // panel vectors 8b .. 8b + 8 exist; the ISA as the caller guarantees.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 8]; N];
        for b in 0..nb {
            let w = p.q.as_ptr().add(8 * b);
            let mut even = [_mm256_setzero_si256(); N];
            let mut odd = [_mm256_setzero_si256(); N];
            for c in (0..8).step_by(2) {
                let (w0, w1) = (*w.add(c), *w.add(c + 1));
                for i in 0..N {
                    let q = a[i].q.as_ptr().add(b * ab_len + qs + 4 * c);
                    even[i] = D::dot_acc(even[i], w0, bcast4(q));
                    odd[i] = D::dot_acc(odd[i], w1, bcast4(q.add(4)));
                }
            }
            for i in 0..N {
                let mut isum = _mm256_add_epi32(even[i], odd[i]);
                if offset::<F>() != 0 {
                    let off = _mm256_set1_epi32(offset::<F>() * a[i].sum[b]);
                    isum = _mm256_sub_epi32(isum, off);
                }
                let scale = _mm256_mul_ps(p.d[b], _mm256_set1_ps(a[i].d[b]));
                let mut v = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum));
                if F::MIN {
                    v = _mm256_add_ps(v, _mm256_mul_ps(p.mn[b], _mm256_set1_ps(a[i].s[b])));
                }
                acc[i][b % 8] = _mm256_add_ps(acc[i][b % 8], v);
            }
        }
        let mut res = [_mm256_setzero_ps(); N];
        for (res, a) in res.iter_mut().zip(&acc) {
            // reduce8, lane by lane: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
            let s0 = _mm256_add_ps(a[0], a[4]);
            let s1 = _mm256_add_ps(a[1], a[5]);
            let s2 = _mm256_add_ps(a[2], a[6]);
            let s3 = _mm256_add_ps(a[3], a[7]);
            *res = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
        }
        res
    }
}

/// The first `rows / 8 · 8` weight rows against all `m` activation rows (the arguments are a
/// [`super::RowsFn`]'s); returns how many rows it computed (the caller does the rest).
///
/// # Safety
/// The lengths are those `Kernel::rows` checks; the CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
pub(super) unsafe fn rows<F: Decode, D: Dot>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) -> usize {
    let nb = k / 32;
    let wrb = nb * F::BYTES;
    let a = Acts::new(acts, nb, F::MIN);
    // SAFETY: register-only; the caller guarantees AVX.
    let (zi, zf) = unsafe { (_mm256_setzero_si256(), _mm256_setzero_ps()) };
    let mut p = Panel {
        q: vec![zi; 8 * nb],
        d: vec![zf; nb],
        mn: vec![zf; nb],
    };
    let panels = rows / PANEL_ROWS;
    for pi in 0..panels {
        let r0 = pi * PANEL_ROWS;
        // SAFETY: rows r0 .. r0 + 8 are in `w`; the ISA as the caller guarantees.
        unsafe { fill::<F>(&w[r0 * wrb..][..PANEL_ROWS * wrb], wrb, nb, &mut p) };
        let o = &mut out[r0 * m..][..PANEL_ROWS * m];
        let mut i = 0;
        while i < m {
            let mut lanes = [[0f32; PANEL_ROWS]; TILE_M];
            let n = if i + TILE_M <= m {
                let rows4 = [a.row(i), a.row(i + 1), a.row(i + 2), a.row(i + 3)];
                // SAFETY: the activation rows have nb blocks; the ISA as above.
                let v = unsafe { tile::<F, D, TILE_M>(&p, rows4) };
                for (l, v) in lanes.iter_mut().zip(v) {
                    // SAFETY: 32 writable bytes, unaligned store.
                    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
                }
                TILE_M
            } else {
                // SAFETY: as above.
                let [v] = unsafe { tile::<F, D, 1>(&p, [a.row(i)]) };
                // SAFETY: 32 writable bytes, unaligned store.
                unsafe { _mm256_storeu_ps(lanes[0].as_mut_ptr(), v) };
                1
            };
            for (j, l) in lanes.into_iter().take(n).enumerate() {
                scatter_rows(l, &mut o[i + j..], m);
            }
            i += n;
        }
    }
    panels * PANEL_ROWS
}
