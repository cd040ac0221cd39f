//! The k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS against Q8_K activations.
//!
//! Formats follow ggml (`ggml/src/ggml-common.h`, `block_q2_K` … `block_q6_K`, `block_iq4_xs`,
//! `block_q8_K`; the bit layout as `ggml/src/ggml-quants.c` `dequantize_row_q*_K` /
//! `dequantize_row_iq4_xs` read it, llama.cpp as vendored by llama-cpp-python 0.3.36). Every
//! weight of a 256-value super-block is `d·sc_g·q − dmin·m_g` (Q2_K, Q4_K, Q5_K: unsigned `q`, a
//! scale and a min per group), `d·sc_g·(q − o)` (Q3_K with `o = 4`, Q6_K with `o = 32`: signed
//! scales) or `d·sc_g·v` (IQ4_XS: `v` from ggml's 16-entry table `kvalues_iq4nl`).
//!
//! **One decoded form, one integer dot.** Each kernel first decodes a super-block into a
//! [`Super`]: 256 unsigned quants `u ≤ 63` (IQ4_XS: signed table values) in activation order,
//! and per 16-value group `g` an integer scale `sc_g` and an integer weight `mn_g` of the
//! group's activation sum. Against one Q8_K block (`da`, int8 `a`, `bsum_g = Σ a` over the
//! group) the two integers `sumi = Σ_g sc_g · Σ_l u·a` and `summ = Σ_g mn_g · bsum_g` are exact
//! in i32 in any order (bounds: `|sumi| ≤ 256·63·128·128 < 2³¹`, IQ4_XS `≤ 256·127·32·128`;
//! `|summ| ≤ 16·4096·2032 < 2³¹` for Q8_K blocks the quantizer wrote; blocks with other bytes
//! wrap, identically on every ISA, because every ISA wraps; one exception, NEON's M = 1 Q3_K,
//! computes `sumi − summ` without reading the stored `bsums`, equal wherever they are the
//! group sums the quantizer writes: `neon.rs`). The float step per super-block is
//! then fixed, in this order ([`combine`], [`step`]):
//!
//! * with mins (Q2_K, Q4_K, Q5_K, `mn_g = m_g`):
//!   `acc = (acc + (d·da)·f32(sumi)) − (dmin·da)·f32(summ)`;
//! * with an offset (Q3_K, Q6_K, `mn_g = o·sc_g`; IQ4_XS, `mn_g = 0`):
//!   `acc = acc + (d·da)·f32(sumi − summ)` (the offset cancels exactly in integers before any
//!   rounding),
//!
//! separate multiplies and adds (no fused multiply-add), super-blocks in row order, `acc`
//! starting at +0. The scalar twin and every SIMD kernel (`avx2.rs`, `neon.rs`) share the
//! driver and [`combine`]; they differ only in how they decode and in the integer dot, so they
//! agree bit for bit. (NEON dotprod's M > 1 tile, `neon.rs` `tile_sdot`, runs the float step
//! itself on four activation rows' lanes at once, in this order, so its lanes are the same
//! floats.)
//!
//! NaN: weights are taken as stored (a NaN or infinite `d`/`dmin` yields NaN or ±inf through the
//! float step); a non-finite activation gives NaN outputs (`act_k.rs`).

use super::{Family, Isa, RowsFn, WeightType};

/// `$f::<T>` as a [`RowsFn`] for the [`KType`] value `$t` (kernels are instantiated per type,
/// so each decode is resolved at compile time).
macro_rules! by_type {
    ($t:expr, $f:ident $(, $extra:ty)?) => {
        match $t {
            KType::Q2 => $f::<$($extra,)? { KType::Q2 as u8 }> as RowsFn,
            KType::Q3 => $f::<$($extra,)? { KType::Q3 as u8 }>,
            KType::Q4 => $f::<$($extra,)? { KType::Q4 as u8 }>,
            KType::Q5 => $f::<$($extra,)? { KType::Q5 as u8 }>,
            KType::Q6 => $f::<$($extra,)? { KType::Q6 as u8 }>,
            KType::Iq4Xs => $f::<$($extra,)? { KType::Iq4Xs as u8 }>,
        }
    };
}

/// A SIMD kernel's two functions: `$safe::<T>`, the [`RowsFn`] the dispatcher hands out, which
/// asserts `$check` (the CPU runs `$features`), and `$inner::<T>`, the shared driver on
/// `$engine` compiled with `$features` (so the plain-Rust decode vectorizes for them and the
/// engine's intrinsics inline).
macro_rules! isa_rows {
    ($safe:ident, $inner:ident, $features:literal, $engine:ty, $check:expr) => {
        /// Safe entry: checks that the CPU has the kernel's features.
        fn $safe<const T: u8>(
            k: usize,
            w: &[u8],
            rows: usize,
            acts: &[u8],
            m: usize,
            out: &mut [f32],
        ) {
            assert!($check, concat!("this k-quant kernel needs ", $features));
            // SAFETY: the CPU has the features (asserted just above); `drive` checks the
            // slice lengths.
            unsafe { $inner::<T>(k, w, rows, acts, m, out) }
        }

        /// # Safety
        /// The CPU must have the features named in `target_feature`.
        #[target_feature(enable = $features)]
        unsafe fn $inner<const T: u8>(
            k: usize,
            w: &[u8],
            rows: usize,
            acts: &[u8],
            m: usize,
            out: &mut [f32],
        ) {
            /// The M = 1 (decode) kernel, a symbol of its own so that its assembly can be
            /// found (`scripts/kernel_cycles.py`); one call per `rows` call.
            ///
            /// # Safety
            /// As the enclosing function.
            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn one<const T: u8>(
                k: usize,
                w: &[u8],
                rows: usize,
                acts: &[u8],
                out: &mut [f32],
            ) {
                super::drive_one::<$engine, T>(k, w, rows, acts, out);
            }
            if m == 1 {
                // SAFETY: the enclosing function's contract.
                unsafe { one::<T>(k, w, rows, acts, out) }
            } else {
                super::drive::<$engine, T>(k, w, rows, acts, m, out);
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Values per super-block (ggml's `QK_K`).
pub(super) const QK_K: usize = 256;
/// Bytes of one `block_q8_K`: f32 `d`, 256 int8, 16 i16 group sums.
pub(super) const Q8K_BYTES: usize = 292;
/// Offset of the 16 i16 `bsums` in a `block_q8_K`.
pub(super) const Q8K_BSUMS: usize = 4 + QK_K;

/// The k-quant weight types this module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KType {
    Q2,
    Q3,
    Q4,
    Q5,
    Q6,
    Iq4Xs,
}

impl KType {
    fn of(ty: WeightType) -> Option<KType> {
        Some(match ty {
            WeightType::Q2_K => KType::Q2,
            WeightType::Q3_K => KType::Q3,
            WeightType::Q4_K => KType::Q4,
            WeightType::Q5_K => KType::Q5,
            WeightType::Q6_K => KType::Q6,
            WeightType::IQ4_XS => KType::Iq4Xs,
            _ => return None,
        })
    }

    /// Bytes of one super-block (ggml's `type_size`).
    const fn bytes(self) -> usize {
        match self {
            KType::Q2 => 84,
            KType::Q3 => 110,
            KType::Q4 => 144,
            KType::Q5 => 176,
            KType::Q6 => 210,
            KType::Iq4Xs => 136,
        }
    }

    /// Whether the type has a per-group min (`dmin·m_g`) rather than an offset.
    const fn has_mins(self) -> bool {
        matches!(self, KType::Q2 | KType::Q4 | KType::Q5)
    }
}

/// One decoded weight super-block (see the module docs).
#[derive(Clone, Debug)]
pub(super) struct Super {
    /// The 256 quants in activation order: unsigned `0 ..= 63`, or, when `signed`, int8 values
    /// of ggml's non-linear table (IQ4_XS, `−127 ..= 113`) stored as their bytes.
    pub(super) u: [u8; QK_K],
    /// Whether `u` holds signed values.
    pub(super) signed: bool,
    /// Integer scale of each 16-value group.
    pub(super) sc: [i16; 16],
    /// Integer weight of each group's activation sum: the min `m_g` (times `dmin`) or `o·sc_g`
    /// (subtracted, times `d`).
    pub(super) mn: [i16; 16],
    /// The super-block scale.
    pub(super) d: f32,
    /// The super-block min scale (types with mins; 0 otherwise).
    pub(super) dmin: f32,
}

impl Super {
    pub(super) const fn zero() -> Super {
        Super {
            u: [0; QK_K],
            signed: false,
            sc: [0; 16],
            mn: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// How an ISA decodes a super-block and computes `(sumi, summ)` against a Q8_K block. Both are
/// exact integer computations, so every implementation returns the same values.
pub(super) trait Engine {
    /// Decode one stored super-block of `ty` (`ty.bytes()` bytes).
    fn decode(ty: KType, blk: &[u8], s: &mut Super);
    /// `(Σ_g sc_g·Σ u·a, Σ_g mn_g·bsum_g)` with wrapping i32 arithmetic; `a` is one Q8_K block.
    fn dot(s: &Super, a: &[u8]) -> (i32, i32);
    /// [`Engine::dot`] of one super-block against four Q8_K blocks (M > 1 reuses the loaded
    /// quants and scales across them).
    #[inline(always)]
    fn dot4(s: &Super, a: [&[u8]; 4]) -> [(i32, i32); 4] {
        a.map(|a| Self::dot(s, a))
    }
    /// Whether [`Engine::tile`] has its own form that reads the interleaved activations
    /// ([`interleave`]); the driver prepares them only then.
    const TILE: bool = false;
    /// One super-block of four decoded weight rows (`s`) against four Q8_K blocks (`a`, one
    /// per activation row): `acc[row][activation row]` stepped as [`step`] does, with
    /// [`Engine::dot`] of each pair. `ai` holds the four blocks interleaved ([`interleave`])
    /// where [`Engine::TILE`], else nothing; `a` is then four empty slices.
    #[inline(always)]
    fn tile(t: KType, s: [&Super; 4], a: [&[u8]; 4], ai: &[u8], acc: &mut [[f32; 4]; 4]) {
        let _ = ai;
        tile_by_rows::<Self>(t, s, a, acc);
    }
    /// Decode `blk` and dot it with `a` (M = 1). An engine may fuse the two; it must leave
    /// `s.d`, `s.dmin` set and return what [`Engine::dot`] would (for a type without mins, a
    /// pair with the same `sumi − summ`, which is all the float step reads: NEON's Q3_K).
    #[inline(always)]
    fn decode_dot(ty: KType, blk: &[u8], a: &[u8], s: &mut Super) -> (i32, i32) {
        Self::decode(ty, blk, s);
        Self::dot(s, a)
    }
    /// Ask for the cache lines of `bytes` bytes at `p` (a super-block further on in the weight
    /// stream, possibly past its end: a hint, never a read). The default does nothing.
    #[inline(always)]
    fn prefetch(_p: *const u8, _bytes: usize) {}
}

/// The k-quant kernels (dispatched by `super::Kernel::with_isa`): on x86-64 AVX2, AVX-VNNI and
/// AVX-512 VNNI (one AVX2 decode and M = 1 dot; the M > 1 panel kernel on each ISA's int8
/// dot), NEON and NEON dotprod on aarch64.
pub(super) const FAMILY: Family = Family {
    scalar: |ty| Some(by_type!(KType::of(ty)?, drive, Scalar)),
    simd: |ty, isa| {
        let t = KType::of(ty)?;
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => avx2::rows(t, isa),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon | Isa::NeonDot => Some(neon::rows(t, isa == Isa::NeonDot)),
            _ => None,
        }
    },
};

/// The type a const parameter names.
const fn ktype(t: u8) -> KType {
    match t {
        0 => KType::Q2,
        1 => KType::Q3,
        2 => KType::Q4,
        3 => KType::Q5,
        4 => KType::Q6,
        _ => KType::Iq4Xs,
    }
}

/// Activation bytes one pass over the weight rows keeps hot (a chunk of activation rows): the
/// M > 1 driver decodes each weight row once per chunk.
const ACT_CHUNK_BYTES: usize = 192 * 1024;

/// Activation rows of `k` columns (Q8_K rows) in one chunk of 192 KiB, the bytes one pass over
/// the weight rows keeps hot (at least one): how many rows each decode of a k-quant weight row
/// serves at most.
pub const fn chunk_rows(k: usize) -> usize {
    let arb = k / QK_K * Q8K_BYTES;
    if arb == 0 || ACT_CHUNK_BYTES / arb == 0 {
        1
    } else {
        ACT_CHUNK_BYTES / arb
    }
}

/// The driver every ISA shares: `out[r·m + i]` accumulates super-block by super-block with
/// [`combine`]. M = 1 decodes each super-block into one stack [`Super`] right before its dot;
/// M > 1 decodes weight rows once per chunk of activation rows and reuses them across the
/// chunk: four weight rows against four activation rows at a time ([`Engine::tile`], on the
/// activations [`interleave`]d once per chunk where the engine reads them so), the rows left
/// over one weight row against four activation rows ([`Engine::dot4`]), then one by one. All
/// give the same order of float operations per output.
/// `T` is a `KType as u8`; the signature is [`RowsFn`]'s.
#[inline(always)]
pub(super) fn drive<E: Engine, const T: u8>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) {
    if m == 1 {
        return drive_one::<E, T>(k, w, rows, acts, out);
    }
    let t = ktype(T);
    let nb = k / QK_K;
    let (wrb, arb) = (nb * t.bytes(), nb * Q8K_BYTES);
    assert!(w.len() >= rows * wrb && acts.len() >= m * arb && out.len() >= rows * m);
    let mut tiles: [Vec<Super>; 4] = std::array::from_fn(|_| vec![Super::zero(); nb]);
    let mut inter = Vec::new();
    let chunk = chunk_rows(k).min(m);
    for i0 in (0..m).step_by(chunk) {
        let i1 = (i0 + chunk).min(m);
        let mut r0 = 0;
        if E::TILE && i1 - i0 >= 4 {
            interleave(&acts[i0 * arb..i1 * arb], nb, &mut inter);
            while r0 + 4 <= rows {
                for (j, row) in tiles.iter_mut().enumerate() {
                    decode_row::<E, T>(&w[(r0 + j) * wrb..(r0 + j + 1) * wrb], row);
                }
                tile_rows::<E>(t, &tiles, acts, &inter, (i0, i1, m), &mut out[r0 * m..]);
                r0 += 4;
            }
        }
        for (r, wrow) in w.chunks_exact(wrb).take(rows).enumerate().skip(r0) {
            decode_row::<E, T>(wrow, &mut tiles[0]);
            row_rows::<E>(t, &tiles[0], acts, (i0, i1), &mut out[r * m..]);
        }
    }
}

/// Decode one weight row's super-blocks into `row` ([`Engine::decode`]), for [`drive`]'s M > 1
/// path. Out of line on aarch64: once per weight row and chunk of activation rows, a call costs
/// nothing next to the row's decode, and `scripts/kernel_cycles.py` finds the decode's cycles
/// by this symbol (the board clock charges them per weight decoded, docs/kernels.md). Inlined
/// elsewhere, where the x86 engines' decodes compile under their caller's AVX2.
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
fn decode_row<E: Engine, const T: u8>(wrow: &[u8], row: &mut [Super]) {
    let t = ktype(T);
    for (blk, s) in wrow.chunks_exact(t.bytes()).zip(row.iter_mut()) {
        E::decode(t, blk, s);
    }
}

/// [`Engine::tile`] row by row: [`Engine::dot4`] of each weight row, then [`step`].
#[inline(always)]
pub(super) fn tile_by_rows<E: Engine + ?Sized>(
    t: KType,
    s: [&Super; 4],
    a: [&[u8]; 4],
    acc: &mut [[f32; 4]; 4],
) {
    for (s, acc) in s.iter().zip(acc.iter_mut()) {
        let d = E::dot4(s, a);
        for j in 0..4 {
            acc[j] = step(t, acc[j], s, a[j], d[j]);
        }
    }
}

/// Bytes of one interleaved tile block ([`interleave`]): four rows' 256 quants, 16 group sums
/// and scale `d`.
pub(super) const TILE_BLOCK: usize = 4 * QK_K + 4 * 16 * 2 + 4 * 4;
/// Offset of the four rows' scales `d` (f32) in a tile block.
pub(super) const TILE_D: usize = 4 * QK_K + 4 * 16 * 2;

/// The activation rows of `acts` (whole rows of `nb` Q8_K blocks), four at a time, interleaved
/// for [`Engine::tile`] into `out`: per group of four rows and super-block, [`TILE_BLOCK`]
/// bytes, first the quants by 4-byte chunks, chunk `c` holding rows 0..4's quants `4c..4c + 4`
/// (byte `16c + 4i + t` is row `i`'s quant `4c + t`), then the group sums, sum `g` of rows
/// 0..4 side by side (i16 `4g + i` is row `i`'s `bsum_g`), then the four rows' `d` (f32, at
/// [`TILE_D`]). Rows past the last group of four are left out.
pub(super) fn interleave(acts: &[u8], nb: usize, out: &mut Vec<u8>) {
    let arb = nb * Q8K_BYTES;
    let quads = acts.len() / arb / 4;
    out.clear();
    out.resize(quads * nb * TILE_BLOCK, 0);
    for (q, dst) in out.chunks_exact_mut(nb * TILE_BLOCK).enumerate() {
        for (b, dst) in dst.chunks_exact_mut(TILE_BLOCK).enumerate() {
            for i in 0..4 {
                let a = &acts[(4 * q + i) * arb + b * Q8K_BYTES..][..Q8K_BYTES];
                for (c, v) in a[4..4 + QK_K].chunks_exact(4).enumerate() {
                    dst[16 * c + 4 * i..16 * c + 4 * i + 4].copy_from_slice(v);
                }
                for (g, v) in a[Q8K_BSUMS..].chunks_exact(2).enumerate() {
                    let o = 4 * QK_K + 2 * (4 * g + i);
                    dst[o..o + 2].copy_from_slice(v);
                }
                dst[TILE_D + 4 * i..TILE_D + 4 * i + 4].copy_from_slice(&a[..4]);
            }
        }
    }
}

/// Four decoded weight rows (`rows[j]`, super-blocks in order) against activation rows
/// `i0..i1` of `m` into `out[j·m + i]`: [`Engine::tile`] on each group of four activation
/// rows (`inter`: the chunk's rows [`interleave`]d, when [`Engine::TILE`]), then the rows
/// left over one by one.
#[inline(always)]
fn tile_rows<E: Engine>(
    t: KType,
    rows: &[Vec<Super>; 4],
    acts: &[u8],
    inter: &[u8],
    (i0, i1, m): (usize, usize, usize),
    out: &mut [f32],
) {
    let nb = rows[0].len();
    let arb = nb * Q8K_BYTES;
    let mut i = i0;
    while i + 4 <= i1 {
        let mut acc = [[0.0f32; 4]; 4];
        let quad = &inter[(i - i0) / 4 * nb * TILE_BLOCK..];
        for b in 0..nb {
            // An engine with its own tile reads the interleaved block only.
            let a = if E::TILE {
                [&[][..]; 4]
            } else {
                blocks4(acts, arb, i, b)
            };
            let s = [&rows[0][b], &rows[1][b], &rows[2][b], &rows[3][b]];
            E::tile(
                t,
                s,
                a,
                &quad[b * TILE_BLOCK..(b + 1) * TILE_BLOCK],
                &mut acc,
            );
        }
        for (r, acc) in acc.iter().enumerate() {
            out[r * m + i..r * m + i + 4].copy_from_slice(acc);
        }
        i += 4;
    }
    for (r, row) in rows.iter().enumerate() {
        // Fewer than four rows left: `row_rows` takes them one by one.
        row_rows::<E>(t, row, acts, (i, i1), &mut out[r * m..]);
    }
}

/// One decoded weight row against activation rows `i0..i1` of `m` into `out[i]`: four at a
/// time ([`Engine::dot4`]), then one by one.
#[inline(always)]
fn row_rows<E: Engine>(
    t: KType,
    row: &[Super],
    acts: &[u8],
    (i0, i1): (usize, usize),
    out: &mut [f32],
) {
    let arb = row.len() * Q8K_BYTES;
    let mut i = i0;
    while i + 4 <= i1 {
        let mut acc = [0.0f32; 4];
        for (b, s) in row.iter().enumerate() {
            let a = blocks4(acts, arb, i, b);
            let d = E::dot4(s, a);
            for j in 0..4 {
                acc[j] = step(t, acc[j], s, a[j], d[j]);
            }
        }
        out[i..i + 4].copy_from_slice(&acc);
        i += 4;
    }
    for i in i..i1 {
        let arow = &acts[i * arb..(i + 1) * arb];
        let mut acc = 0.0f32;
        for (s, a) in row.iter().zip(arow.chunks_exact(Q8K_BYTES)) {
            acc = combine::<E>(t, acc, s, a);
        }
        out[i] = acc;
    }
}

/// Super-block `b` of activation rows `i..i + 4` (rows of `arb` bytes).
#[inline(always)]
fn blocks4(acts: &[u8], arb: usize, i: usize, b: usize) -> [&[u8]; 4] {
    std::array::from_fn(|j| {
        let o = (i + j) * arb + b * Q8K_BYTES;
        &acts[o..o + Q8K_BYTES]
    })
}

/// How far ahead in the weight stream [`drive_one`] asks for super-blocks (the legacy x86
/// kernels' distance and reason: weights stream from file-backed 4 KiB pages, where hardware
/// prefetchers stop).
const PREFETCH_AHEAD: usize = 4096;

/// [`drive`] at M = 1: each super-block decoded right before its dot ([`Engine::decode_dot`]).
#[inline(always)]
pub(super) fn drive_one<E: Engine, const T: u8>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    out: &mut [f32],
) {
    let t = ktype(T);
    let nb = k / QK_K;
    let (wrb, arb) = (nb * t.bytes(), nb * Q8K_BYTES);
    assert!(w.len() >= rows * wrb && acts.len() >= arb && out.len() >= rows);
    let mut s = Super::zero();
    for (wrow, o) in w.chunks_exact(wrb).take(rows).zip(out.iter_mut()) {
        let mut acc = 0.0f32;
        for (blk, a) in wrow
            .chunks_exact(t.bytes())
            .zip(acts.chunks_exact(Q8K_BYTES))
        {
            E::prefetch(blk.as_ptr().wrapping_add(PREFETCH_AHEAD), t.bytes());
            let d = E::decode_dot(t, blk, a, &mut s);
            acc = step(t, acc, &s, a, d);
        }
        *o = acc;
    }
}

/// One super-block: the integer dot, then [`step`].
#[inline(always)]
fn combine<E: Engine>(t: KType, acc: f32, s: &Super, a: &[u8]) -> f32 {
    step(t, acc, s, a, E::dot(s, a))
}

/// One super-block's float step (the order every ISA follows; see the module docs); `a` is the
/// Q8_K block (for its `d`), `(sumi, summ)` the integer dot.
#[inline(always)]
fn step(t: KType, acc: f32, s: &Super, a: &[u8], (sumi, summ): (i32, i32)) -> f32 {
    let da = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
    if t.has_mins() {
        let hi = acc + (s.d * da) * sumi as f32;
        hi - (s.dmin * da) * summ as f32
    } else {
        acc + (s.d * da) * sumi.wrapping_sub(summ) as f32
    }
}

/// The portable twin: plain Rust decode and dot.
pub(super) struct Scalar;

impl Engine for Scalar {
    fn decode(ty: KType, blk: &[u8], s: &mut Super) {
        decode(ty, blk, s);
    }
    fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
        dot(s, a)
    }
}

/// f16 at `b[0..2]` (little-endian) as f32.
#[inline(always)]
pub(super) fn f16_at(b: &[u8]) -> f32 {
    let h = u16::from_le_bytes([b[0], b[1]]);
    #[cfg(target_arch = "aarch64")]
    return super::neon::f16_to_f32(h);
    #[cfg(not(target_arch = "aarch64"))]
    half::f16::from_bits(h).to_f32()
}

/// The scalar integer dot (see [`Engine::dot`]).
#[inline(always)]
pub(super) fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
    let q = &a[4..4 + QK_K];
    let mut sumi = 0i32;
    for ((u, q), &sc) in s.u.chunks_exact(16).zip(q.chunks_exact(16)).zip(&s.sc) {
        let t: i32 = u
            .iter()
            .zip(q)
            .map(|(&u, &q)| {
                let u = if s.signed {
                    i32::from(u as i8)
                } else {
                    i32::from(u)
                };
                u * i32::from(q as i8)
            })
            .sum();
        sumi = sumi.wrapping_add(t.wrapping_mul(i32::from(sc)));
    }
    let mut summ = 0i32;
    for g in 0..16 {
        let o = Q8K_BSUMS + 2 * g;
        let bsum = i16::from_le_bytes([a[o], a[o + 1]]);
        summ = summ.wrapping_add(i32::from(s.mn[g]) * i32::from(bsum));
    }
    (sumi, summ)
}

/// Decode one super-block into `s` (plain Rust, written so compilers vectorize it; the SIMD
/// engines compile this same code under their target features where they have no own decode).
#[inline(always)]
pub(super) fn decode(ty: KType, blk: &[u8], s: &mut Super) {
    match ty {
        KType::Q2 => decode_q2(blk, s),
        KType::Q3 => decode_q3(blk, s),
        KType::Q4 => decode_k4::<false>(blk, s),
        KType::Q5 => decode_k4::<true>(blk, s),
        KType::Q6 => decode_q6(blk, s),
        KType::Iq4Xs => decode_iq4xs(blk, s),
    }
}

/// `block_q2_K`: `scales[16]` (low nibble scale, high nibble min), `qs[64]`, d, dmin. Value
/// `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
#[inline(always)]
fn decode_q2(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (scales, qs) = (&b[0..16], &b[16..80]);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                s.u[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
    }
    for (g, &b) in scales.iter().enumerate() {
        s.sc[g] = i16::from(b & 0xF);
        s.mn[g] = i16::from(b >> 4);
    }
    s.d = f16_at(&b[80..]);
    s.dmin = f16_at(&b[82..]);
}

/// The 16 scales of `block_q3_K` plus 32, as 16 bytes from its 12 packed bytes: scale `g` has
/// its low nibble in byte `g mod 8` (the high nibble for `g ≥ 8`) and two high bits in byte
/// `8 + g mod 4` at bit `2·(g div 4)`. Unpacked four at a time in u32 words, as ggml does.
#[inline(always)]
pub(super) fn q3_words(sb: &[u8]) -> [u32; 4] {
    let word = |i: usize| u32::from_le_bytes([sb[i], sb[i + 1], sb[i + 2], sb[i + 3]]);
    let (a0, a1, hi) = (word(0), word(4), word(8));
    let (m4, m2) = (0x0f0f_0f0fu32, 0x0303_0303u32);
    [
        (a0 & m4) | ((hi & m2) << 4),
        (a1 & m4) | (((hi >> 2) & m2) << 4),
        ((a0 >> 4) & m4) | (((hi >> 4) & m2) << 4),
        ((a1 >> 4) & m4) | (((hi >> 6) & m2) << 4),
    ]
}

/// The 16 signed scales of `block_q3_K` (see [`q3_words`]) and their offset weights `4·sc`.
#[inline(always)]
pub(super) fn q3_scales(sb: &[u8], s: &mut Super) {
    for (g, w) in q3_words(sb)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .enumerate()
    {
        let sc = i16::from(w) - 32;
        s.sc[g] = sc;
        s.mn[g] = 4 * sc;
    }
}

/// `block_q3_K`: `hmask[32]`, `qs[64]`, `scales[12]`, d. Value `128n + 32j + l` is bits
/// `2j..2j+2` of `qs[32n + l]` minus 4 unless bit `4n + j` of `hmask[l]` is set; stored here as
/// `u = low | high·4`, offset 4.
#[inline(always)]
fn decode_q3(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (hm, qs, sb) = (&b[0..32], &b[32..96], &b[96..108]);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let lo = (qs[32 * n + l] >> (2 * j)) & 3;
                let hi = (hm[l] >> (4 * n + j)) & 1;
                s.u[128 * n + 32 * j + l] = lo | (hi << 2);
            }
        }
    }
    q3_scales(sb, s);
    s.d = f16_at(&b[108..]);
    s.dmin = 0.0;
}

/// The 8 six-bit scales and 8 mins of `block_q4_K` / `block_q5_K` from their 12 packed bytes,
/// as two words of 8 bytes (byte `j` of each belongs to sub-block `j`). ggml's
/// `get_scale_min_k4` defines them: for `j < 4` scale `q[j] & 63`, min `q[j+4] & 63`; for
/// `j ≥ 4` scale `(q[j+4] & 15) | (q[j-4] >> 6) << 4`, min `(q[j+4] >> 4) | (q[j] >> 6) << 4`.
/// Computed four at a time in u32 words.
#[inline(always)]
pub(super) fn k4_words(sb: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([sb[i], sb[i + 1], sb[i + 2], sb[i + 3]]);
    let (q0, q1, q2) = (word(0), word(4), word(8));
    let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc_lo = q0 & m6;
    let sc_hi = (q2 & m4) | (((q0 >> 6) & m2) << 4);
    let mn_lo = q1 & m6;
    let mn_hi = ((q2 >> 4) & m4) | (((q1 >> 6) & m2) << 4);
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// The 8 sub-block scales and mins of Q4_K/Q5_K, each spread over its two 16-value groups.
#[inline(always)]
pub(super) fn scales_k4(sb: &[u8], s: &mut Super) {
    let (sc, mn) = k4_words(sb);
    for (j, (sc, mn)) in sc
        .to_le_bytes()
        .into_iter()
        .zip(mn.to_le_bytes())
        .enumerate()
    {
        s.sc[2 * j..2 * j + 2].fill(i16::from(sc));
        s.mn[2 * j..2 * j + 2].fill(i16::from(mn));
    }
}

/// `block_q4_K` (`FIVE = false`): d, dmin, `scales[12]`, `qs[128]`. Values `64c + l` and
/// `64c + 32 + l` are the low and high nibble of `qs[32c + l]`. `block_q5_K` (`FIVE`): d, dmin,
/// `scales[12]`, `qh[32]`, `qs[128]`: the same plus a fifth bit, bit `2c` (low nibbles) or
/// `2c + 1` (high nibbles) of `qh[l]`.
#[inline(always)]
fn decode_k4<const FIVE: bool>(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (qh, qs) = if FIVE {
        (&b[16..48], &b[48..176])
    } else {
        (&b[16..48], &b[16..144])
    };
    for c in 0..4 {
        for l in 0..32 {
            let q = qs[32 * c + l];
            let h = if FIVE { qh[l] >> (2 * c) } else { 0 };
            s.u[64 * c + l] = (q & 0xF) | ((h & 1) << 4);
            s.u[64 * c + 32 + l] = (q >> 4) | ((h & 2) << 3);
        }
    }
    scales_k4(&b[4..16], s);
    s.d = f16_at(&b[0..]);
    s.dmin = f16_at(&b[2..]);
}

/// `block_q6_K`: `ql[128]`, `qh[64]`, `scales[16]` (int8), d. In half `n`, for `l < 32`: values
/// `+l`, `+32+l`, `+64+l`, `+96+l` are the low nibble of `ql[64n+l]`, of `ql[64n+32+l]`, the
/// high nibble of each, with bits 0‥1, 2‥3, 4‥5, 6‥7 of `qh[32n+l]` on top; offset 32.
#[inline(always)]
fn decode_q6(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (ql, qh, sb) = (&b[0..128], &b[128..192], &b[192..208]);
    for n in 0..2 {
        for l in 0..32 {
            let (a, c, h) = (ql[64 * n + l], ql[64 * n + 32 + l], qh[32 * n + l]);
            let u = &mut s.u[128 * n..128 * n + 128];
            u[l] = (a & 0xF) | ((h & 3) << 4);
            u[32 + l] = (c & 0xF) | (((h >> 2) & 3) << 4);
            u[64 + l] = (a >> 4) | (((h >> 4) & 3) << 4);
            u[96 + l] = (c >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    for (g, &b) in sb.iter().enumerate() {
        let sc = i16::from(b as i8);
        s.sc[g] = sc;
        s.mn[g] = 32 * sc;
    }
    s.d = f16_at(&b[208..]);
    s.dmin = 0.0;
}

/// ggml's `kvalues_iq4nl` (`ggml/src/ggml-common.h`): the 16 values a 4-bit IQ4 index names.
pub(super) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 8 sub-block scales of `block_iq4_xs` (32 values each), spread over their two groups:
/// `ls = (scales_l[j/2] >> 4·(j mod 2)) & 15 | ((scales_h >> 2j) & 3) << 4`, minus 32; no
/// offset term (`mn = 0`).
#[inline(always)]
pub(super) fn iq4xs_scales(b: &[u8], s: &mut Super) {
    for (j, sc) in iq4xs_sc(b).into_iter().enumerate() {
        s.sc[2 * j..2 * j + 2].fill(i16::from(sc));
    }
    s.mn = [0; 16];
    s.signed = true;
    s.d = f16_at(b);
    s.dmin = 0.0;
}

/// The 8 sub-block scales of `block_iq4_xs` (see [`iq4xs_scales`]), `−32 ..= 31`.
#[inline(always)]
pub(super) fn iq4xs_sc(b: &[u8]) -> [i8; 8] {
    let h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|j| {
        let lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF;
        let hi = ((h >> (2 * j)) & 3) as u8;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// `block_iq4_xs`: d, scales_h (u16), `scales_l[4]`, `qs[128]`. Sub-block `j` (32 values): the low
/// nibbles of `qs[16j .. 16j+16]`, then their high nibbles, each an index into
/// [`IQ4_VALUES`]; the quants are stored signed.
#[inline(always)]
fn decode_iq4xs(b: &[u8], s: &mut Super) {
    let qs = &b[8..136];
    for j in 0..8 {
        for l in 0..16 {
            let q = qs[16 * j + l];
            s.u[32 * j + l] = IQ4_VALUES[usize::from(q & 0xF)] as u8;
            s.u[32 * j + 16 + l] = IQ4_VALUES[usize::from(q >> 4)] as u8;
        }
    }
    iq4xs_scales(b, s);
}

#[cfg(test)]
mod tests;
