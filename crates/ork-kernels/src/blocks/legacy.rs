//! The 32-weight block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against Q8_0 / Q8_1
//! activation blocks.
//!
//! Block layouts are ggml's (`ggml/src/ggml-common.h`: `block_q4_0` … `block_iq4_nl`, all
//! little-endian, f16 scales first). Within a block of 32, the 16 bytes of nibbles hold weight
//! `j` in the low nibble of byte `j` and weight `j + 16` in its high nibble; Q5's fifth bit of
//! weight `j` is bit `j` of the little-endian u32 `qh`. Decoded integer weights:
//! Q4_0 `nib − 8`, Q4_1 `nib`, Q5_0 `v − 16`, Q5_1 `v`, Q8_0 the int8, IQ4_NL
//! `kvalues_iq4nl[nib]` (`ggml-common.h`).
//!
//! The order (what the scalar twin [`rows_scalar`] does and every SIMD kernel reproduces): per
//! block `b` an exact i32 `isum = Σ w_j · a_j`, then the block's value
//! `v = (d_w · d_a) · isum` (Q4_1/Q5_1: `v = (d_w · d_a) · isum + m_w · s_a`), added to lane
//! `b % 8` of eight f32 accumulators, folded by [`super::order::reduce8`]. ggml's generic
//! `ggml_vec_dot_q4_0_q8_0` … (`ggml-cpu/quants.c`) compute the same per-block terms; it adds
//! them in another order, so results agree with ggml's to f32 rounding, not bit for bit.
//!
//! Activation int8 values are in −127..=127 ([`super::act`] never writes −128); the SIMD
//! kernels rely on it (`vpmaddubsw`'s sign trick).

use super::order::reduce8;
use super::{Family, Isa, RowsFn, WeightType};

/// `$f::<F>` as a [`RowsFn`] for the block format `F` of the weight type `$ty`, or `return
/// None` from the enclosing function for a type outside this module: the one type → format
/// table the ISA modules' dispatchers share (`x86.rs` keeps its own copy of it for now, in
/// `rows`'s `pick!`: that file is the x86 kernels' and can switch to this macro as it is).
macro_rules! by_format {
    ($ty:expr, $f:ident) => {
        match $ty {
            WeightType::Q4_0 => $f::<Q4_0> as RowsFn,
            WeightType::Q4_1 => $f::<Q4_1>,
            WeightType::Q5_0 => $f::<Q5_0>,
            WeightType::Q5_1 => $f::<Q5_1>,
            WeightType::Q8_0 => $f::<Q8_0>,
            WeightType::IQ4_NL => $f::<Iq4Nl>,
            _ => return None,
        }
    };
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

/// ggml's `kvalues_iq4nl` (`ggml/src/ggml-common.h`): IQ4_NL's 16 non-linear levels.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One 32-weight block format.
pub(super) trait Format {
    /// Bytes of one block.
    const BYTES: usize;
    /// Whether the block has a min `m` (f16 at byte 2): Q4_1, Q5_1, which pair with Q8_1
    /// activations; the others pair with Q8_0.
    const MIN: bool;
    /// The largest `|w|` of [`Format::weights`] over every possible block (the bound that the
    /// AVX2 panel kernel's 16-bit sums are sized by; read there and by the tests only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const WMAX: i32;
    /// The 32 integer weights of `blk` (`BYTES` bytes).
    fn weights(blk: &[u8]) -> [i8; 32];
}

/// Bytes of one activation block and the offset of its 32 int8 in it: Q8_1 (`d`, `s`, qs) for
/// the types with a min, Q8_0 (`d`, qs) for the others.
pub(super) const fn act_geometry(min: bool) -> (usize, usize) {
    if min {
        (36, 4)
    } else {
        (34, 2)
    }
}

/// The f16 at byte `at` of `b`, as f32 (exact).
#[inline]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    #[cfg(target_arch = "aarch64")]
    return super::neon::f16_to_f32(h);
    #[cfg(not(target_arch = "aarch64"))]
    half::f16::from_bits(h).to_f32()
}

/// The 32 nibbles of the 16 bytes `qs`, weight `j` low and `j + 16` high.
fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|j| if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 })
}

/// Q5's 5-bit values from the nibbles at `qs` and the fifth bits in the u32 at `qh`.
fn five_bits(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let n = nibbles(qs);
    std::array::from_fn(|j| n[j] | ((((h >> j) & 1) as u8) << 4))
}

/// `block_q4_0`: d, qs[16].
pub(super) struct Q4_0;
/// `block_q4_1`: d, m, qs[16].
pub(super) struct Q4_1;
/// `block_q5_0`: d, qh[4], qs[16].
pub(super) struct Q5_0;
/// `block_q5_1`: d, m, qh[4], qs[16].
pub(super) struct Q5_1;
/// `block_q8_0`: d, qs[32] (int8).
pub(super) struct Q8_0;
/// `block_iq4_nl`: d, qs[16] (indices into [`KVALUES_IQ4NL`]).
pub(super) struct Iq4Nl;

impl Format for Q4_0 {
    const BYTES: usize = 18;
    const MIN: bool = false;
    const WMAX: i32 = 8;
    fn weights(blk: &[u8]) -> [i8; 32] {
        nibbles(&blk[2..18]).map(|n| n as i8 - 8)
    }
}

impl Format for Q4_1 {
    const BYTES: usize = 20;
    const MIN: bool = true;
    const WMAX: i32 = 15;
    fn weights(blk: &[u8]) -> [i8; 32] {
        nibbles(&blk[4..20]).map(|n| n as i8)
    }
}

impl Format for Q5_0 {
    const BYTES: usize = 22;
    const MIN: bool = false;
    const WMAX: i32 = 16;
    fn weights(blk: &[u8]) -> [i8; 32] {
        five_bits(&blk[2..6], &blk[6..22]).map(|v| v as i8 - 16)
    }
}

impl Format for Q5_1 {
    const BYTES: usize = 24;
    const MIN: bool = true;
    const WMAX: i32 = 31;
    fn weights(blk: &[u8]) -> [i8; 32] {
        five_bits(&blk[4..8], &blk[8..24]).map(|v| v as i8)
    }
}

impl Format for Q8_0 {
    const BYTES: usize = 34;
    const MIN: bool = false;
    const WMAX: i32 = 128;
    fn weights(blk: &[u8]) -> [i8; 32] {
        std::array::from_fn(|j| blk[2 + j] as i8)
    }
}

impl Format for Iq4Nl {
    const BYTES: usize = 18;
    const MIN: bool = false;
    const WMAX: i32 = 127;
    fn weights(blk: &[u8]) -> [i8; 32] {
        nibbles(&blk[2..18]).map(|n| KVALUES_IQ4NL[n as usize])
    }
}

/// The 32-weight block kernels (dispatched by `super::Kernel::with_isa`).
pub(super) const FAMILY: Family = Family {
    scalar: |ty| Some(by_format!(ty, rows_scalar)),
    #[cfg(target_arch = "x86_64")]
    simd: x86::rows,
    #[cfg(target_arch = "aarch64")]
    simd: neon::rows,
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    simd: |_, _| None,
};

/// Block `b`'s value: `(d_w · d_a) · isum`, plus `m_w · s_a` for the types with a min.
#[inline(always)]
pub(super) fn block_value<F: Format>(wb: &[u8], ab: &[u8], isum: i32) -> f32 {
    let v = (f16_at(wb, 0) * f16_at(ab, 0)) * isum as f32;
    if F::MIN {
        v + f16_at(wb, 2) * f16_at(ab, 2)
    } else {
        v
    }
}

/// Block `b`'s exact integer dot.
#[inline(always)]
fn block_isum<F: Format>(wb: &[u8], ab: &[u8]) -> i32 {
    let (_, qs) = act_geometry(F::MIN);
    let w = F::weights(wb);
    (0..32).map(|j| w[j] as i32 * ab[qs + j] as i8 as i32).sum()
}

/// The scalar twin: fixes the order every SIMD kernel reproduces (module docs).
pub(super) fn rows_scalar<F: Format>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) {
    let nb = k / 32;
    let (ab_len, _) = act_geometry(F::MIN);
    let (wrb, arb) = (nb * F::BYTES, nb * ab_len);
    for r in 0..rows {
        let wr = &w[r * wrb..][..wrb];
        for i in 0..m {
            let ar = &acts[i * arb..][..arb];
            let mut acc = [0f32; 8];
            for (b, (wb, ab)) in wr
                .chunks_exact(F::BYTES)
                .zip(ar.chunks_exact(ab_len))
                .enumerate()
            {
                acc[b % 8] += block_value::<F>(wb, ab, block_isum::<F>(wb, ab));
            }
            out[r * m + i] = reduce8(&acc);
        }
    }
}

/// Finish a row's SIMD result: `lanes` (the eight accumulators after the whole groups of eight
/// blocks) gain the tail blocks `from..nb`, whose exact integer dots `isum(b)` gives, then fold.
#[inline(always)]
pub(super) fn finish<F: Format>(
    mut lanes: [f32; 8],
    wr: &[u8],
    ar: &[u8],
    from: usize,
    mut isum: impl FnMut(usize) -> i32,
) -> f32 {
    let (ab_len, _) = act_geometry(F::MIN);
    for b in from..wr.len() / F::BYTES {
        let (wb, ab) = (&wr[b * F::BYTES..][..F::BYTES], &ar[b * ab_len..][..ab_len]);
        lanes[b % 8] += block_value::<F>(wb, ab, isum(b));
    }
    reduce8(&lanes)
}

/// The `m` activation rows of a call with their per-block fields decoded once (reused by every
/// weight row): `d` and `s` as f32, and `Σq` (exact) of every block.
pub(super) struct Acts<'a> {
    bytes: &'a [u8],
    nb: usize,
    rb: usize,
    d: Vec<f32>,
    s: Vec<f32>,
    sum: Vec<i32>,
}

/// One activation row of [`Acts`]: its bytes and its blocks' `d`, `s` (Q8_1 only) and `Σq`.
#[derive(Clone, Copy)]
pub(super) struct ActRow<'a> {
    pub(super) q: &'a [u8],
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
    /// Read by the x86 kernels (their unsigned decodings' offset correction) only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) sum: &'a [i32],
}

/// The per-block fields of the activation blocks in `bytes` (Q8_1 if `min` else Q8_0), one
/// per block into `d`, `s` (Q8_1 only; left alone for Q8_0) and `sum` ([`Acts`]).
pub(super) fn act_fields(bytes: &[u8], min: bool, d: &mut [f32], s: &mut [f32], sum: &mut [i32]) {
    let (ab_len, qs) = act_geometry(min);
    for (i, b) in bytes.chunks_exact(ab_len).enumerate() {
        d[i] = f16_at(b, 0);
        if min {
            s[i] = f16_at(b, 2);
        }
        // A fixed-length array, so that the compiler vectorizes the sums (per task and call,
        // `m · nb` of them: a prefill's share of time was several percent when scalar).
        let q: &[u8; 32] = b[qs..qs + 32].try_into().expect("32 quants");
        sum[i] = q.iter().map(|&q| i32::from(q as i8)).sum();
    }
}

impl<'a> Acts<'a> {
    /// `bytes` holds whole rows of `nb` blocks, Q8_1 if `min` else Q8_0.
    pub(super) fn new(bytes: &'a [u8], nb: usize, min: bool) -> Acts<'a> {
        let (ab_len, _) = act_geometry(min);
        let blocks = bytes.len() / ab_len;
        let mut d = vec![0f32; blocks];
        let mut s = vec![0f32; if min { blocks } else { 0 }];
        let mut sum = vec![0i32; blocks];
        act_fields(bytes, min, &mut d, &mut s, &mut sum);
        Acts {
            bytes,
            nb,
            rb: nb * ab_len,
            d,
            s,
            sum,
        }
    }

    /// Row `i`.
    pub(super) fn row(&self, i: usize) -> ActRow<'_> {
        let (nb, rb) = (self.nb, self.rb);
        ActRow {
            q: &self.bytes[i * rb..][..rb],
            d: &self.d[i * nb..][..nb],
            s: if self.s.is_empty() {
                &[]
            } else {
                &self.s[i * nb..][..nb]
            },
            sum: &self.sum[i * nb..][..nb],
        }
    }
}

/// A SIMD kernel's dot of one weight row with `N` activation rows.
pub(super) type RowDots<const N: usize> = unsafe fn(&[u8], [ActRow<'_>; N]) -> [f32; N];

/// Every weight row against every activation row, four activation rows at a time (each weight
/// row's blocks are decoded once per four), the rest one at a time.
///
/// # Safety
/// `four` and `one` must be safe to call on this CPU for a weight row of `k / 32` blocks of
/// `F` and activation rows of as many blocks; the lengths are those `Kernel::rows` checks.
pub(super) unsafe fn drive<F: Format>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
    (four, one): (RowDots<4>, RowDots<1>),
) {
    let nb = k / 32;
    let a = Acts::new(acts, nb, F::MIN);
    let wrb = nb * F::BYTES;
    for r in 0..rows {
        let wr = &w[r * wrb..][..wrb];
        let o = &mut out[r * m..][..m];
        let mut i = 0;
        while i + 4 <= m {
            let rows4 = [a.row(i), a.row(i + 1), a.row(i + 2), a.row(i + 3)];
            // SAFETY: the caller's guarantee.
            o[i..i + 4].copy_from_slice(&unsafe { four(wr, rows4) });
            i += 4;
        }
        for (j, o) in o.iter_mut().enumerate().skip(i) {
            // SAFETY: as above.
            *o = unsafe { one(wr, [a.row(j)]) }[0];
        }
    }
}

#[cfg(test)]
mod tests;
