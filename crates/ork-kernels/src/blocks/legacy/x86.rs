//! x86-64 kernels for the 32-weight block types: one body ([`body`]) compiled for AVX2
//! (`vpmaddubsw` + `vpmaddwd`), AVX-VNNI and AVX-512 VNNI (`vpdpbusd`, ymm form).
//!
//! A block's 32 weights decode into one ymm of bytes ([`Decode`]). Its dot with the
//! activation's 32 int8 is exact in i32 lanes: Q4_0/Q5_0/Q4_1/Q5_1 decode to unsigned `u` with
//! `w = u − OFFSET` (8, 16, 0, 0), multiplied as u8 × i8 and corrected by `OFFSET · Σa` (the
//! activation block's sum, computed once per call); Q8_0 and IQ4_NL use the sign trick (`|w|`
//! as u8 times `a · sign(w)`). `vpmaddubsw` pairs stay within i16 (at most 2·128·127). Eight
//! blocks' lane vectors are folded by unpacks and adds into one vector of eight block sums
//! (on AVX2 in i16 as far as the products allow: Q4_0 and Q4_1 up to a half block's sixteen,
//! Q5_0 up to eight), and the float step
//! (`(d_w · d_a) · isum [+ m_w · s_a]`, lane `b % 8`) runs on eight blocks at once: the scalar
//! twin's order ([`super::rows_scalar`]).
//!
//! At M ≥ 2, whole groups of eight weight rows run the panel kernel ([`panel`]: eight weight
//! rows in lanes × four activation rows; on AVX-512 VNNI [`panel16`], sixteen rows in the lanes
//! of a zmm, about twice the 8-row panel's speed there); the rows beyond them decode each row's
//! groups of eight blocks once for up to four activation rows, and decode (M = 1) decodes
//! straight into registers. A row's last `nb % 8` blocks (K = 576 leaves 2 of 18) run as one
//! more group with zero lanes for the missing blocks, blended into their lanes only, rather
//! than block by block with scalar f16 conversions.

use super::{act_fields, act_geometry, drive, finish, ActRow, Acts, Format, Iq4Nl, RowDots};
use super::{Isa, RowsFn, WeightType, KVALUES_IQ4NL};
use super::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::blocks::x86::{Avx2, Avx512Vnni, AvxVnni, Dot};
use std::arch::x86_64::*;

mod panel;
mod panel16;

/// A block format's AVX2 decoder.
trait Decode: Format {
    /// Whether [`Decode::decode`] gives signed weights (else unsigned, `w = u − OFFSET`).
    const SIGNED: bool;
    /// See [`Decode::SIGNED`].
    const OFFSET: i32;
    /// The largest byte an unsigned decoding gives (`u ≤ UMAX`), which sizes the lane sums'
    /// 16-bit levels ([`i16_levels`]); 0 for signed decodings (the sign trick), which widen
    /// at once.
    const UMAX: i32 = 0;
    /// The 32 weights of the block at `p`, in `Format::weights` order (signed, or unsigned
    /// `u = w + OFFSET`).
    ///
    /// # Safety
    /// `p .. p + BYTES` must be readable; the CPU must have AVX2.
    unsafe fn decode(p: *const u8) -> __m256i;

    /// [`Decode::decode`] with AVX-512 BW's byte masks where they save instructions (Q5's
    /// fifth bits: one masked byte add from the 32-bit `qh` instead of a broadcast, a shuffle,
    /// a compare and two logic operations); the same bytes.
    ///
    /// # Safety
    /// As [`Decode::decode`]; the CPU must also have AVX-512 BW and VL.
    #[inline(always)]
    unsafe fn decode_bw(p: *const u8) -> __m256i {
        // SAFETY: forwarded.
        unsafe { Self::decode(p) }
    }
}

/// The block at `p` decoded by the ISA `D`'s kernels: [`Decode::decode_bw`] where `D` is
/// compiled with AVX-512 BW, else [`Decode::decode`].
///
/// # Safety
/// As [`Decode::decode`] (and [`Decode::decode_bw`] when `D::BW`).
#[inline(always)]
unsafe fn decode_for<F: Decode, D: Dot>(p: *const u8) -> __m256i {
    // SAFETY: forwarded; `D::BW` only for kernels compiled with AVX-512 BW.
    unsafe {
        if D::BW {
            F::decode_bw(p)
        } else {
            F::decode(p)
        }
    }
}

/// Q5's decode with its fifth bits (the u32 `qh` at `qh`, bit `j` for weight `j`) added to the
/// nibbles at `qs` as 16 under the bits' mask: the bytes of `nibbles | fifth_bits`.
///
/// # Safety
/// 4 readable bytes at `qh`, 16 at `qs`; AVX2, AVX-512 BW and VL.
#[inline(always)]
unsafe fn five_bits_bw(qh: *const u8, qs: *const u8) -> __m256i {
    // SAFETY: the caller guarantees the reads and the ISA.
    unsafe {
        let h = qh.cast::<u32>().read_unaligned();
        let n = nibbles(qs);
        _mm256_mask_add_epi8(n, h, n, _mm256_set1_epi8(0x10))
    }
}

/// The 32 nibbles of the 16 bytes at `p` (weight `j` low nibble of byte `j`, `j + 16` high).
///
/// # Safety
/// 16 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes (unaligned load) and AVX2.
    unsafe {
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        let shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
        _mm256_and_si256(shifted, _mm256_set1_epi8(15))
    }
}

/// Bit `j` of the u32 at `p`, as 0x10 in byte `j` (Q5's fifth bit).
///
/// # Safety
/// 4 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes and AVX2.
    unsafe {
        let h = p.cast::<i32>().read_unaligned();
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(h),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

impl Decode for Q4_0 {
    const SIGNED: bool = false;
    const OFFSET: i32 = 8;
    // Nibbles.
    const UMAX: i32 = 15;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 2..18 of the block the caller vouches for; AVX2.
        unsafe { nibbles(p.add(2)) }
    }
}

impl Decode for Q4_1 {
    const SIGNED: bool = false;
    const OFFSET: i32 = 0;
    // Nibbles.
    const UMAX: i32 = 15;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 4..20 of the block.
        unsafe { nibbles(p.add(4)) }
    }
}

impl Decode for Q5_0 {
    const SIGNED: bool = false;
    const OFFSET: i32 = 16;
    // Nibbles and a fifth bit.
    const UMAX: i32 = 31;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qh is bytes 2..6, qs 6..22 of the block; AVX2.
        unsafe { _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))) }
    }
    #[inline(always)]
    unsafe fn decode_bw(p: *const u8) -> __m256i {
        // SAFETY: as above; AVX-512 BW and VL as the caller guarantees.
        unsafe { five_bits_bw(p.add(2), p.add(6)) }
    }
}

impl Decode for Q5_1 {
    const SIGNED: bool = false;
    const OFFSET: i32 = 0;
    // Nibbles and a fifth bit.
    const UMAX: i32 = 31;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qh is bytes 4..8, qs 8..24 of the block.
        unsafe { _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))) }
    }
    #[inline(always)]
    unsafe fn decode_bw(p: *const u8) -> __m256i {
        // SAFETY: as above; AVX-512 BW and VL as the caller guarantees.
        unsafe { five_bits_bw(p.add(4), p.add(8)) }
    }
}

impl Decode for Q8_0 {
    const SIGNED: bool = true;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 2..34 of the block.
        unsafe { _mm256_loadu_si256(p.add(2).cast()) }
    }
}

impl Decode for Iq4Nl {
    const SIGNED: bool = true;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: the table is 16 bytes; qs are bytes 2..18 of the block; AVX2.
        unsafe {
            let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
            _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles(p.add(2)))
        }
    }
}

/// Lanes of one block's dot (`Σ u·a` for unsigned decodings, `Σ w·a` for signed ones, by the
/// sign trick).
///
/// # Safety
/// As [`Dot::dot_us`].
#[inline(always)]
unsafe fn block_dot<F: Decode, D: Dot>(w: __m256i, a: __m256i) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        if F::SIGNED {
            D::dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
        } else {
            D::dot_us(w, a)
        }
    }
}

/// `[Σ p0, Σ p1, …, Σ p7]`: the lane sums of eight vectors (exact i32), by unpacks and adds
/// (two blocks' lanes interleaved and added, then four blocks', then the two 128-bit halves):
/// 12 `vpunpck` and 7 `vpaddd` instead of 6 `vphaddd` (several uops each).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn sums8(p: &[__m256i; 8]) -> __m256i {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        let a = fold::<64, false>(fold::<32, false>(p[0], p[1]), fold::<32, false>(p[2], p[3]));
        let b = fold::<64, false>(fold::<32, false>(p[4], p[5]), fold::<32, false>(p[6], p[7]));
        halves(a, b)
    }
}

/// `unpacklo + unpackhi` of `x`, `y` by elements of `BITS` bits, added in i16 lanes if `I16`
/// else i32: within each 128-bit half of `n` elements, `x_e + x_(e + n/2)` and
/// `y_e + y_(e + n/2)` side by side, for `e < n/2`.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn fold<const BITS: u32, const I16: bool>(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        let (lo, hi) = match BITS {
            16 => (_mm256_unpacklo_epi16(x, y), _mm256_unpackhi_epi16(x, y)),
            32 => (_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y)),
            _ => (_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y)),
        };
        if I16 {
            _mm256_add_epi16(lo, hi)
        } else {
            _mm256_add_epi32(lo, hi)
        }
    }
}

/// `[a.lo + a.hi, b.lo + b.hi]` (i32 lanes of the 128-bit halves).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn halves(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }
}

/// How many levels of [`isums8`]'s tree add in i16 before widening: none where `D` multiplies
/// by `vpdpbusd` or the decoding is signed, else as many as keep every i16 within range. A
/// level doubles the products an i16 holds, from `vpmaddubsw`'s pairs: after `l` levels
/// `2^(l+1)` products of at most `UMAX · 128` each. Q4_0/Q4_1 (`u ≤ 15`): three levels, sixteen
/// products, `30 720`; Q5_0/Q5_1 (`u ≤ 31`): two, eight products, `31 744` (a third would reach
/// `63 488`). Three is the tree's depth within a 128-bit half.
const fn i16_levels<F: Decode, D: Dot>() -> u32 {
    if D::WIDE || F::SIGNED || F::UMAX <= 0 {
        return 0;
    }
    let (mut levels, mut products) = (0, 4);
    while levels < 3 && products * F::UMAX * 128 <= i16::MAX as i32 {
        levels += 1;
        products *= 2;
    }
    // One level alone would leave two blocks' i16 in each 32-bit lane: [`isums8`] has no such
    // form (no type needs it), so it widens at once. Q5_1 (two levels, and a min) widens at
    // once too: with two levels it measured 0.96× its one-`vpmaddwd`-per-block form
    // (`blocks_speed Q5_1 576 2000`, median of 12 alternated pairs, 0.85–1.20), and 0.91–0.93×
    // while this function was still evaluated by the optimiser. Called in `const` blocks: left
    // to the optimiser, this loop changed the register allocation of the kernels that inline
    // it (Q5_1's accumulator spilled to the stack).
    if levels < 2 || (levels == 2 && F::MIN) {
        0
    } else {
        levels
    }
}

/// One block's products for [`isums8`]: `vpmaddubsw`'s i16 pairs where [`i16_levels`] is not
/// zero, else [`block_dot`]'s i32 lanes.
///
/// # Safety
/// As [`Dot::dot_us`].
#[inline(always)]
unsafe fn block_pre<F: Decode, D: Dot>(w: __m256i, a: __m256i) -> __m256i {
    // SAFETY: forwarded from the caller (`vpmaddubsw` is AVX2).
    unsafe {
        if const { i16_levels::<F, D>() } > 0 {
            _mm256_maddubs_epi16(w, a)
        } else {
            block_dot::<F, D>(w, a)
        }
    }
}

/// `[Σ p0, Σ p1, …, Σ p7]` (exact i32) of eight blocks' [`block_pre`] products: [`sums8`]'s
/// folds, as many of them in i16 as [`i16_levels`] allows, so that eight blocks widen with one
/// or two instructions instead of a `vpmaddwd` by ones each. Three levels: the whole tree in
/// i16, each block's two half sums in the two halves' i16 lane `j`, widened by sign
/// extension. Two: the 32- and 64-bit folds in i16 leave each block's lanes as two i16 of one
/// 32-bit lane, which `vpmaddwd` by ones adds (four blocks per instruction).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn isums8<F: Decode, D: Dot>(p: &[__m256i; 8]) -> __m256i {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        if const { i16_levels::<F, D>() } == 0 {
            return sums8(p);
        }
        if const { i16_levels::<F, D>() } == 2 {
            let f32 = fold::<32, true>;
            let a = fold::<64, true>(f32(p[0], p[1]), f32(p[2], p[3]));
            let b = fold::<64, true>(f32(p[4], p[5]), f32(p[6], p[7]));
            let ones = _mm256_set1_epi16(1);
            return halves(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
        }
        let f16 = fold::<16, true>;
        let a = fold::<32, true>(f16(p[0], p[1]), f16(p[2], p[3]));
        let b = fold::<32, true>(f16(p[4], p[5]), f16(p[6], p[7]));
        // Block j's two half sums in i16 lane j of each half.
        let x = fold::<64, true>(a, b);
        _mm256_add_epi32(
            _mm256_cvtepi16_epi32(_mm256_castsi256_si128(x)),
            _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(x)),
        )
    }
}

/// The f16 at `p + j·stride` for j in 0..8, as f32, inserted one by one (`vpinsrw`).
///
/// # Safety
/// Each of those 2-byte fields must be readable; F16C.
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller vouches for the eight fields and F16C.
    unsafe {
        let h = |j: usize| p.add(j * stride).cast::<i16>().read_unaligned();
        _mm256_cvtph_ps(_mm_set_epi16(
            h(7),
            h(6),
            h(5),
            h(4),
            h(3),
            h(2),
            h(1),
            h(0),
        ))
    }
}

/// [`f16x8`] with the eight fields joined in two general registers and moved over in two:
/// `vpinsrw` spent seven of the vector pipes' micro-ops per group, the busiest pipes of the
/// decode loop. For the types without a min (one such call per group): per core-second,
/// K = 576 and 4096 (`examples/blocks_speed.rs`, 2000 and 256 rows, old and new builds
/// alternated 10–16 times; single runs vary ±15 % on the VM) Q5_0 +6–16 % (with
/// [`i16_levels`]' two levels), IQ4_NL +6–10 %, Q4_0 +2–3 %, Q8_0 +0–2 %. The types with a
/// min keep [`f16x8`] (two calls per group; not measured joined).
///
/// # Safety
/// As [`f16x8`].
#[inline(always)]
unsafe fn f16x8_joined(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller vouches for the eight fields and F16C.
    unsafe {
        let h = |j: usize| u64::from(p.add(j * stride).cast::<u16>().read_unaligned());
        let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
        let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
        _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
    }
}

/// The eight blocks at `base` (a group: eight consecutive weight blocks) decoded, with their
/// scales `d_w` and (types with a min) mins `m_w` as f32 lanes.
///
/// # Safety
/// `8 · F::BYTES` readable bytes at `base`; AVX2 and F16C.
#[inline(always)]
unsafe fn decode_group<F: Decode, D: Dot>(base: *const u8) -> ([__m256i; 8], __m256, __m256) {
    // SAFETY: the caller vouches for the group's bytes and the ISA.
    unsafe {
        let mut wv = [_mm256_setzero_si256(); 8];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = decode_for::<F, D>(base.add(j * F::BYTES));
        }
        let (dw, mw) = if F::MIN {
            (f16x8(base, F::BYTES), f16x8(base.add(2), F::BYTES))
        } else {
            (f16x8_joined(base, F::BYTES), _mm256_setzero_ps())
        };
        (wv, dw, mw)
    }
}

/// The values of eight blocks (lane `j` for block `j` of the group), the scalar twin's
/// `(d_w · d_a) · isum [+ m_w · s_a]`: decoded weights `wv`, `dw`, `mw` against the activation
/// blocks whose int8 start at `q` (one every `ab_len` bytes) and whose `d`, `s` (types with a
/// min) and `Σq` are the eight values at `d`, `s`, `sum`.
///
/// # Safety
/// Eight activation blocks' int8 at `q`, eight values at `d`, `sum` (and `s` for types with a
/// min) readable; the CPU has AVX2 and `D`'s instructions.
#[inline(always)]
unsafe fn group_values<F: Decode, D: Dot>(
    (wv, dw, mw): &([__m256i; 8], __m256, __m256),
    q: *const u8,
    d: *const f32,
    s: *const f32,
    sum: *const i32,
) -> __m256 {
    let (ab_len, _) = act_geometry(F::MIN);
    // SAFETY: the caller vouches for the reads and the ISA.
    unsafe {
        // Plain loops, no closures, here and in the callers: a closure is not compiled with the
        // caller's target features, and the intrinsics would not inline into it.
        let mut p = [_mm256_setzero_si256(); 8];
        for (j, p) in p.iter_mut().enumerate() {
            let av = _mm256_loadu_si256(q.add(j * ab_len).cast());
            *p = block_pre::<F, D>(wv[j], av);
        }
        float_step::<F>(isums8::<F, D>(&p), *dw, *mw, d, s, sum)
    }
}

/// `(d_w · d_a) · (isum − OFFSET · Σa) [+ m_w · s_a]` on eight lanes, `d_a`, `s_a` and `Σa` the
/// eight values at `d`, `s`, `sum`.
///
/// # Safety
/// Eight values readable at `d`, `sum` (and `s` for types with a min); AVX2.
#[inline(always)]
unsafe fn float_step<F: Decode>(
    mut isum: __m256i,
    dw: __m256,
    mw: __m256,
    d: *const f32,
    s: *const f32,
    sum: *const i32,
) -> __m256 {
    // SAFETY: the caller vouches for the reads and the ISA.
    unsafe {
        if F::OFFSET != 0 {
            let asum = _mm256_loadu_si256(sum.cast());
            let off = _mm256_mullo_epi32(asum, _mm256_set1_epi32(F::OFFSET));
            isum = _mm256_sub_epi32(isum, off);
        }
        let da = _mm256_loadu_ps(d);
        let v = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum));
        if F::MIN {
            _mm256_add_ps(v, _mm256_mul_ps(mw, _mm256_loadu_ps(s)))
        } else {
            v
        }
    }
}

/// [`float_step`] of the tails' eight blocks ([`tail`], [`tail_packed`]): their
/// [`block_pre`] products `p`, scales and mins, and activation values from stack arrays.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn tail_values<F: Decode, D: Dot>(
    p: &[__m256i; 8],
    (dw, mw): (__m256, __m256),
    d: &[f32; 8],
    s: &[f32; 8],
    sum: &[i32; 8],
) -> __m256 {
    // SAFETY: eight values in each array; the caller guarantees AVX2.
    unsafe {
        float_step::<F>(
            isums8::<F, D>(p),
            dw,
            mw,
            d.as_ptr(),
            s.as_ptr(),
            sum.as_ptr(),
        )
    }
}

/// The last `t < 8` blocks of a row (from block `from`) as one group whose missing blocks are
/// zero lanes, added to the lanes `0..t` of each accumulator only (a blend, so the other lanes
/// keep their bits, `-0.0` included): what the scalar twin adds to lanes `0..t`. Only the `t`
/// blocks are read; their per-block values go through small stack arrays.
///
/// # Safety
/// `wr` holds blocks `from .. from + t` of `F`, each `ar[i]` the same activation blocks; the CPU
/// has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn tail<F: Decode, D: Dot, const N: usize>(
    wr: &[u8],
    ar: &[ActRow<'_>; N],
    from: usize,
    t: usize,
    acc: &mut [__m256; N],
) {
    let (ab_len, qs) = act_geometry(F::MIN);
    // SAFETY (whole body): blocks from .. from + t < nb of the weight and activation rows (the
    // caller's guarantee, and the slices' bounds for the per-block values); the ISA as the
    // caller guarantees.
    unsafe {
        let mut wv = [_mm256_setzero_si256(); 8];
        let (mut dh, mut mh) = ([0u16; 8], [0u16; 8]);
        for j in 0..t {
            let p = wr.as_ptr().add((from + j) * F::BYTES);
            wv[j] = decode_for::<F, D>(p);
            dh[j] = p.cast::<u16>().read_unaligned();
            if F::MIN {
                mh[j] = p.add(2).cast::<u16>().read_unaligned();
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr().cast()));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr().cast()));
        let mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32(t as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        for (a, acc) in ar.iter().zip(acc.iter_mut()) {
            let mut p = [_mm256_setzero_si256(); 8];
            let (mut d, mut s, mut sum) = ([0f32; 8], [0f32; 8], [0i32; 8]);
            for j in 0..t {
                let av = _mm256_loadu_si256(a.q.as_ptr().add((from + j) * ab_len + qs).cast());
                p[j] = block_pre::<F, D>(wv[j], av);
                d[j] = a.d[from + j];
                sum[j] = a.sum[from + j];
                if F::MIN {
                    s[j] = a.s[from + j];
                }
            }
            let v = tail_values::<F, D>(&p, (dw, mw), &d, &s, &sum);
            *acc = _mm256_blendv_ps(*acc, _mm256_add_ps(*acc, v), mask);
        }
    }
}

/// How far ahead of the group being computed its cache lines are prefetched, in bytes. The
/// weights stream from memory once per token, from file-backed 4 KiB pages, where the
/// hardware prefetchers stop at each page's end: 16 blocks ahead (288 bytes of Q4_0, one line
/// per group) left Q4_0 decode at ~10 GB/s of weights per core-second on the Xeon of
/// `docs/benchmarks.md`; every line 4 KiB ahead reads ~12–15 (`examples/blocks_speed.rs`,
/// thread CPU time, K = 576, 100 000 rows).
const PREFETCH_AHEAD: usize = 4096;

/// The group of eight blocks at `base`, decoded ([`decode_group`]), its cache lines
/// `PREFETCH_AHEAD` bytes on prefetched first (into the next rows: a task's rows are contiguous
/// in the map).
///
/// # Safety
/// `8 · F::BYTES` readable bytes at `base` (prefetching never faults); AVX2 and F16C.
#[inline(always)]
unsafe fn fetch_group<F: Decode, D: Dot>(base: *const u8) -> ([__m256i; 8], __m256, __m256) {
    let ahead = base.wrapping_add(PREFETCH_AHEAD);
    let mut line = 0;
    while line < 8 * F::BYTES {
        // SAFETY: a prefetch never faults; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast()) };
        line += 64;
    }
    // SAFETY: the caller vouches for the group's bytes and the ISA.
    unsafe { decode_group::<F, D>(base) }
}

/// [`group_values`] of a decoded group against group `g` of the activation row `a`.
///
/// # Safety
/// `a` has blocks `8g .. 8g + 8`; the CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn act_group_values<F: Decode, D: Dot>(
    group: &([__m256i; 8], __m256, __m256),
    a: &ActRow<'_>,
    g: usize,
) -> __m256 {
    let (ab_len, qs) = act_geometry(F::MIN);
    // SAFETY: blocks 8g .. 8g + 8 of the activation row and its per-block values (the
    // caller's guarantee); the ISA as the caller guarantees.
    unsafe {
        group_values::<F, D>(
            group,
            a.q.as_ptr().add(g * 8 * ab_len + qs),
            a.d.as_ptr().add(g * 8),
            a.s.as_ptr().wrapping_add(g * 8),
            a.sum.as_ptr().add(g * 8),
        )
    }
}

/// One weight row against `N` activation rows.
///
/// # Safety
/// `wr` is one weight row of `nb` blocks and each `ar[i]` an activation row of `nb` blocks;
/// the CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn row<F: Decode, D: Dot, const N: usize>(wr: &[u8], ar: [ActRow<'_>; N]) -> [f32; N] {
    let nb = wr.len() / F::BYTES;
    let groups = nb / 8;
    // SAFETY: register-only; the caller guarantees AVX.
    let mut acc = [unsafe { _mm256_setzero_ps() }; N];
    for g in 0..groups {
        // SAFETY (whole loop body): block g·8 + j < nb of the row, activation blocks likewise,
        // per-block indices g·8 .. g·8 + 8 <= nb; prefetching never faults.
        unsafe {
            let group = fetch_group::<F, D>(wr.as_ptr().add(g * 8 * F::BYTES));
            for (i, a) in ar.iter().enumerate() {
                acc[i] = _mm256_add_ps(acc[i], act_group_values::<F, D>(&group, a, g));
            }
        }
    }
    if nb > groups * 8 {
        // SAFETY: blocks groups·8 .. nb are in the rows; the ISA as the caller guarantees.
        unsafe { tail::<F, D, N>(wr, &ar, groups * 8, nb - groups * 8, &mut acc) };
    }
    let mut res = [0f32; N];
    for (i, a) in ar.iter().enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: 32 writable bytes; unaligned store.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i]) };
        res[i] = finish::<F>(lanes, wr, a.q, nb, |_| 0);
    }
    res
}

/// The last `T` blocks (from block `from`) of `R` weight rows (`wrb` bytes each, one after
/// another at `w`) against one activation row, packed into one group: lane `r·T + j` holds
/// block `from + j` of row `r` (`R·T ≤ 8`), so one lane sum and one float step serve every
/// row's tail. Each row's `T` values are then moved to lanes `0..T` and blended into its
/// accumulator there, as [`tail`] adds them: the same per-block values in the same lanes.
/// `T` is a constant so that the lanes are known when compiled and stay in registers (with
/// `T` a variable they went through the stack and the packing saved nothing).
///
/// # Safety
/// `w` holds `R` rows of `wrb` bytes, each with blocks `from .. from + T` of `F`; `a` has the
/// same activation blocks; `R · T <= 8`; the CPU has AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn tail_packed<F: Decode, D: Dot, const R: usize, const T: usize>(
    (w, wrb): (&[u8], usize),
    a: &ActRow<'_>,
    from: usize,
    acc: &mut [__m256; R],
) {
    let (ab_len, qs) = act_geometry(F::MIN);
    let t = T;
    debug_assert!(R * T <= 8 && T > 0);
    // SAFETY (whole body): blocks from .. from + t of each of the R rows and of the activation
    // row (the caller's guarantee; the slices' bounds for the per-block values); lanes
    // r·t + j < 8; the ISA as the caller guarantees.
    unsafe {
        let mut p = [_mm256_setzero_si256(); 8];
        let (mut dh, mut mh) = ([0u16; 8], [0u16; 8]);
        let (mut d, mut s, mut sum) = ([0f32; 8], [0f32; 8], [0i32; 8]);
        for r in 0..R {
            for j in 0..t {
                let lane = r * t + j;
                let pb = w.as_ptr().add(r * wrb + (from + j) * F::BYTES);
                let av = _mm256_loadu_si256(a.q.as_ptr().add((from + j) * ab_len + qs).cast());
                p[lane] = block_pre::<F, D>(decode_for::<F, D>(pb), av);
                dh[lane] = pb.cast::<u16>().read_unaligned();
                if F::MIN {
                    mh[lane] = pb.add(2).cast::<u16>().read_unaligned();
                    s[lane] = a.s[from + j];
                }
                d[lane] = a.d[from + j];
                sum[lane] = a.sum[from + j];
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr().cast()));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr().cast()));
        let v = tail_values::<F, D>(&p, (dw, mw), &d, &s, &sum);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(t as i32), lanes));
        for (r, acc) in acc.iter_mut().enumerate() {
            // Lane j takes lane r·t + j (indices past 7 wrap, into lanes the blend drops).
            let idx = _mm256_add_epi32(lanes, _mm256_set1_epi32((r * t) as i32));
            let vr = _mm256_permutevar8x32_ps(v, idx);
            *acc = _mm256_blendv_ps(*acc, _mm256_add_ps(*acc, vr), mask);
        }
    }
}

/// Weight rows per call of the decode kernel ([`rows4`]).
const DECODE_ROWS: usize = 4;

/// [`DECODE_ROWS`] weight rows (`wrb` bytes each, one after another in `w`) against one
/// activation row (M = 1, decode): each row's groups of eight blocks as [`row`] computes them,
/// and the rows' last `nb % 8` blocks, when one or two, packed into one group ([`tail_packed`]:
/// K = 576 leaves 2 blocks a row, one group for four rows instead of a group each), else
/// row by row as [`row`]'s tail. The scalar twin's bits. Against [`row`] one row at a time:
/// Q4_0 K = 576 ~15.5 → ~18 GB/s, Q8_0 ~29 → ~34 per core-second (`examples/blocks_speed.rs`,
/// 2000 rows, L2-resident, both builds alternated). The lane sums by unpacks ([`sums8`]) and,
/// for Q4_0, in i16 ([`isums8`]), against `vphaddd` after `vpmaddwd` per block: median ratios of
/// `cpu_gbps`, 12–16 alternated pairs of runs, three series each, on an AMD EPYC Zen 3 VM with
/// AVX2 (`taskset -c 1 target/release/examples/blocks_speed TYPE K ROWS 1 0.15`, the other
/// core busy, so noisy): Q4_0 K = 576 (800 rows) 1.04–1.16, K = 4096 (128 rows) 0.99–1.17,
/// Q8_0 K = 576 (400 rows) 1.10–1.20, and 49152 rows from memory 1.10. Row `r`'s result goes
/// to `out[r]`.
///
/// # Safety
/// `w` holds `DECODE_ROWS` rows of `wrb` bytes (`nb` blocks of `F`), `a` is an activation row
/// of `nb` blocks, `out` has `DECODE_ROWS` values; the CPU has AVX2, F16C and `D`'s
/// instructions.
#[inline(always)]
unsafe fn rows4<F: Decode, D: Dot>(w: &[u8], wrb: usize, a: ActRow<'_>, out: &mut [f32]) {
    let nb = wrb / F::BYTES;
    let groups = nb / 8;
    // SAFETY: register-only; the caller guarantees AVX.
    let mut acc = [unsafe { _mm256_setzero_ps() }; DECODE_ROWS];
    for (r, acc) in acc.iter_mut().enumerate() {
        for g in 0..groups {
            // SAFETY (whole loop body): block g·8 + j < nb of row r, activation blocks
            // likewise; prefetching never faults.
            unsafe {
                let group = fetch_group::<F, D>(w.as_ptr().add(r * wrb + g * 8 * F::BYTES));
                *acc = _mm256_add_ps(*acc, act_group_values::<F, D>(&group, &a, g));
            }
        }
    }
    let (from, t) = (groups * 8, nb - groups * 8);
    if t == 2 {
        // SAFETY: the rows' blocks from .. nb; DECODE_ROWS · t <= 8; the ISA as guaranteed.
        unsafe { tail_packed::<F, D, DECODE_ROWS, 2>((w, wrb), &a, from, &mut acc) };
    } else if t == 1 {
        // SAFETY: as above.
        unsafe { tail_packed::<F, D, DECODE_ROWS, 1>((w, wrb), &a, from, &mut acc) };
    } else if t > 0 {
        for (r, acc) in acc.iter_mut().enumerate() {
            let mut one = [*acc];
            let wr = &w[r * wrb..][..wrb];
            // SAFETY: blocks from .. nb of the row; the ISA as the caller guarantees.
            unsafe { tail::<F, D, 1>(wr, &[a], from, t, &mut one) };
            *acc = one[0];
        }
    }
    // Straight into the output (returned as an array, the four results were stored one by
    // one and read back as one vector by the caller: a store-forwarding stall per call).
    for ((r, acc), o) in acc.iter().enumerate().zip(out.iter_mut()) {
        let mut lanes = [0f32; 8];
        // SAFETY: 32 writable bytes; unaligned store.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *acc) };
        *o = finish::<F>(lanes, &w[r * wrb..][..wrb], a.q, nb, |_| 0);
    }
}

/// Decode (M = 1): the rows [`DECODE_ROWS`] at a time by `four`, the rest one at a time by
/// `one`, the activation row's per-block fields decoded once.
///
/// # Safety
/// `four` and `one` must be safe to call on this CPU for rows of `k / 32` blocks of `F`; the
/// lengths are those `Kernel::rows` checks (M = 1).
unsafe fn decode_rows<F: Format>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    out: &mut [f32],
    (four, one): (RowsDots4, RowDots<1>),
) {
    let nb = k / 32;
    // The row's per-block fields on the stack up to K = 2048 (a task's heap buffers cost it
    // about as much as its first rows of 576 weights); on the heap beyond.
    let (mut d, mut s, mut sum) = (
        [0f32; STACK_BLOCKS],
        [0f32; STACK_BLOCKS],
        [0i32; STACK_BLOCKS],
    );
    let heap;
    let ar = if nb <= STACK_BLOCKS {
        let (d, s, sum) = (&mut d[..nb], &mut s[..nb], &mut sum[..nb]);
        act_fields(acts, F::MIN, d, s, sum);
        ActRow {
            q: acts,
            d,
            s: if F::MIN { s } else { &[] },
            sum,
        }
    } else {
        heap = Acts::new(acts, nb, F::MIN);
        heap.row(0)
    };
    let wrb = nb * F::BYTES;
    let whole = rows / DECODE_ROWS * DECODE_ROWS;
    for (o, w) in out[..whole]
        .chunks_exact_mut(DECODE_ROWS)
        .zip(w.chunks_exact(DECODE_ROWS * wrb))
    {
        // SAFETY: the caller's guarantee, for DECODE_ROWS rows.
        unsafe { four(w, wrb, ar, o) };
    }
    for (o, wr) in out[whole..rows]
        .iter_mut()
        .zip(w[whole * wrb..].chunks_exact(wrb))
    {
        // SAFETY: as above, for one row.
        *o = unsafe { one(wr, [ar]) }[0];
    }
}

/// Activation blocks whose per-block fields [`decode_rows`] keeps on the stack.
const STACK_BLOCKS: usize = 64;

/// A decode kernel of [`DECODE_ROWS`] weight rows (`wrb` bytes each) against one activation row,
/// into as many outputs.
type RowsDots4 = unsafe fn(&[u8], usize, ActRow<'_>, &mut [f32]);

/// `ROW` (one weight row against `N` activation rows) and [`panel::rows`] (eight weight rows
/// at once, M > 1) compiled for one ISA.
macro_rules! isa_kernels {
    ($row:ident, $rows4:ident, $panel:ident, $dot:ty, $wide:literal, $features:literal) => {
        /// [`rows4`] compiled for the ISA.
        ///
        /// # Safety
        /// As [`rows4`]; the CPU has the features.
        #[target_feature(enable = $features)]
        unsafe fn $rows4<F: Decode>(w: &[u8], wrb: usize, a: ActRow<'_>, o: &mut [f32]) {
            // SAFETY: forwarded.
            unsafe { rows4::<F, $dot>(w, wrb, a, o) }
        }

        /// `row` compiled for the ISA.
        ///
        /// # Safety
        /// As [`row`]; the CPU has the features.
        #[target_feature(enable = $features)]
        unsafe fn $row<F: Decode, const N: usize>(wr: &[u8], ar: [ActRow<'_>; N]) -> [f32; N] {
            // SAFETY: forwarded.
            unsafe { row::<F, $dot, N>(wr, ar) }
        }

        /// [`panel::rows`] compiled for the ISA.
        ///
        /// # Safety
        /// As [`panel::rows`]; the CPU has the features.
        #[target_feature(enable = $features)]
        unsafe fn $panel<F: Decode>(
            k: usize,
            w: &[u8],
            n: usize,
            a: &[u8],
            m: usize,
            o: &mut [f32],
        ) -> usize {
            if $wide {
                // SAFETY: forwarded (the wide panel is only asked for on AVX-512).
                unsafe { panel16::rows::<F>(k, w, n, a, m, o) }
            } else {
                // SAFETY: forwarded.
                unsafe { panel::rows::<F, $dot>(k, w, n, a, m, o) }
            }
        }
    };
}
isa_kernels!(row_avx2, rows4_avx2, panel_avx2, Avx2, false, "avx2,f16c");
isa_kernels!(
    row_vnni,
    rows4_vnni,
    panel_vnni,
    AvxVnni,
    false,
    "avx2,f16c,avxvnni"
);
isa_kernels!(
    row_512,
    rows4_512,
    panel_512,
    Avx512Vnni,
    true,
    "avx2,f16c,avx512f,avx512vl,avx512vnni,avx512bw"
);

/// Safe entries (`RowsFn`): [`rows`] hands them out only on a CPU with every feature the
/// kernel is compiled for, and `Kernel::rows` checks the lengths. M > 1 runs the panel kernel on
/// whole groups of eight weight rows where it computes the type exactly, the one-row kernel on
/// the rest.
macro_rules! entries {
    ($($name:ident => $row:ident, $rows4:ident, $panel:ident, $dot:ty);*) => {$(
        fn $name<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
            if m == 1 {
                // SAFETY: see the macro's doc: the ISA is present and the lengths are checked.
                unsafe { decode_rows::<F>(k, w, n, a, o, ($rows4::<F>, $row::<F, 1>)) };
                return;
            }
            let done = if m >= panel::MIN_M {
                // SAFETY: see the macro's doc: the ISA is present and the lengths are checked.
                unsafe { $panel::<F>(k, w, n, a, m, o) }
            } else {
                0
            };
            if done == n {
                // The panels took every row: no per-call decoding of the activations'
                // fields for `drive` (with M = 128 it was ~10 % of a Q4_0 prefill).
                return;
            }
            let wrb = k / 32 * F::BYTES;
            let (w, o) = (&w[done * wrb..], &mut o[done * m..]);
            // SAFETY: as above, for the remaining rows.
            unsafe { drive::<F>(k, w, n - done, a, m, o, ($row::<F, 4>, $row::<F, 1>)) }
        }
    )*};
}
entries!(
    safe_avx2 => row_avx2, rows4_avx2, panel_avx2, Avx2;
    safe_vnni => row_vnni, rows4_vnni, panel_vnni, AvxVnni;
    safe_512 => row_512, rows4_512, panel_512, Avx512Vnni
);

/// The kernel for `ty` on `isa` (an x86 ISA this CPU runs).
pub(super) fn rows(ty: WeightType, isa: Isa) -> Option<RowsFn> {
    use std::arch::is_x86_feature_detected as has;
    // Every feature the kernel is compiled for (`Isa::available` checks fewer: AVX-512 VNNI
    // without AVX2 or VL, or AVX2 without F16C, exist on paper).
    let base = has!("avx2") && has!("f16c");
    let ok = match isa {
        Isa::Avx2 => base,
        Isa::AvxVnni => base && has!("avxvnni"),
        Isa::Avx512Vnni => {
            base && has!("avx512f") && has!("avx512vl") && has!("avx512vnni") && has!("avx512bw")
        }
        _ => false,
    };
    if !ok {
        return None;
    }
    Some(match isa {
        Isa::Avx2 => by_format!(ty, safe_avx2),
        Isa::AvxVnni => by_format!(ty, safe_vnni),
        Isa::Avx512Vnni => by_format!(ty, safe_512),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Decode::UMAX` is the largest byte each unsigned decoding gives (the scalar twin's
    /// weight plus the offset) over every block made of one repeated byte, which includes the
    /// one with every quant bit set.
    #[test]
    fn umax_is_each_unsigned_decodings_largest_byte() {
        fn largest<F: Decode>() -> i32 {
            let byte = |b: u8| F::weights(&vec![b; F::BYTES]).map(|w| i32::from(w) + F::OFFSET);
            (0..=255u8).flat_map(byte).max().unwrap_or(0)
        }
        assert_eq!(largest::<Q4_0>(), Q4_0::UMAX);
        assert_eq!(largest::<Q4_1>(), Q4_1::UMAX);
        assert_eq!(largest::<Q5_0>(), Q5_0::UMAX);
        assert_eq!(largest::<Q5_1>(), Q5_1::UMAX);
    }
}
