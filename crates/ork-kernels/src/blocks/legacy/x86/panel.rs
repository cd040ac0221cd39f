//! The M > 1 (prefill) kernel of the 32-weight blocks: a register tile of eight weight rows
//! (one per i32 lane, [`crate::blocks::x86`]'s panel layout) by up to four activation rows.
//!
//! Two integer forms, both exact:
//! - **Flipped** (the unsigned decodings, every type on `vpdpbusd`): the weights are stored
//!   signed (`w`, the decoders' `u − OFFSET`) and the activations flipped to unsigned once per
//!   call (`a + 128`, a byte XOR), so that `Σ (a + 128)·w − 128·Σw`, with `Σw` per block and
//!   row taken when the panel is filled, is the block's exact `isum` without any activation
//!   sums. On plain AVX2 each `vpmaddubsw` pair is at most `2·255·WMAX` (`Format::WMAX`), and
//!   the products of [`run_len`] chunks are summed in 16 bits before one `vpmaddwd` widens
//!   them: eight for Q4_0 (`8·2·255·8 = 32640 ≤ 32767`), four for Q4_1 and Q5_0, two for Q5_1.
//!   Q4_0 so does one widening multiply per block and activation row instead of eight.
//! - **Sign trick** (Q8_0 and IQ4_NL on plain AVX2, where `2·255·127` would saturate a flipped
//!   pair): the panel also holds `|w|`, the activations stay signed, and each chunk multiplies
//!   `|w|` (u8) by `a · sign(w)` (i8), as the one-row kernel does: pairs at most `2·128·127`.
//!   Before it, these two types ran the one-row kernel at M > 1 (half the speed).
//!
//! The block's `isum` then takes the scalar twin's float step `(d_w · d_a) · isum [+ m_w · s_a]`
//! with weight rows in lanes, into accumulator `b % 8` of its activation row, and the eight
//! accumulators fold as `order::reduce8` does, lane by lane: every output has the scalar twin's
//! bits.

use super::super::act_geometry;
use super::{f16x8, Decode};
use crate::blocks::x86::{bcast4, panel_columns, transpose8, Dot, PANEL_ROWS};
use std::arch::x86_64::*;

/// Activation rows computed together against one panel (each weight vector loaded once for
/// them; eight independent `vpdpbusd` chains with two per row).
const TILE_M: usize = 4;

/// The smallest M the panel kernel takes: at M = 2 it already beats the one-row kernel
/// (`examples/blocks_speed.rs`, docs/kernels.md).
pub(super) const MIN_M: usize = 2;

/// Whether the panel multiplies by the sign trick (see the module's doc): signed decodings on a
/// dot that saturates.
const fn sign_trick<F: Decode, D: Dot>() -> bool {
    F::SIGNED && !D::WIDE
}

/// How many chunks' `vpmaddubsw` products the flipped form sums in 16 bits before widening: the
/// largest power of two `g ≤ 8` with `g · 2 · 255 · WMAX ≤ 32767`. At least two for every type
/// the flipped form takes on plain AVX2 (`WMAX ≤ 31`; tested below), so that a pair of chunks
/// always fits.
const fn run_len<F: Decode>() -> usize {
    let mut g = 8;
    while g > 1 && g as i32 * 2 * 255 * F::WMAX > i16::MAX as i32 {
        g /= 2;
    }
    g
}

/// Eight weight rows, decoded and transposed: `q[8b + c]` holds chunk `c` of block `b` of every
/// row (signed weights), and for the sign trick `qabs[8b + c]` their `|w|`; `wsum[b]` the rows'
/// `128 · Σw` of block `b` (flipped form); `d[b]`, `mn[b]` their scales and mins as f32 lanes.
struct Panel {
    q: Vec<__m256i>,
    qabs: Vec<__m256i>,
    wsum: Vec<__m256i>,
    d: Vec<__m256>,
    mn: Vec<__m256>,
}

/// How [`side`] keeps the activations' int8.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ints {
    /// Flipped to `a + 128` (u8), one vector of 32 per block.
    Flipped,
    /// As they are (i8), one vector of 32 per block (the sign trick).
    Signed,
    /// Read in place by the kernel: `q` stays empty and `off` holds each block's `OFFSET · Σa`.
    InPlace,
}

/// The `m` activation rows of a call: their int8 as [`Ints`] says (`q`: one vector per block,
/// blocks of all rows back to back; or `off`), and the blocks' `d` (and `s`, types with a min)
/// as f32.
pub(super) struct Side {
    pub(super) q: Vec<__m256i>,
    pub(super) off: Vec<i32>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    pub(super) nb: usize,
}

/// The activation side of `m` rows of `nb` blocks of `F`'s activation type (`ints`: see
/// [`Ints`]).
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[inline(always)]
pub(super) unsafe fn side<F: Decode>(acts: &[u8], m: usize, nb: usize, ints: Ints) -> Side {
    let (ab_len, qs) = act_geometry(F::MIN);
    let blocks = m * nb;
    assert!(acts.len() >= blocks * ab_len);
    let copy = ints != Ints::InPlace;
    let offset = !copy && F::OFFSET != 0;
    let mut sd = Side {
        q: Vec::with_capacity(if copy { blocks } else { 0 }),
        off: Vec::with_capacity(if offset { blocks } else { 0 }),
        d: vec![0.0; blocks],
        s: vec![0.0; if F::MIN { blocks } else { 0 }],
        nb,
    };
    // SAFETY (whole body): block j < blocks of `acts` (asserted); the first `blocks` slots of
    // `sd.q` written before its length is set; 16-byte loads of the 8-lane stack arrays; the ISA
    // as the caller guarantees.
    unsafe {
        let flip = if ints == Ints::Flipped { -128 } else { 0 };
        let (mask, ones) = (_mm256_set1_epi8(flip), _mm256_set1_epi8(1));
        if copy {
            // Written in place (a `push` per block kept the vector's fields on the stack and
            // took ~7 % of the panel's time): the capacity is `blocks`, each slot is written
            // once below, then the length is set.
            for (j, slot) in sd.q.spare_capacity_mut()[..blocks].iter_mut().enumerate() {
                let a = _mm256_loadu_si256(acts.as_ptr().add(j * ab_len + qs).cast());
                slot.write(_mm256_xor_si256(a, mask));
            }
            sd.q.set_len(blocks);
        }
        for j in 0..if offset { blocks } else { 0 } {
            let a = _mm256_loadu_si256(acts.as_ptr().add(j * ab_len + qs).cast());
            // Σa: pairs by `vpmaddubsw` (|2·127| fits i16), then to i32 lanes.
            let pairs = _mm256_maddubs_epi16(ones, a);
            let mut v = [0i32; 8];
            let lanes = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            _mm256_storeu_si256(v.as_mut_ptr().cast(), lanes);
            sd.off.push(F::OFFSET * v.iter().sum::<i32>());
        }
        for j0 in (0..blocks).step_by(8) {
            let n = (blocks - j0).min(8);
            let (mut dh, mut sh) = ([0u16; 8], [0u16; 8]);
            for t in 0..n {
                let blk = &acts[(j0 + t) * ab_len..];
                dh[t] = u16::from_le_bytes([blk[0], blk[1]]);
                sh[t] = u16::from_le_bytes([blk[2], blk[3]]);
            }
            let mut f = [0f32; 8];
            let v = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr().cast()));
            _mm256_storeu_ps(f.as_mut_ptr(), v);
            sd.d[j0..j0 + n].copy_from_slice(&f[..n]);
            if F::MIN {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(sh.as_ptr().cast()));
                _mm256_storeu_ps(f.as_mut_ptr(), v);
                sd.s[j0..j0 + n].copy_from_slice(&f[..n]);
            }
        }
    }
    sd
}

/// Decode the `PANEL_ROWS` rows at `w` (`wrb` bytes each, `nb` blocks) into `p`.
///
/// # Safety
/// The CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn fill<F: Decode, D: Dot>(w: &[u8], wrb: usize, nb: usize, p: &mut Panel) {
    assert!(w.len() >= PANEL_ROWS * wrb && nb * F::BYTES <= wrb);
    // SAFETY (whole body): block b < nb of row r < PANEL_ROWS lies in `w` (asserted); the ISA
    // as the caller guarantees.
    unsafe {
        let off = _mm256_set1_epi8(F::OFFSET as i8);
        let ones = _mm256_set1_epi8(1);
        for b in 0..nb {
            let mut v = [_mm256_setzero_si256(); PANEL_ROWS];
            for (r, v) in v.iter_mut().enumerate() {
                let blk = w.as_ptr().add(r * wrb + b * F::BYTES);
                *v = _mm256_sub_epi8(F::decode(blk), off);
            }
            let t = transpose8(&v);
            p.q[8 * b..8 * b + 8].copy_from_slice(&t);
            if sign_trick::<F, D>() {
                for (c, t) in t.iter().enumerate() {
                    p.qabs[8 * b + c] = _mm256_sign_epi8(*t, *t);
                }
            } else {
                let mut sum = _mm256_setzero_si256();
                for t in &t {
                    sum = D::dot_acc(sum, ones, *t);
                }
                p.wsum[b] = _mm256_slli_epi32::<7>(sum);
            }
            let first = w.as_ptr().add(b * F::BYTES);
            p.d[b] = f16x8(first, wrb);
            if F::MIN {
                p.mn[b] = f16x8(first.add(2), wrb);
            }
        }
    }
}

/// The exact `isum` of block `b` of the panel against the activation rows `rows` of `a` (the
/// module doc's two forms), weight rows in lanes.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn isums<F: Decode, D: Dot, const N: usize>(
    p: &Panel,
    a: &Side,
    rows: [usize; N],
    b: usize,
) -> [__m256i; N] {
    // SAFETY (whole body): as the caller guarantees ([`tile`]'s safety).
    unsafe {
        let w = p.q.as_ptr().add(8 * b);
        let act = |i: usize, c: usize| -> *const u8 {
            a.q.as_ptr()
                .cast::<u8>()
                .add(32 * (rows[i] * a.nb + b) + 4 * c)
        };
        let mut acc = [_mm256_setzero_si256(); N];
        if D::WIDE {
            // Two chains per row, so that eight `vpdpbusd` are independent.
            let mut odd = [_mm256_setzero_si256(); N];
            for c in (0..8).step_by(2) {
                let (w0, w1) = (*w.add(c), *w.add(c + 1));
                for i in 0..N {
                    acc[i] = D::dot_acc(acc[i], bcast4(act(i, c)), w0);
                    odd[i] = D::dot_acc(odd[i], bcast4(act(i, c + 1)), w1);
                }
            }
            for i in 0..N {
                acc[i] = _mm256_sub_epi32(_mm256_add_epi32(acc[i], odd[i]), p.wsum[b]);
            }
            return acc;
        }
        if sign_trick::<F, D>() {
            let wabs = p.qabs.as_ptr().add(8 * b);
            for c in 0..8 {
                let (wc, uc) = (*w.add(c), *wabs.add(c));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let s = _mm256_sign_epi8(bcast4(act(i, c)), wc);
                    *acc = D::dot_acc(*acc, uc, s);
                }
            }
            return acc;
        }
        // Flipped: runs of `g` chunks summed in 16 bits (exact, see `run_len`), then widened;
        // two chunks at a time for every row, so that few registers are live.
        let (g, ones) = (run_len::<F>(), _mm256_set1_epi16(1));
        debug_assert!(g >= 2);
        let mut run = [_mm256_setzero_si256(); N];
        for c in (0..8).step_by(2) {
            let (w0, w1) = (*w.add(c), *w.add(c + 1));
            for i in 0..N {
                let p0 = _mm256_maddubs_epi16(bcast4(act(i, c)), w0);
                let p1 = _mm256_maddubs_epi16(bcast4(act(i, c + 1)), w1);
                let pair = _mm256_add_epi16(p0, p1);
                run[i] = if c % g == 0 {
                    pair
                } else {
                    _mm256_add_epi16(run[i], pair)
                };
                if (c + 2) % g == 0 {
                    acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(run[i], ones));
                }
            }
        }
        for acc in &mut acc {
            *acc = _mm256_sub_epi32(*acc, p.wsum[b]);
        }
        acc
    }
}

/// The panel against the activation rows `rows` of `a`: per row, the eight weight rows'
/// results as lanes.
///
/// # Safety
/// The rows exist in `a`, whose rows have the panel's `nb` blocks; the CPU has AVX2, F16C and
/// `D`'s instructions.
#[inline(always)]
unsafe fn tile<F: Decode, D: Dot, const N: usize>(
    p: &Panel,
    a: &Side,
    rows: [usize; N],
) -> [__m256; N] {
    let nb = p.d.len();
    // SAFETY (whole body): blocks b < nb of each activation row (32 bytes each in `a.q`) and
    // panel vectors 8b .. 8b + 8 exist; the ISA as the caller guarantees.
    unsafe {
        // Accumulator `b % 8` of each activation row, one residue class at a time (blocks r,
        // r + 8, …), so that the row's accumulator stays in a register: the same additions in
        // the same order as the scalar twin's lanes, without a load and a store per block.
        // `acc[r][i]`: accumulator r of activation row i.
        let mut acc = [[_mm256_setzero_ps(); N]; 8];
        for (r, acc) in acc.iter_mut().enumerate().take(nb) {
            // A local (in registers) while its blocks run.
            let mut lane = [_mm256_setzero_ps(); N];
            for b in (r..nb).step_by(8) {
                let isum = isums::<F, D, N>(p, a, rows, b);
                for i in 0..N {
                    let j = rows[i] * a.nb + b;
                    let scale = _mm256_mul_ps(p.d[b], _mm256_set1_ps(a.d[j]));
                    let mut v = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum[i]));
                    if F::MIN {
                        v = _mm256_add_ps(v, _mm256_mul_ps(p.mn[b], _mm256_set1_ps(a.s[j])));
                    }
                    lane[i] = _mm256_add_ps(lane[i], v);
                }
            }
            *acc = lane;
        }
        let mut res = [_mm256_setzero_ps(); N];
        for (i, res) in res.iter_mut().enumerate() {
            // reduce8, lane by lane: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
            let s0 = _mm256_add_ps(acc[0][i], acc[4][i]);
            let s1 = _mm256_add_ps(acc[1][i], acc[5][i]);
            let s2 = _mm256_add_ps(acc[2][i], acc[6][i]);
            let s3 = _mm256_add_ps(acc[3][i], acc[7][i]);
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
    let ints = if sign_trick::<F, D>() {
        Ints::Signed
    } else {
        Ints::Flipped
    };
    // SAFETY: the ISA as the caller guarantees.
    let a = unsafe { side::<F>(acts, m, nb, ints) };
    // SAFETY: register-only; the caller guarantees AVX.
    let (zi, zf) = unsafe { (_mm256_setzero_si256(), _mm256_setzero_ps()) };
    let mut p = Panel {
        q: vec![zi; 8 * nb],
        qabs: vec![zi; if sign_trick::<F, D>() { 8 * nb } else { 0 }],
        wsum: vec![zi; if sign_trick::<F, D>() { 0 } else { nb }],
        d: vec![zf; nb],
        mn: vec![zf; nb],
    };
    let panels = rows / PANEL_ROWS;
    for pi in 0..panels {
        let r0 = pi * PANEL_ROWS;
        // SAFETY: rows r0 .. r0 + 8 are in `w`; the ISA as the caller guarantees.
        unsafe { fill::<F, D>(&w[r0 * wrb..][..PANEL_ROWS * wrb], wrb, nb, &mut p) };
        let o = &mut out[r0 * m..][..PANEL_ROWS * m];
        // SAFETY: rows i .. i + 4 < m of `a`; the ISA as the caller guarantees.
        unsafe {
            panel_columns(
                o,
                m,
                |i| tile::<F, D, TILE_M>(&p, &a, [i, i + 1, i + 2, i + 3]),
                |i| tile::<F, D, 1>(&p, &a, [i])[0],
            )
        };
    }
    panels * PANEL_ROWS
}

#[cfg(test)]
mod tests {
    use super::super::super::{Q4_0, Q4_1, Q5_0, Q5_1};
    use super::run_len;

    /// The flipped form's 16-bit runs: eight chunks for Q4_0, four for Q4_1 and Q5_0, two for
    /// Q5_1 (`run_len`'s bound; a pair of chunks always fits).
    #[test]
    fn flipped_types_sum_runs_of_at_least_two_chunks() {
        let runs = [
            run_len::<Q4_0>(),
            run_len::<Q4_1>(),
            run_len::<Q5_0>(),
            run_len::<Q5_1>(),
        ];
        assert_eq!(runs, [8, 4, 4, 2]);
    }
}
