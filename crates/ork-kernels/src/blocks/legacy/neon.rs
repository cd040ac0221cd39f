//! aarch64 kernels for the 32-weight block types, one body ([`body`]) compiled twice: NEON
//! (`smull`/`smull2` + `sadalp`, the Cortex-A72/A53 path) and NEON dotprod (`sdot`, Cortex-A76
//! and A55).
//!
//! A block decodes into two int8x16 (weights 0..16 and 16..32, [`Decode`]); its dot with the
//! activation's 32 int8 is exact in four i32 lanes (signed × signed, `|w·a| ≤ 128·127`).
//! Eight blocks' lane vectors fold by `addp` into two vectors of block sums, and the float step
//! runs on them in the scalar twin's order ([`super::rows_scalar`]): lane `b % 8` is lane
//! `b % 4` of the low (`b % 8 < 4`) or high accumulator.
//!
//! At M > 1 on dotprod, [`drive_tiles`] runs four weight rows against four activation rows
//! ([`tile_sdot`]): the activation rows interleaved by 4-byte chunks once per call, each
//! block's decoded weights the indexed operand of `sdot` by element (read from the block in
//! place), four blocks' sums transposed into [`row`]'s lanes so its float step and order hold.
//!
//! Why this body is not shared with `x86.rs`'s, whose loop has the same shape: the two differ
//! in algorithm, not only in intrinsics. x86 decodes a block into one 256-bit vector and
//! multiplies unsigned by signed bytes (`vpmaddubsw`, `vpdpbusd`), so its Q4_0/Q5_0 decode
//! unsigned and subtract `offset · Σa`, and Q8_0/IQ4_NL take the sign trick; NEON holds a block
//! in two 128-bit signed vectors and multiplies signed by signed (`sdot`, `smull`), and folds
//! with `addp` instead of `vphaddd`. What is common lives in `legacy.rs`: the row driver
//! ([`drive`]), the tail and fold ([`finish`]), the type → format table (`by_format!`).

use super::super::neon::{f16x8, f16x8_pairs, sdot};
use super::{
    act_geometry, drive, finish, ActRow, Acts, Format, Iq4Nl, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use super::{Isa, RowsFn, WeightType, KVALUES_IQ4NL};
use std::arch::aarch64::*;

/// A block format's NEON decoder.
trait Decode: Format {
    /// The 32 integer weights of the block at `p`: `(weights 0..16, weights 16..32)`.
    ///
    /// # Safety
    /// `p .. p + BYTES` must be readable.
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t);
    /// The weights [`Decode::decode`] returns are `2^SCALE_BITS` times the block's: the block
    /// sums are shifted back (the float step converts with `scvtf #SCALE_BITS`, the tail shifts
    /// right), exactly, as every one is a multiple of `2^SCALE_BITS`.
    const SCALE_BITS: i32 = 0;
}

/// The low and high nibbles of the 16 bytes at `p`.
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller guarantees 16 readable bytes (`ld1` takes unaligned addresses); NEON
    // is the aarch64 baseline.
    unsafe {
        let v = vld1q_u8(p);
        (vandq_u8(v, vdupq_n_u8(15)), vshrq_n_u8::<4>(v))
    }
}

/// Q5's fifth bits from the u32 at `p`, as 0x10 in each weight's byte.
///
/// # Safety
/// 4 readable bytes at `p`.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller guarantees 4 readable bytes; NEON is the aarch64 baseline.
    unsafe {
        let h = p.cast::<u32>().read_unaligned();
        let hv = vreinterpretq_u8_u32(vdupq_n_u32(h));
        let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let spread = |lo: u64, hi: u64| {
            let i = vcombine_u8(vcreate_u8(lo), vcreate_u8(hi));
            vandq_u8(vtstq_u8(vqtbl1q_u8(hv, i), bit), vdupq_n_u8(0x10))
        };
        (
            spread(0, 0x0101_0101_0101_0101),
            spread(0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
        )
    }
}

/// Signed weights `v − off`.
#[inline(always)]
fn centred((lo, hi): (uint8x16_t, uint8x16_t), off: u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: register-only; NEON is the aarch64 baseline.
    unsafe {
        let o = vdupq_n_u8(off);
        (
            vreinterpretq_s8_u8(vsubq_u8(lo, o)),
            vreinterpretq_s8_u8(vsubq_u8(hi, o)),
        )
    }
}

/// Bitwise or of two pairs.
#[inline(always)]
fn or2(a: (uint8x16_t, uint8x16_t), b: (uint8x16_t, uint8x16_t)) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: register-only; NEON is the aarch64 baseline.
    unsafe { (vorrq_u8(a.0, b.0), vorrq_u8(a.1, b.1)) }
}

impl Decode for Q4_0 {
    /// `16·(v − 8)` for both nibbles in three instructions: `eor` of 0x88 flips bit 3 of each
    /// nibble, so a nibble read as 4-bit two's complement is `v − 8`; `shl #4` puts the low
    /// nibble at the top of the byte and `and 0xf0` keeps the high one there (`|16·(v − 8)| ≤
    /// 128`, so `Σ w·a ≤ 32·128·128` stays exact in i32). The plain form (`and`, `sub`, and
    /// `usra` onto a fresh copy of −8) took four and a constant move per block.
    const SCALE_BITS: i32 = 4;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: qs are bytes 2..18 of the block; NEON is the aarch64 baseline.
        unsafe {
            let v = veorq_u8(vld1q_u8(p.add(2)), vdupq_n_u8(0x88));
            (
                vreinterpretq_s8_u8(vshlq_n_u8::<4>(v)),
                vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xf0))),
            )
        }
    }
}

impl Decode for Q4_1 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: qs are bytes 4..20 of the block.
        centred(unsafe { nibbles(p.add(4)) }, 0)
    }
}

impl Decode for Q5_0 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: qh is bytes 2..6, qs 6..22 of the block.
        centred(unsafe { or2(nibbles(p.add(6)), fifth_bits(p.add(2))) }, 16)
    }
}

impl Decode for Q5_1 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: qh is bytes 4..8, qs 8..24 of the block.
        centred(unsafe { or2(nibbles(p.add(8)), fifth_bits(p.add(4))) }, 0)
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: qs are bytes 2..34 of the block.
        unsafe { (vld1q_s8(p.add(2).cast()), vld1q_s8(p.add(18).cast())) }
    }
}

impl Decode for Iq4Nl {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: the table is 16 bytes; qs are bytes 2..18 of the block; NEON baseline.
        unsafe {
            let (t, (lo, hi)) = (vld1q_s8(KVALUES_IQ4NL.as_ptr()), nibbles(p.add(2)));
            (vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi))
        }
    }
}

/// The int8 dot of one block into four i32 lanes.
trait Dot {
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot(w: (int8x16_t, int8x16_t), a: (int8x16_t, int8x16_t)) -> int32x4_t;
}

/// `smull`/`smull2` + `sadalp`.
struct Widen;
/// `sdot`.
struct Sdot;

impl Dot for Widen {
    #[inline(always)]
    unsafe fn dot(w: (int8x16_t, int8x16_t), a: (int8x16_t, int8x16_t)) -> int32x4_t {
        // SAFETY: register-only; NEON is the aarch64 baseline.
        unsafe {
            let p0 = vmull_s8(vget_low_s8(w.0), vget_low_s8(a.0));
            let p1 = vmull_high_s8(w.0, a.0);
            let p2 = vmull_s8(vget_low_s8(w.1), vget_low_s8(a.1));
            let p3 = vmull_high_s8(w.1, a.1);
            let acc = vpadalq_s16(vpaddlq_s16(p0), p1);
            vpadalq_s16(vpadalq_s16(acc, p2), p3)
        }
    }
}

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(w: (int8x16_t, int8x16_t), a: (int8x16_t, int8x16_t)) -> int32x4_t {
        // SAFETY: the caller guarantees FEAT_DotProd.
        unsafe { sdot(sdot(vdupq_n_s32(0), w.0, a.0), w.1, a.1) }
    }
}

/// The 32 activation int8 at `p`.
///
/// # Safety
/// 32 readable bytes.
#[inline(always)]
unsafe fn load_act(p: *const u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller guarantees 32 readable bytes.
    unsafe { (vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast())) }
}

/// `[Σ p0, Σ p1, Σ p2, Σ p3]`.
#[inline(always)]
fn sums4(p: &[int32x4_t]) -> int32x4_t {
    // SAFETY: register-only; NEON is the aarch64 baseline.
    unsafe { vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3])) }
}

/// One weight row against `N` activation rows (the x86 twin of this function has the same
/// structure).
///
/// # Safety
/// `wr` is one weight row of `nb` blocks and each `ar[i]` an activation row of `nb` blocks;
/// the CPU has `D`'s instructions.
#[inline(always)]
unsafe fn row<F: Decode, D: Dot, const N: usize>(wr: &[u8], ar: [ActRow<'_>; N]) -> [f32; N] {
    let (ab_len, qs) = act_geometry(F::MIN);
    let nb = wr.len() / F::BYTES;
    let groups = nb / 8;
    // SAFETY: register-only; NEON is the aarch64 baseline.
    let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 2]; N];
    for g in 0..groups {
        // SAFETY (whole loop body): block g·8 + j < nb of the row, activation blocks likewise,
        // per-block indices g·8 .. g·8 + 8 <= nb.
        unsafe {
            let base = wr.as_ptr().add(g * 8 * F::BYTES);
            // Plain loops, no closures, here and below: a closure would not be compiled with
            // the caller's `dotprod` feature, and `sdot` would not assemble in it.
            let mut wv = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = F::decode(base.add(j * F::BYTES));
            }
            let (dw, mw) = if F::MIN {
                f16x8_pairs(base, F::BYTES)
            } else {
                let dw = f16x8(base, F::BYTES);
                (dw, dw)
            };
            for (i, a) in ar.iter().enumerate() {
                let abase = a.q.as_ptr().add(g * 8 * ab_len + qs);
                let mut p = [vdupq_n_s32(0); 8];
                for (j, p) in p.iter_mut().enumerate() {
                    *p = D::dot(wv[j], load_act(abase.add(j * ab_len)));
                }
                let isum = [sums4(&p[..4]), sums4(&p[4..])];
                let (halves, mhalves) = ([dw.0, dw.1], [mw.0, mw.1]);
                for h in 0..2 {
                    let da = vld1q_f32(a.d.as_ptr().add(g * 8 + 4 * h));
                    // The two scalings a decoder uses (checked at compile time).
                    const { assert!(F::SCALE_BITS == 0 || F::SCALE_BITS == 4) };
                    let sums = if F::SCALE_BITS == 4 {
                        vcvtq_n_f32_s32::<4>(isum[h])
                    } else {
                        vcvtq_f32_s32(isum[h])
                    };
                    let mut v = vmulq_f32(vmulq_f32(halves[h], da), sums);
                    if F::MIN {
                        let sa = vld1q_f32(a.s.as_ptr().add(g * 8 + 4 * h));
                        v = vaddq_f32(v, vmulq_f32(mhalves[h], sa));
                    }
                    acc[i][h] = vaddq_f32(acc[i][h], v);
                }
            }
        }
    }
    let mut res = [0f32; N];
    for (i, a) in ar.iter().enumerate() {
        // SAFETY: the caller's rows; the CPU has `D`'s instructions.
        res[i] = unsafe { finish_lanes::<F, D>(acc[i], wr, *a, groups * 8) };
    }
    res
}

/// One output from [`row`]'s (or [`tile_sdot`]'s) two accumulators over blocks `..from`:
/// the blocks from `from` on (fewer than eight) dotted one by one, then [`finish`].
///
/// # Safety
/// `wr` and `a` whole rows of the same blocks; the CPU has `D`'s instructions.
#[inline(always)]
unsafe fn finish_lanes<F: Decode, D: Dot>(
    acc: [float32x4_t; 2],
    wr: &[u8],
    a: ActRow<'_>,
    from: usize,
) -> f32 {
    let (ab_len, qs) = act_geometry(F::MIN);
    let nb = wr.len() / F::BYTES;
    let mut lanes = [0f32; 8];
    let mut tail = [0i32; 8];
    for (b, t) in (from..nb).zip(&mut tail) {
        // SAFETY: block b < nb of both rows; the CPU has `D`'s instructions.
        *t = unsafe {
            let w = F::decode(wr.as_ptr().add(b * F::BYTES));
            vaddvq_s32(D::dot(w, load_act(a.q.as_ptr().add(b * ab_len + qs)))) >> F::SCALE_BITS
        };
    }
    // SAFETY: 32 writable bytes.
    unsafe {
        vst1q_f32(lanes.as_mut_ptr(), acc[0]);
        vst1q_f32(lanes.as_mut_ptr().add(4), acc[1]);
    }
    finish::<F>(lanes, wr, a.q, from, |b| tail[b - from])
}

/// `row` with the baseline NEON dot.
///
/// # Safety
/// As [`row`] (NEON is the aarch64 baseline).
unsafe fn row_neon<F: Decode, const N: usize>(wr: &[u8], ar: [ActRow<'_>; N]) -> [f32; N] {
    // SAFETY: forwarded.
    unsafe { row::<F, Widen, N>(wr, ar) }
}

/// `row` compiled for FEAT_DotProd.
///
/// # Safety
/// As [`row`] on a CPU with FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
unsafe fn row_sdot<F: Decode, const N: usize>(wr: &[u8], ar: [ActRow<'_>; N]) -> [f32; N] {
    // SAFETY: forwarded.
    unsafe { row::<F, Sdot, N>(wr, ar) }
}

/// Safe entry of the NEON kernel (NEON is the aarch64 baseline; `Kernel::rows` checks the
/// lengths).
fn entry_neon<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    // SAFETY: see the doc comment.
    unsafe { drive::<F>(k, w, n, a, m, o, (row_neon::<F, 4>, row_neon::<F, 1>)) }
}

/// Safe entry of the dotprod kernel: [`rows`] hands it out only for [`Isa::NeonDot`], which
/// `super::rows` has checked this CPU runs; `Kernel::rows` checks the lengths.
fn entry_sdot<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    // SAFETY: see the doc comment.
    unsafe { drive_tiles::<F>(k, w, n, a, m, o) }
}

/// Bytes of one block of four interleaved activation rows ([`interleave`]).
const XI_BLOCK: usize = 4 * 32;

/// Activation rows `ar` interleaved for [`tile_sdot`]: per block, 8 chunks of 16 bytes, chunk
/// `c` holding the four rows' quants `4c..4c + 4` side by side (byte `16c + 4i + t` is row
/// `i`'s quant `4c + t`).
fn interleave<F: Format>(ar: [ActRow<'_>; 4], nb: usize, out: &mut [u8]) {
    let (ab_len, qs) = act_geometry(F::MIN);
    for (b, dst) in out.chunks_exact_mut(XI_BLOCK).take(nb).enumerate() {
        for (i, a) in ar.iter().enumerate() {
            let q = &a.q[b * ab_len + qs..][..32];
            for (c, v) in q.chunks_exact(4).enumerate() {
                dst[16 * c + 4 * i..16 * c + 4 * i + 4].copy_from_slice(v);
            }
        }
    }
}

/// The dotprod driver: weight rows four at a time against activation rows four at a time
/// ([`tile_sdot`], the activations [`interleave`]d once per call), the activation rows left
/// over by [`row_sdot`] one at a time, the weight rows left over by [`drive`].
///
/// # Safety
/// FEAT_DotProd; `w` holds `n` rows of `k / 32` blocks, `a` `m` activation rows, `o` `n·m`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn drive_tiles<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    let nb = k / 32;
    let (wrb, quads) = (nb * F::BYTES, m / 4);
    let acts = Acts::new(a, nb, F::MIN);
    let mut xi = vec![0u8; quads * nb * XI_BLOCK];
    for (q, dst) in xi.chunks_exact_mut(nb * XI_BLOCK).enumerate() {
        let ar = [0, 1, 2, 3].map(|i| acts.row(4 * q + i));
        interleave::<F>(ar, nb, dst);
    }
    let tiled = if quads > 0 { n / 4 * 4 } else { 0 };
    for r0 in (0..tiled).step_by(4) {
        let wr = [0, 1, 2, 3].map(|r| &w[(r0 + r) * wrb..][..wrb]);
        for q in 0..quads {
            let ar = [0, 1, 2, 3].map(|i| acts.row(4 * q + i));
            // SAFETY: whole rows of `nb` blocks and `nb` interleaved blocks; FEAT_DotProd.
            let t = unsafe { tile_sdot::<F>(wr, ar, &xi[q * nb * XI_BLOCK..][..nb * XI_BLOCK]) };
            for (r, t) in t.iter().enumerate() {
                o[(r0 + r) * m + 4 * q..][..4].copy_from_slice(t);
            }
        }
        for i in 4 * quads..m {
            for (r, wr) in wr.iter().enumerate() {
                // SAFETY: as above.
                o[(r0 + r) * m + i] = unsafe { row::<F, Sdot, 1>(wr, [acts.row(i)]) }[0];
            }
        }
    }
    let (w, o) = (&w[tiled * wrb..], &mut o[tiled * m..]);
    // SAFETY: the rest of the rows, as the caller's.
    unsafe {
        drive::<F>(
            k,
            w,
            n - tiled,
            a,
            m,
            o,
            (row_sdot::<F, 4>, row_sdot::<F, 1>),
        )
    }
}

/// `sdot` of one block of four interleaved activation rows (`x`, [`interleave`]) with one
/// block's weights `w` (weights 0..16, 16..32) by element: lane `i` is activation row `i`'s
/// block dot.
///
/// # Safety
/// 128 readable bytes at `x`; FEAT_DotProd and a caller compiled with it.
#[inline(always)]
unsafe fn block_dot(x: *const i8, w: (int8x16_t, int8x16_t)) -> int32x4_t {
    // SAFETY: the caller's 128 bytes.
    let xs: [int8x16_t; 8] = unsafe { std::array::from_fn(|c| vld1q_s8(x.add(16 * c))) };
    let d;
    // SAFETY: vector registers only; the caller guarantees FEAT_DotProd.
    unsafe {
        std::arch::asm!(
            "movi {d:v}.16b, #0",
            "sdot {d:v}.4s, {x0:v}.16b, {lo:v}.4b[0]",
            "sdot {d:v}.4s, {x1:v}.16b, {lo:v}.4b[1]",
            "sdot {d:v}.4s, {x2:v}.16b, {lo:v}.4b[2]",
            "sdot {d:v}.4s, {x3:v}.16b, {lo:v}.4b[3]",
            "sdot {d:v}.4s, {x4:v}.16b, {hi:v}.4b[0]",
            "sdot {d:v}.4s, {x5:v}.16b, {hi:v}.4b[1]",
            "sdot {d:v}.4s, {x6:v}.16b, {hi:v}.4b[2]",
            "sdot {d:v}.4s, {x7:v}.16b, {hi:v}.4b[3]",
            d = out(vreg) d,
            x0 = in(vreg) xs[0],
            x1 = in(vreg) xs[1],
            x2 = in(vreg) xs[2],
            x3 = in(vreg) xs[3],
            x4 = in(vreg) xs[4],
            x5 = in(vreg) xs[5],
            x6 = in(vreg) xs[6],
            x7 = in(vreg) xs[7],
            lo = in(vreg) w.0,
            hi = in(vreg) w.1,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    d
}

/// Four lanes vectors transposed: lane `j` of result `i` is lane `i` of `v[j]`.
#[inline(always)]
fn transpose4(v: [int32x4_t; 4]) -> [int32x4_t; 4] {
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let (a, b) = (vtrn1q_s32(v[0], v[1]), vtrn2q_s32(v[0], v[1]));
        let (c, d) = (vtrn1q_s32(v[2], v[3]), vtrn2q_s32(v[2], v[3]));
        let (a, b, c, d) = (
            vreinterpretq_s64_s32(a),
            vreinterpretq_s64_s32(b),
            vreinterpretq_s64_s32(c),
            vreinterpretq_s64_s32(d),
        );
        [
            vreinterpretq_s32_s64(vtrn1q_s64(a, c)),
            vreinterpretq_s32_s64(vtrn1q_s64(b, d)),
            vreinterpretq_s32_s64(vtrn2q_s64(a, c)),
            vreinterpretq_s32_s64(vtrn2q_s64(b, d)),
        ]
    }
}

/// Four weight rows against four activation rows (`xi`: theirs [`interleave`]d): per block,
/// [`block_dot`] of each weight row gives the four activation rows' block sums in its lanes;
/// four blocks' are transposed into [`row`]'s layout (lanes = blocks) and the float step is
/// [`row`]'s, so each output equals `row::<F, Sdot, _>`'s, and the scalar twin's, bit for bit.
///
/// # Safety
/// `wr[r]` a weight row of `nb` blocks, `ar[i]` activation rows of `nb` blocks, `xi` `nb`
/// interleaved blocks; FEAT_DotProd.
// Index loops, not iterators: `h`, `j`, `r` index several arrays at once, and a closure would
// not be compiled with this function's `dotprod` feature (`sdot` would not assemble in it).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_sdot<F: Decode>(wr: [&[u8]; 4], ar: [ActRow<'_>; 4], xi: &[u8]) -> [[f32; 4]; 4] {
    let nb = wr[0].len() / F::BYTES;
    let groups = nb / 8;
    let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; 4];
    for g in 0..groups {
        // SAFETY (whole loop body): blocks g·8 .. g·8 + 8 ≤ nb of every row and of `xi`.
        unsafe {
            let x = xi.as_ptr().add(g * 8 * XI_BLOCK).cast::<i8>();
            let base = wr.map(|w| w.as_ptr().add(g * 8 * F::BYTES));
            for h in 0..2 {
                // d[r][j]: weight row r's block 4h + j, lanes = activation rows.
                let mut d = [[vdupq_n_s32(0); 4]; 4];
                for j in 0..4 {
                    let b = 4 * h + j;
                    for r in 0..4 {
                        d[r][j] =
                            block_dot(x.add(b * XI_BLOCK), F::decode(base[r].add(b * F::BYTES)));
                    }
                }
                for r in 0..4 {
                    let (dw, mw) = if F::MIN {
                        f16x8_pairs(base[r], F::BYTES)
                    } else {
                        let dw = f16x8(base[r], F::BYTES);
                        (dw, dw)
                    };
                    let (half, mhalf) = if h == 0 { (dw.0, mw.0) } else { (dw.1, mw.1) };
                    let isum = transpose4(d[r]);
                    for (i, a) in ar.iter().enumerate() {
                        let da = vld1q_f32(a.d.as_ptr().add(g * 8 + 4 * h));
                        let sums = if F::SCALE_BITS == 4 {
                            vcvtq_n_f32_s32::<4>(isum[i])
                        } else {
                            vcvtq_f32_s32(isum[i])
                        };
                        let mut v = vmulq_f32(vmulq_f32(half, da), sums);
                        if F::MIN {
                            let sa = vld1q_f32(a.s.as_ptr().add(g * 8 + 4 * h));
                            v = vaddq_f32(v, vmulq_f32(mhalf, sa));
                        }
                        acc[r][i][h] = vaddq_f32(acc[r][i][h], v);
                    }
                }
            }
        }
    }
    let mut res = [[0f32; 4]; 4];
    for (r, res) in res.iter_mut().enumerate() {
        for (i, a) in ar.iter().enumerate() {
            // SAFETY: the caller's rows; FEAT_DotProd.
            res[i] = unsafe { finish_lanes::<F, Sdot>(acc[r][i], wr[r], *a, groups * 8) };
        }
    }
    res
}

/// The kernel for `ty` on `isa` (an aarch64 ISA this CPU runs).
pub(super) fn rows(ty: WeightType, isa: Isa) -> Option<RowsFn> {
    Some(match isa {
        Isa::Neon => by_format!(ty, entry_neon),
        Isa::NeonDot => by_format!(ty, entry_sdot),
        _ => return None,
    })
}
