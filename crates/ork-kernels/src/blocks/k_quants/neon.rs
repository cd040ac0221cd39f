//! The k-quants on aarch64: the shared driver ([`super::drive`]) compiled with NEON (the
//! plain-Rust decode vectorizes to 128-bit code), and the integer dot in two forms:
//!
//! * **NEON** (every Cortex-A, the RK3576's A72/A53): per 16-value group, `smull` + `smlal2` of
//!   the quants (`u ≤ 63`, exact as signed bytes) with the activations give 8 i16 pair sums,
//!   exact (`|2·63·128| = 16128 < 2¹⁵`); `saddlp` widens them to 4 i32 lanes and `mla` adds them
//!   times the group's scale;
//! * **NEON dotprod** (`sdot`, the RK3588's A76/A55): one `sdot` per group gives the 4 i32
//!   lanes directly, then the same `mla`.
//!
//! The mins term is `smull`/`smlal2` of the 16 `mn_g` with the 16 `bsum_g`.
//!
//! At M > 1 with dotprod, four decoded weight rows meet four activation rows in one tile
//! ([`tile_sdot`]): the activations interleaved by 4-byte chunks once per chunk of rows
//! (`super::interleave`), each weight row's quants the indexed operand of `sdot` by element,
//! so the weights are read in place, as decoded; the activation rows sit in the i32 lanes and
//! the float step runs on four of them at once.
//!
//! At M = 1 each type decodes its super-block in registers and dots it at once ([`fused`]):
//! nibbles by `and`/`ushr`, high bits by shifts and masks, IQ4_XS's table by `tbl`, the scales
//! unpacked into i32 vectors, four group sums folded by `addp` and multiplied by four scales
//! with one `mla` (one `sdot` pair per 32-value sub-block where the scale is shared: Q4_K,
//! Q5_K, IQ4_XS). The same integers as [`Engine::dot`] of the decoded block, mod 2³². All sums are i32
//! and wrap like the scalar twin's, and the float step is the shared [`super::combine`], so
//! both equal the scalar twin bit for bit (property tests in `tests.rs`, run under
//! qemu-aarch64 as cortex-a76 and cortex-a53; never timed on a board). One exception to "the
//! same integers": Q3_K ([`fused::q3`]) dots ggml's signed values and returns `(sumi − summ,
//! 0)`, the difference the float step uses, computed without the stored `bsums`; it equals
//! the twin's for every Q8_K block whose `bsums` are its group sums, as the quantizer writes
//! them (a hand-made block with other `bsums` would give another result on this kernel).

use std::arch::aarch64::*;

use super::{f16_at, Engine, KType, Super, Q8K_BSUMS, Q8K_BYTES, QK_K, TILE_BLOCK, TILE_D};
use crate::blocks::RowsFn;
use crate::tile::neon::{has_dotprod, sdot};

/// The aarch64 rows kernel of `t`, with `sdot` when `dotprod`.
pub(super) fn rows(t: KType, dotprod: bool) -> RowsFn {
    if dotprod {
        by_type!(t, rows_dot)
    } else {
        by_type!(t, rows_neon)
    }
}

isa_rows!(rows_neon, rows_widen, "neon", Neon<false>, true);
isa_rows!(
    rows_dot,
    rows_sdot,
    "neon,dotprod",
    Neon<true>,
    has_dotprod()
);

/// The NEON engine: `smull`/`smlal2`/`saddlp` per group, or `sdot` when `DOT`. Private: only
/// the kernels above use it, `Neon<true>` only inside `rows_sdot` (reached after the `sdot`
/// check).
struct Neon<const DOT: bool>;

impl<const DOT: bool> Engine for Neon<DOT> {
    #[inline(always)]
    fn decode(ty: KType, blk: &[u8], s: &mut Super) {
        if DOT && ty == KType::Q3 {
            return decode_q3_folded(blk, s);
        }
        if ty == KType::Iq4Xs {
            return decode_iq4xs(blk, s);
        }
        super::decode(ty, blk, s);
        if DOT {
            // The forms the tile reads ([`tile_sdot`]): Q2_K's scales folded into its quants,
            // Q6_K's quants signed with no offset term.
            match ty {
                KType::Q2 => fold_q2(s),
                KType::Q6 => to_signed(s, 32),
                _ => {}
            }
        }
    }

    #[inline(always)]
    fn decode_dot(ty: KType, blk: &[u8], a: &[u8], s: &mut Super) -> (i32, i32) {
        assert!(blk.len() >= ty.bytes() && a.len() >= Q8K_BYTES);
        let (b, x) = (blk.as_ptr(), a.as_ptr());
        // SAFETY: whole blocks (asserted); NEON is baseline, and `Neon<true>` runs only where
        // the CPU has FEAT_DotProd (see the type's docs).
        let (sumi, summ) = unsafe {
            match ty {
                KType::Q2 => fused::q2::<DOT>(b, x),
                KType::Q3 => fused::q3::<DOT>(b, x),
                KType::Q4 => fused::k4::<DOT, false>(b, x),
                KType::Q5 => fused::k4::<DOT, true>(b, x),
                KType::Q6 => fused::q6::<DOT>(b, x),
                KType::Iq4Xs => fused::iq4xs::<DOT>(b, x),
            }
        };
        let (d, dmin) = match ty {
            KType::Q2 => (f16_at(&blk[80..]), f16_at(&blk[82..])),
            KType::Q3 => (f16_at(&blk[108..]), 0.0),
            KType::Q4 | KType::Q5 => (f16_at(blk), f16_at(&blk[2..])),
            KType::Q6 => (f16_at(&blk[208..]), 0.0),
            KType::Iq4Xs => (f16_at(blk), 0.0),
        };
        (s.d, s.dmin) = (d, dmin);
        (sumi, summ)
    }

    const TILE: bool = DOT;

    #[inline(always)]
    fn tile(t: KType, s: [&Super; 4], a: [&[u8]; 4], ai: &[u8], acc: &mut [[f32; 4]; 4]) {
        if !DOT {
            return super::tile_by_rows::<Self>(t, s, a, acc);
        }
        assert!(ai.len() >= TILE_BLOCK);
        // SAFETY: `ai` holds a whole tile block (asserted); `Neon<true>` runs only where the
        // CPU has FEAT_DotProd (see the type's docs).
        unsafe {
            match t {
                KType::Q2 => tile_sdot::<true, 1, false>(s, ai.as_ptr(), acc),
                KType::Q3 => tile_sdot::<false, -1, false>(s, ai.as_ptr(), acc),
                KType::Q4 | KType::Q5 => tile_sdot::<true, 0, true>(s, ai.as_ptr(), acc),
                KType::Q6 => tile_sdot::<false, 0, false>(s, ai.as_ptr(), acc),
                KType::Iq4Xs => tile_sdot::<false, 0, true>(s, ai.as_ptr(), acc),
            }
        }
    }

    #[inline(always)]
    fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
        assert!(a.len() >= Q8K_BYTES);
        // SAFETY: `a` holds a whole Q8_K block (asserted); NEON is baseline, and `Neon<true>`
        // runs only where the CPU has FEAT_DotProd (see the type's docs).
        unsafe {
            if DOT {
                dot_sdot(s, a)
            } else {
                dot_widen(s, a)
            }
        }
    }
}

/// A decoded Q6_K super-block (`u = v + o`, `o = 32`, `mn = o·sc`) as ggml's signed values
/// `v = u − o` with no offset term (`mn = 0`): `Σ sc·Σ v·a = Σ sc·Σ u·a − Σ mn·bsum` for every
/// Q8_K block whose `bsums` are its group sums (as the quantizer writes them; the fused M = 1
/// Q3_K kernel relies on the same, see the module docs), so [`Engine::dot`] returns `(sumi −
/// summ, 0)`, which is all the float step of a type without mins reads. `|v| ≤ 32`: exact as
/// signed bytes. (Q3_K's decode does the same in [`decode_q3_folded`].)
#[inline(always)]
fn to_signed(s: &mut Super, o: u8) {
    for u in &mut s.u {
        *u = u.wrapping_sub(o);
    }
    s.mn = [0; 16];
    s.signed = true;
}

/// A decoded Q2_K super-block with each group's scale folded into its quants: `u_g ← sc_g·u_g`,
/// `sc_g ← 1`, so `Σ_g sc_g·Σ u·a` is unchanged (the same integers: every product and sum is
/// exact in i32). The products fit a signed byte: `0 ≤ u ≤ 3`, `0 ≤ sc ≤ 15` give `0..=45`.
/// The tile then needs no `mla` per group ([`tile_sdot`]'s `FOLD`).
#[inline(always)]
fn fold_q2(s: &mut Super) {
    for (g, sc) in s.sc.iter_mut().enumerate() {
        let f = *sc as u8;
        for u in &mut s.u[16 * g..16 * g + 16] {
            *u = u.wrapping_mul(f);
        }
        *sc = 1;
    }
    s.signed = true;
}

/// Q3_K's decode with its offset and scales folded into the quants in the same pass:
/// `u_g ← (v_g)·(−sc_g)`, `v = q − 4` ggml's signed values, `sc_g ← −1`, `mn ← 0`, so
/// `Σ_g sc_g·Σ u·a = Σ_g sc_g·Σ v·a`, which is the twin's `Σ sc·Σ q·a − Σ 4·sc·bsum` whenever
/// the Q8_K block's `bsums` are its group sums ([`to_signed`]). The products fit a signed byte:
/// `−4 ≤ v ≤ 3` against `−31 ≤ −sc ≤ 32` gives `−128..=124` (folding `+sc` would not fit:
/// `−32 · −4 = 128`, and ggml's quantizer gives every Q3_K super-block's largest scale the code
/// `−32`). `super::decode_q3`'s layout: value `128n + 32j + l` is bits `2j..2j+2` of
/// `qs[32n + l]`, high bit `4n + j` of `hmask[l]`. The tile then needs no `mla` per group
/// ([`tile_sdot`]'s `FOLD`).
///
/// In NEON, sixteen values (one group) a vector ([`q3_half`]): `m = cmtst(!hmask, 1 << (4n +
/// j))` is all ones where the high bit is clear, and `sli` of `m` by 2 over `y = qs >> 2j` keeps
/// `y`'s low two bits (`q`'s) under `m`'s ones, which is `v` as a signed byte (`q | 0b1111_1100
/// = q − 4` where the high bit is clear, `q + 4 − 4` where it is set; for `j = 3`, `sri` of
/// `qs` by 6 into `m`, no shift); then `mul` by the group's `−sc`, its lane of the sixteen
/// negated scales ([`q3_neg_scales`]) spread by `dup`, and `st1` of four groups at a time. The
/// same bytes as the plain-Rust form (`super::decode_q3` then the fold; property tests in
/// `tests.rs`).
#[inline(always)]
pub(super) fn decode_q3_folded(b: &[u8], s: &mut Super) {
    assert!(b.len() >= 110);
    // SAFETY: `hmask`, `qs` and the scales are `b[0..108]` (asserted), `s.u` holds 256 bytes;
    // the rest is baseline NEON on registers.
    unsafe {
        let p = b.as_ptr();
        let f = q3_neg_scales(p.add(96));
        let nh = [0, 16].map(|o| opaque(vmvnq_u8(vld1q_u8(p.add(o)))));
        let one = opaque(vdupq_n_u8(1));
        let u = s.u.as_mut_ptr().cast::<i8>();
        q3_half::<0>(p, nh, one, f, u);
        q3_half::<1>(p, nh, one, f, u);
    }
    s.sc = [-1; 16];
    s.mn = [0; 16];
    s.signed = true;
    s.d = f16_at(&b[108..]);
    s.dmin = 0.0;
}

/// Values `128N ..= 128N + 127` of [`decode_q3_folded`] from `qs[32N .. 32N + 32]` at `p + 32`
/// and the negated high bits `nh` (`one` is the bit 1, opaque): group `8N + 2j + h` is the 16
/// values `128N + 32j + 16h ..`, from `qs[32N + 16h ..]` and bit `4N + j` of `nh[h]`.
///
/// # Safety
/// `p` points at a whole Q3_K block, `u` at 256 writable bytes.
#[inline(always)]
unsafe fn q3_half<const N: usize>(
    p: *const u8,
    nh: [uint8x16_t; 2],
    one: uint8x16_t,
    f: int8x16_t,
    u: *mut i8,
) {
    // SAFETY: `qs[32N .. 32N + 32]` and `u[128N .. 128N + 128]` lie in the block and the
    // quants (the caller's); the rest is baseline NEON on registers.
    unsafe {
        let q = [0, 1].map(|h| vld1q_u8(p.add(32 + 32 * N + 16 * h)));
        let group = |j: usize, h: usize| {
            let k = 4 * N + j;
            let bit = if k == 0 { one } else { vdupq_n_u8(1 << k) };
            let m = vtstq_u8(nh[h], bit);
            let v = match j {
                0 => vsliq_n_u8::<2>(q[h], m),
                1 => vsliq_n_u8::<2>(vshrq_n_u8::<2>(q[h]), m),
                2 => vsliq_n_u8::<2>(vshrq_n_u8::<4>(q[h]), m),
                _ => vsriq_n_u8::<6>(m, q[h]),
            };
            // Lane `8N + 2j + h` of `f` in every lane (LLVM emits `dup` by element).
            let sc = vqtbl1q_s8(f, vdupq_n_u8((8 * N + 2 * j + h) as u8));
            vmulq_s8(vreinterpretq_s8_u8(v), sc)
        };
        let (a, b, c, d) = (group(0, 0), group(0, 1), group(1, 0), group(1, 1));
        vst1q_s8_x4(u.add(128 * N), int8x16x4_t(a, b, c, d));
        let (a, b, c, d) = (group(2, 0), group(2, 1), group(3, 0), group(3, 1));
        vst1q_s8_x4(u.add(128 * N + 64), int8x16x4_t(a, b, c, d));
    }
}

/// `x`, through an empty `asm!` block: LLVM cannot see what it holds. [`decode_q3_folded`]
/// passes `!hmask` and the bit `1` through it; LLVM would otherwise turn each `cmtst` of
/// `!hmask` into an `and` and a `cmeq` of `hmask`, and the `cmtst` with 1 into an `and` and a
/// `neg` (16 and 2 more instructions a super-block).
#[inline(always)]
fn opaque(mut x: uint8x16_t) -> uint8x16_t {
    // SAFETY: an empty template: no instruction, no memory, no flags.
    unsafe {
        std::arch::asm!(
            "/* {x:v} */",
            x = inout(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    x
}

/// The sixteen negated scales `−sc_g = 32 − w_g` of a Q3_K super-block as signed bytes, `w_g`
/// its six-bit codes as `super::q3_words` unpacks them from the 12 bytes at `sb`: low nibbles
/// from bytes 0–7 (`g < 8`) and their high nibbles (`g ≥ 8`), two high bits from byte
/// `8 + g mod 4` at bit `2·(g div 4)`, here the four bytes replicated and shifted per lane.
///
/// # Safety
/// `sb` points at 12 readable bytes.
#[inline(always)]
unsafe fn q3_neg_scales(sb: *const u8) -> int8x16_t {
    /// Per lane `g`, the left shift that puts bits `2·(g div 4)..+2` of the high byte at 4–5.
    const HIGH_SHIFT: [i8; 16] = [4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0, -2, -2, -2, -2];
    // SAFETY: bytes 0–7 and 8–11 of `sb` (the caller's); the rest is register-only NEON.
    unsafe {
        let nib = vld1_u8(sb);
        let lo = vcombine_u8(vand_u8(nib, vdup_n_u8(0xF)), vshr_n_u8::<4>(nib));
        let hb = vreinterpretq_u8_u32(vdupq_n_u32(sb.add(8).cast::<u32>().read_unaligned()));
        let hi = vshlq_u8(hb, vld1q_s8(HIGH_SHIFT.as_ptr()));
        let w = vbslq_u8(vdupq_n_u8(0x30), hi, lo);
        vreinterpretq_s8_u8(vsubq_u8(vdupq_n_u8(32), w))
    }
}

/// `super::decode_iq4xs` with the table lookup as `tbl` (LLVM keeps the plain one scalar, a
/// byte at a time: 519 cycles a super-block on the A76 model against this one's, docs/kernels.md):
/// sub-block `j`'s low nibbles of `qs[16j..16j + 16]`, then their high nibbles, each an index
/// into [`IQ4_VALUES`]. The same bytes.
#[inline(always)]
fn decode_iq4xs(b: &[u8], s: &mut Super) {
    assert!(b.len() >= 136);
    // SAFETY: `qs` is `b[8..136]` (asserted), `s.u` holds 256 bytes; `tbl` and the rest are
    // baseline NEON.
    unsafe {
        let table = vld1q_s8(super::IQ4_VALUES.as_ptr());
        let (qs, u) = (b.as_ptr().add(8), s.u.as_mut_ptr().cast::<i8>());
        for j in 0..8 {
            let q = vld1q_u8(qs.add(16 * j));
            let lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0xF)));
            let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(q));
            vst1q_s8(u.add(32 * j), lo);
            vst1q_s8(u.add(32 * j + 16), hi);
        }
    }
    super::iq4xs_scales(b, s);
}

/// The baseline dot.
///
/// # Safety
/// `a` must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn dot_widen(s: &Super, a: &[u8]) -> (i32, i32) {
    // SAFETY: forwarded from the caller.
    unsafe { dot::<false>(s, a) }
}

/// The `sdot` dot, in a function compiled with FEAT_DotProd wherever it ends up (the assembler
/// accepts `sdot` only there).
///
/// # Safety
/// `a` must hold at least [`Q8K_BYTES`] bytes; the CPU must have FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn dot_sdot(s: &Super, a: &[u8]) -> (i32, i32) {
    // SAFETY: forwarded from the caller.
    unsafe { dot::<true>(s, a) }
}

/// # Safety
/// `a` must hold at least [`Q8K_BYTES`] bytes; with `DOT` the CPU must have FEAT_DotProd and
/// the caller must be compiled with it.
#[inline(always)]
unsafe fn dot<const DOT: bool>(s: &Super, a: &[u8]) -> (i32, i32) {
    let q = a.as_ptr().wrapping_add(4).cast::<i8>();
    // SAFETY: register-only NEON (baseline).
    let mut acc = unsafe { vdupq_n_s32(0) };
    for g in 0..16 {
        // SAFETY: `s.u` and the block's 256 quants each hold 16 groups of 16 bytes; `sdot` only
        // when the caller guarantees FEAT_DotProd.
        unsafe {
            let u = vreinterpretq_s8_u8(vld1q_u8(s.u.as_ptr().add(16 * g)));
            let x = vld1q_s8(q.add(16 * g));
            let t = if DOT {
                sdot(vdupq_n_s32(0), u, x)
            } else {
                vpaddlq_s16(vmlal_high_s8(
                    vmull_s8(vget_low_s8(u), vget_low_s8(x)),
                    u,
                    x,
                ))
            };
            acc = vmlaq_n_s32(acc, t, i32::from(s.sc[g]));
        }
    }
    // SAFETY: `s.mn` has 16 i16; the block's bsums are its last 32 bytes.
    let mins = unsafe {
        let b = a.as_ptr().add(Q8K_BSUMS).cast::<i16>();
        let (m0, m1) = (vld1q_s16(s.mn.as_ptr()), vld1q_s16(s.mn.as_ptr().add(8)));
        let (b0, b1) = (vld1q_s16(b), vld1q_s16(b.add(8)));
        let p = vmlal_high_s16(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), m0, b0);
        let p = vmlal_s16(p, vget_low_s16(m1), vget_low_s16(b1));
        vaddvq_s32(vmlal_high_s16(p, m1, b1))
    };
    // SAFETY: register-only NEON arithmetic.
    (unsafe { vaddvq_s32(acc) }, mins)
}

/// One weight row's group in [`folded_group`]'s `asm!`: four `sdot` by element of the
/// interleaved activations `x0..x3` with the row's folded quants `w` onto `d`.
macro_rules! folded_row {
    ($d:ident, $w:ident) => {
        sdot4!($d, $w, x0, x1, x2, x3)
    };
}

/// Four `sdot` by element onto `d`: `xk` with element `k` of `w`, k = 0..4.
macro_rules! sdot4 {
    ($d:ident, $w:ident, $x0:ident, $x1:ident, $x2:ident, $x3:ident) => {
        concat!(
            sdot1!($d, $x0, $w, 0),
            sdot1!($d, $x1, $w, 1),
            sdot1!($d, $x2, $w, 2),
            sdot1!($d, $x3, $w, 3),
        )
    };
}

/// `sdot d.4s, x.16b, w.4b[k]` as an `asm!` template line.
macro_rules! sdot1 {
    ($d:ident, $x:ident, $w:ident, $k:literal) => {
        concat!(
            "sdot {",
            stringify!($d),
            ":v}.4s, {",
            stringify!($x),
            ":v}.16b, {",
            stringify!($w),
            ":v}.4b[",
            $k,
            "]\n"
        )
    };
}

/// One weight row's sub-block in [`paired_sub`]'s `asm!`: eight `sdot` by element of the
/// interleaved activations `x0..x7` with the row's quants `w` (group `2J`) and `v` (group
/// `2J + 1`) onto the running dot `d`, then `a += d · s[l]`.
macro_rules! paired_row {
    ($a:ident, $d:ident, $w:ident, $v:ident, $s:ident) => {
        concat!(
            sdot4!($d, $w, x0, x1, x2, x3),
            sdot4!($d, $v, x4, x5, x6, x7),
            mla_lane!($a, $d, $s),
        )
    };
}

/// `mla a.4s, d.4s, s.s[l]` (`l` the `asm!` block's lane operand) as a template line.
macro_rules! mla_lane {
    ($a:ident, $d:ident, $s:ident) => {
        concat!(
            "mla {",
            stringify!($a),
            ":v}.4s, {",
            stringify!($d),
            ":v}.4s, {",
            stringify!($s),
            ":v}.s[{l}]"
        )
    };
}

/// One weight row's group in [`running_group`]'s `asm!`: four `sdot` by element of the
/// interleaved activations `x0..x3` with the row's quants `w` onto the running dot `d`, then
/// `a += d · s[l]` (`l` the `asm!` block's lane operand).
macro_rules! running_row {
    ($a:ident, $d:ident, $w:ident, $s:ident) => {
        concat!(sdot4!($d, $w, x0, x1, x2, x3), mla_lane!($a, $d, $s))
    };
}

/// The M > 1 tile ([`Engine::tile`]): four decoded weight rows against four activation rows
/// interleaved by 4-byte chunks (`super::interleave`), the activation rows in the four i32
/// lanes. Per 16-value group and weight row, four `sdot` by element: the weight row's 16 quants
/// are the indexed operand (element `k` = quants `4k..4k + 4`, the row's own layout: no
/// weight is moved), each interleaved vector `k` holds the four activation rows' quants
/// `4k..4k + 4` of the group, so lane `i` sums activation row `i`'s group dot.
///
/// The group dots are never zeroed: each weight row keeps two running dots, one over its even
/// groups and one over its odd groups, and after group `g` its sum takes `mla` of the running
/// dot by `sc_g − sc_{g+2}` (`sc_16 = sc_17 = 0`), which telescopes to `Σ_g sc_g · (group g's
/// dot)`. Two chains per row keep eight `sdot` chains in flight.
///
/// With `MINS` (Q2_K, Q4_K, Q5_K) the mins term is `smlal` by element of the four rows' group
/// sums (side by side in the block) with the weight row's 16 `mn`. Without (Q3_K and Q6_K as
/// [`Neon::decode`] leaves them, signed with `mn = 0`; IQ4_XS) there is none: `summ` is 0.
///
/// The same integers, mod 2³², as [`Engine::dot`] of each pair (wrapping i32 lanes, as the
/// scalar twin's); then `super::step` on the four activation rows' lanes at once, in its order
/// (no fused multiply-add), so each lane is the scalar twin's float.
///
/// # Safety
/// `ai` holds [`TILE_BLOCK`] readable bytes; the CPU has FEAT_DotProd; without `MINS`, every
/// `mn` is 0.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn tile_sdot<const MINS: bool, const FOLD: i16, const PAIRED: bool>(
    s: [&Super; 4],
    ai: *const u8,
    acc: &mut [[f32; 4]; 4],
) {
    debug_assert!(MINS || s.iter().all(|s| s.mn == [0; 16]));
    debug_assert!(FOLD == 0 || s.iter().all(|s| s.sc == [FOLD; 16]));
    debug_assert!(!PAIRED || s.iter().all(|s| (0..16).all(|g| s.sc[g] == s.sc[g ^ 1])));
    // SAFETY: the interleaved quants are `ai`'s first 1024 bytes, the group sums the next 128
    // and the rows' `d` at `TILE_D` (the caller's); each `Super` holds 256 quants, 16 scales and
    // 16 `mn`; `sdot` per the caller's guarantee.
    unsafe {
        let x = ai.cast::<i8>();
        let sumi = if FOLD != 0 {
            folded_sums::<FOLD>(s, x)
        } else if PAIRED {
            paired_sums(s, x)
        } else {
            running_sums(s, x)
        };
        let da = vreinterpretq_f32_u8(vld1q_u8(ai.add(TILE_D)));
        let summ = if MINS {
            mins_sums::<PAIRED>(s, ai.add(4 * QK_K).cast::<i16>())
        } else {
            zeros()
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = vld1q_f32(acc.as_ptr());
            let dd = vmulq_n_f32(da, s[r].d);
            let hi = vaddq_f32(a, vmulq_f32(dd, vcvtq_f32_s32(sumi[r])));
            let v = if MINS {
                let dm = vmulq_n_f32(da, s[r].dmin);
                vsubq_f32(hi, vmulq_f32(dm, vcvtq_f32_s32(summ[r])))
            } else {
                hi
            };
            vst1q_f32(acc.as_mut_ptr(), v);
        }
    }
}

/// Each weight row's `Σ_g sc_g · (group g's dots)` in [`tile_sdot`] with `FOLD` (the scales in
/// the quants): two running dots a row, added (negated for Q3_K) at the end. Written out, not a
/// loop (`bl` to a loop-free function is what scripts/kernel_cycles.py inlines into its
/// caller's pass; a loop here would be a pass of its own).
///
/// # Safety
/// As [`tile_sdot`].
#[inline(always)]
unsafe fn folded_sums<const FOLD: i16>(s: [&Super; 4], x: *const i8) -> [int32x4_t; 4] {
    let mut run = [zeros(); 2];
    let [even, odd] = &mut run;
    // SAFETY: the caller's.
    unsafe {
        folded_group::<0>(even, x, s);
        folded_group::<1>(odd, x, s);
        folded_group::<2>(even, x, s);
        folded_group::<3>(odd, x, s);
        folded_group::<4>(even, x, s);
        folded_group::<5>(odd, x, s);
        folded_group::<6>(even, x, s);
        folded_group::<7>(odd, x, s);
        folded_group::<8>(even, x, s);
        folded_group::<9>(odd, x, s);
        folded_group::<10>(even, x, s);
        folded_group::<11>(odd, x, s);
        folded_group::<12>(even, x, s);
        folded_group::<13>(odd, x, s);
        folded_group::<14>(even, x, s);
        folded_group::<15>(odd, x, s);
    }
    std::array::from_fn(|r| {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let both = vaddq_s32(run[0][r], run[1][r]);
            if FOLD < 0 {
                vnegq_s32(both)
            } else {
                both
            }
        }
    })
}

/// Each weight row's `Σ_g sc_g · (group g's dots)` in [`tile_sdot`], one scale per group: the
/// running dots of [`running_group`], `mla` by `sc_g − sc_{g+2}` after each group.
///
/// # Safety
/// As [`tile_sdot`].
#[inline(always)]
unsafe fn running_sums(s: [&Super; 4], x: *const i8) -> [int32x4_t; 4] {
    let steps: [[i16; 16]; 4] = std::array::from_fn(|r| {
        let mut st = [0i16; 16];
        // SAFETY: 16 i16 each side; register-only NEON otherwise.
        unsafe {
            let sc = s[r].sc.as_ptr();
            let (lo, hi) = (vld1q_s16(sc), vld1q_s16(sc.add(8)));
            let lo = vsubq_s16(lo, vextq_s16::<2>(lo, hi));
            let hi = vsubq_s16(hi, vextq_s16::<2>(hi, vdupq_n_s16(0)));
            vst1q_s16(st.as_mut_ptr(), lo);
            vst1q_s16(st.as_mut_ptr().add(8), hi);
        }
        st
    });
    let mut sumi = zeros();
    let mut run = [zeros(); 2];
    // SAFETY: the caller's.
    unsafe {
        running_quad::<0>(&mut sumi, &mut run, x, s, &steps);
        running_quad::<1>(&mut sumi, &mut run, x, s, &steps);
        running_quad::<2>(&mut sumi, &mut run, x, s, &steps);
        running_quad::<3>(&mut sumi, &mut run, x, s, &steps);
    }
    sumi
}

/// [`running_sums`] for the types whose two groups of a 32-value sub-block share their scale
/// (Q4_K, Q5_K, IQ4_XS): eight `sdot` per sub-block and row onto the running dot, then one
/// `mla` by `scs_j − scs_{j+2}` (`scs_j` sub-block `j`'s scale, `scs_8 = scs_9 = 0`): half the
/// `mla`s, the same integers.
///
/// # Safety
/// As [`tile_sdot`].
#[inline(always)]
unsafe fn paired_sums(s: [&Super; 4], x: *const i8) -> [int32x4_t; 4] {
    // steps[r][h]: sub-blocks 4h..4h + 4 of row r.
    let steps: [[int32x4_t; 2]; 4] = std::array::from_fn(|r| {
        // SAFETY: 16 i16; register-only NEON otherwise.
        unsafe {
            let sc = s[r].sc.as_ptr();
            let subs = vuzp1q_s16(vld1q_s16(sc), vld1q_s16(sc.add(8)));
            let d = vsubq_s16(subs, vextq_s16::<2>(subs, vdupq_n_s16(0)));
            [vmovl_s16(vget_low_s16(d)), vmovl_high_s16(d)]
        }
    });
    let mut sumi = zeros();
    let mut run = [zeros(); 2];
    let [even, odd] = &mut run;
    let sc = |h: usize| -> [int32x4_t; 4] { std::array::from_fn(|r| steps[r][h]) };
    let (lo, hi) = (sc(0), sc(1));
    // SAFETY: the caller's.
    unsafe {
        paired_sub::<0, 0>(&mut sumi, even, x, s, &lo);
        paired_sub::<1, 1>(&mut sumi, odd, x, s, &lo);
        paired_sub::<2, 2>(&mut sumi, even, x, s, &lo);
        paired_sub::<3, 3>(&mut sumi, odd, x, s, &lo);
        paired_sub::<4, 0>(&mut sumi, even, x, s, &hi);
        paired_sub::<5, 1>(&mut sumi, odd, x, s, &hi);
        paired_sub::<6, 2>(&mut sumi, even, x, s, &hi);
        paired_sub::<7, 3>(&mut sumi, odd, x, s, &hi);
    }
    sumi
}

/// The mins term of [`tile_sdot`]: `summ[r] = Σ_g mn_g · bsum_g` of weight row `r` against the
/// four activation rows' group sums (`b`: i16 `4g + i` is row `i`'s `bsum_g`). `PAIRED`: the two
/// groups of a sub-block share `mn`, so their sums are added first (|sum| ≤ 2·16·128, an i16)
/// and multiplied once.
///
/// # Safety
/// `b` holds 64 readable i16.
#[inline(always)]
unsafe fn mins_sums<const PAIRED: bool>(s: [&Super; 4], b: *const i16) -> [int32x4_t; 4] {
    let mut summ = zeros();
    // SAFETY: the caller's; 16 i16 of `mn` per row.
    unsafe {
        for h in 0..2 {
            let mn: [int16x8_t; 4] =
                std::array::from_fn(|r| vld1q_s16(s[r].mn.as_ptr().add(8 * h)));
            let b = b.add(32 * h);
            let at = |g: usize| vld1_s16(b.add(4 * g));
            if PAIRED {
                mins::<0>(&mut summ, vadd_s16(at(0), at(1)), &mn);
                mins::<2>(&mut summ, vadd_s16(at(2), at(3)), &mn);
                mins::<4>(&mut summ, vadd_s16(at(4), at(5)), &mn);
                mins::<6>(&mut summ, vadd_s16(at(6), at(7)), &mn);
            } else {
                mins::<0>(&mut summ, at(0), &mn);
                mins::<1>(&mut summ, at(1), &mn);
                mins::<2>(&mut summ, at(2), &mn);
                mins::<3>(&mut summ, at(3), &mn);
                mins::<4>(&mut summ, at(4), &mn);
                mins::<5>(&mut summ, at(5), &mn);
                mins::<6>(&mut summ, at(6), &mn);
                mins::<7>(&mut summ, at(7), &mn);
            }
        }
    }
    summ
}

/// Four zero i32 vectors.
#[inline(always)]
fn zeros() -> [int32x4_t; 4] {
    // SAFETY: register-only NEON (baseline on aarch64).
    unsafe { [vdupq_n_s32(0); 4] }
}

/// Sub-block `J` (groups `2J`, `2J + 1`) of the four weight rows in [`paired_sums`]: `run[r] +=`
/// its eight `sdot` by element, then `sumi[r] += run[r] · sc[r][L]`, `L = J % 4`. The loads are
/// in the `asm!` block, as in [`folded_group`].
///
/// # Safety
/// As [`tile_sdot`], `J < 8`, `L == J % 4`.
#[inline(always)]
unsafe fn paired_sub<const J: usize, const L: usize>(
    sumi: &mut [int32x4_t; 4],
    run: &mut [int32x4_t; 4],
    x: *const i8,
    s: [&Super; 4],
    sc: &[int32x4_t; 4],
) {
    // SAFETY: the sub-block's 128 interleaved bytes at `x + 128J` and each row's 32 quants at
    // `u + 32J` are readable (the caller's); vector registers otherwise; FEAT_DotProd per the
    // caller.
    unsafe {
        std::arch::asm!(
            "ldr {x0:q}, [{xp}, #{xo}]",
            "ldr {x1:q}, [{xp}, #{xo} + 16]",
            "ldr {x2:q}, [{xp}, #{xo} + 32]",
            "ldr {x3:q}, [{xp}, #{xo} + 48]",
            "ldr {x4:q}, [{xp}, #{xo} + 64]",
            "ldr {x5:q}, [{xp}, #{xo} + 80]",
            "ldr {x6:q}, [{xp}, #{xo} + 96]",
            "ldr {x7:q}, [{xp}, #{xo} + 112]",
            "ldr {w0:q}, [{p0}, #{wo}]",
            "ldr {v0:q}, [{p0}, #{wo} + 16]",
            "ldr {w1:q}, [{p1}, #{wo}]",
            "ldr {v1:q}, [{p1}, #{wo} + 16]",
            "ldr {w2:q}, [{p2}, #{wo}]",
            "ldr {v2:q}, [{p2}, #{wo} + 16]",
            "ldr {w3:q}, [{p3}, #{wo}]",
            "ldr {v3:q}, [{p3}, #{wo} + 16]",
            paired_row!(a0, d0, w0, v0, s0),
            paired_row!(a1, d1, w1, v1, s1),
            paired_row!(a2, d2, w2, v2, s2),
            paired_row!(a3, d3, w3, v3, s3),
            xp = in(reg) x,
            p0 = in(reg) s[0].u.as_ptr(),
            p1 = in(reg) s[1].u.as_ptr(),
            p2 = in(reg) s[2].u.as_ptr(),
            p3 = in(reg) s[3].u.as_ptr(),
            xo = const 128 * J,
            wo = const 32 * J,
            l = const L,
            a0 = inout(vreg) sumi[0],
            a1 = inout(vreg) sumi[1],
            a2 = inout(vreg) sumi[2],
            a3 = inout(vreg) sumi[3],
            d0 = inout(vreg) run[0],
            d1 = inout(vreg) run[1],
            d2 = inout(vreg) run[2],
            d3 = inout(vreg) run[3],
            x0 = out(vreg) _,
            x1 = out(vreg) _,
            x2 = out(vreg) _,
            x3 = out(vreg) _,
            x4 = out(vreg) _,
            x5 = out(vreg) _,
            x6 = out(vreg) _,
            x7 = out(vreg) _,
            w0 = out(vreg) _,
            w1 = out(vreg) _,
            w2 = out(vreg) _,
            w3 = out(vreg) _,
            v0 = out(vreg) _,
            v1 = out(vreg) _,
            v2 = out(vreg) _,
            v3 = out(vreg) _,
            s0 = in(vreg) sc[0],
            s1 = in(vreg) sc[1],
            s2 = in(vreg) sc[2],
            s3 = in(vreg) sc[3],
            options(pure, readonly, nostack, preserves_flags)
        )
    }
}

/// Group `G` of the four weight rows in [`tile_sdot`] with `FOLD` (the scales already in the
/// quants: [`fold_q2`], [`decode_q3_folded`]): `run[r] += (group dots of row r with the four
/// activation rows)`, four `sdot` by element per row, no `mla`. The loads are in the `asm!`
/// block as single `ldr`s with constant offsets (LLVM pairs them into `ldp`, three µops to two
/// `ldr`s' two in LLVM's Cortex-A76 model, where dispatch is what binds this loop, and computes
/// each address with an `add`).
///
/// # Safety
/// As [`tile_sdot`], `G < 16`.
#[inline(always)]
unsafe fn folded_group<const G: usize>(run: &mut [int32x4_t; 4], x: *const i8, s: [&Super; 4]) {
    // SAFETY: the group's 64 interleaved bytes at `x + 64G` and each row's 16 quants at
    // `u + 16G` are readable (the caller's); vector registers otherwise; FEAT_DotProd per the
    // caller.
    unsafe {
        std::arch::asm!(
            "ldr {x0:q}, [{xp}, #{xo}]",
            "ldr {x1:q}, [{xp}, #{xo} + 16]",
            "ldr {x2:q}, [{xp}, #{xo} + 32]",
            "ldr {x3:q}, [{xp}, #{xo} + 48]",
            "ldr {w0:q}, [{p0}, #{wo}]",
            "ldr {w1:q}, [{p1}, #{wo}]",
            "ldr {w2:q}, [{p2}, #{wo}]",
            "ldr {w3:q}, [{p3}, #{wo}]",
            folded_row!(d0, w0),
            folded_row!(d1, w1),
            folded_row!(d2, w2),
            folded_row!(d3, w3),
            xp = in(reg) x,
            p0 = in(reg) s[0].u.as_ptr(),
            p1 = in(reg) s[1].u.as_ptr(),
            p2 = in(reg) s[2].u.as_ptr(),
            p3 = in(reg) s[3].u.as_ptr(),
            xo = const 64 * G,
            wo = const 16 * G,
            d0 = inout(vreg) run[0],
            d1 = inout(vreg) run[1],
            d2 = inout(vreg) run[2],
            d3 = inout(vreg) run[3],
            x0 = out(vreg) _,
            x1 = out(vreg) _,
            x2 = out(vreg) _,
            x3 = out(vreg) _,
            w0 = out(vreg) _,
            w1 = out(vreg) _,
            w2 = out(vreg) _,
            w3 = out(vreg) _,
            options(pure, readonly, nostack, preserves_flags)
        )
    }
}

/// Groups `4Q..4Q + 4` of the four weight rows in [`tile_sdot`]: even groups on
/// `run[0]`, odd ones on `run[1]`.
///
/// # Safety
/// As [`tile_sdot`], `Q < 4`.
#[inline(always)]
unsafe fn running_quad<const Q: usize>(
    sumi: &mut [int32x4_t; 4],
    run: &mut [[int32x4_t; 4]; 2],
    x: *const i8,
    s: [&Super; 4],
    steps: &[[i16; 16]; 4],
) {
    // SAFETY: each row's steps `4Q..4Q + 4`; the rest as the caller's.
    unsafe {
        let sc: [int32x4_t; 4] =
            std::array::from_fn(|r| vmovl_s16(vld1_s16(steps[r].as_ptr().add(4 * Q))));
        let [even, odd] = run;
        running_group::<Q, 0>(sumi, even, x, s, &sc);
        running_group::<Q, 1>(sumi, odd, x, s, &sc);
        running_group::<Q, 2>(sumi, even, x, s, &sc);
        running_group::<Q, 3>(sumi, odd, x, s, &sc);
    }
}

/// Group `g = 4Q + L` of the four weight rows in [`tile_sdot`]: `run[r] += (group dots of row
/// r with the four activation rows)`, then `sumi[r] += run[r] · sc[r][L]`. The loads are in the
/// `asm!` block, as in [`folded_group`].
///
/// # Safety
/// As [`tile_sdot`], `Q < 4`, `L < 4`.
#[inline(always)]
unsafe fn running_group<const Q: usize, const L: usize>(
    sumi: &mut [int32x4_t; 4],
    run: &mut [int32x4_t; 4],
    x: *const i8,
    s: [&Super; 4],
    sc: &[int32x4_t; 4],
) {
    // SAFETY: the group's 64 interleaved bytes at `x + 64g` and each row's 16 quants at
    // `u + 16g` are readable (the caller's); vector registers otherwise; FEAT_DotProd per the
    // caller.
    unsafe {
        std::arch::asm!(
            "ldr {x0:q}, [{xp}, #{xo}]",
            "ldr {x1:q}, [{xp}, #{xo} + 16]",
            "ldr {x2:q}, [{xp}, #{xo} + 32]",
            "ldr {x3:q}, [{xp}, #{xo} + 48]",
            "ldr {w0:q}, [{p0}, #{wo}]",
            "ldr {w1:q}, [{p1}, #{wo}]",
            "ldr {w2:q}, [{p2}, #{wo}]",
            "ldr {w3:q}, [{p3}, #{wo}]",
            running_row!(a0, d0, w0, s0),
            running_row!(a1, d1, w1, s1),
            running_row!(a2, d2, w2, s2),
            running_row!(a3, d3, w3, s3),
            xp = in(reg) x,
            p0 = in(reg) s[0].u.as_ptr(),
            p1 = in(reg) s[1].u.as_ptr(),
            p2 = in(reg) s[2].u.as_ptr(),
            p3 = in(reg) s[3].u.as_ptr(),
            xo = const 64 * (4 * Q + L),
            wo = const 16 * (4 * Q + L),
            l = const L,
            a0 = inout(vreg) sumi[0],
            a1 = inout(vreg) sumi[1],
            a2 = inout(vreg) sumi[2],
            a3 = inout(vreg) sumi[3],
            d0 = inout(vreg) run[0],
            d1 = inout(vreg) run[1],
            d2 = inout(vreg) run[2],
            d3 = inout(vreg) run[3],
            x0 = out(vreg) _,
            x1 = out(vreg) _,
            x2 = out(vreg) _,
            x3 = out(vreg) _,
            w0 = out(vreg) _,
            w1 = out(vreg) _,
            w2 = out(vreg) _,
            w3 = out(vreg) _,
            s0 = in(vreg) sc[0],
            s1 = in(vreg) sc[1],
            s2 = in(vreg) sc[2],
            s3 = in(vreg) sc[3],
            options(pure, readonly, nostack, preserves_flags)
        )
    }
}

/// `summ[r] += b · mn[r][L]` (widened, wrapping), `b` the four activation rows' sums of one
/// group.
#[inline(always)]
fn mins<const L: i32>(summ: &mut [int32x4_t; 4], b: int16x4_t, mn: &[int16x8_t; 4]) {
    for (acc, mn) in summ.iter_mut().zip(mn) {
        // SAFETY: register-only NEON (baseline).
        *acc = unsafe { vmlal_laneq_s16::<L>(*acc, b, *mn) };
    }
}

/// The M = 1 kernels: one super-block decoded in registers and dotted with one Q8_K block,
/// returning `(sumi, summ)` as [`Engine::dot`] of the decoded block would (module docs).
/// Block layouts as in `super::super` (`decode_q2` …), which document them.
mod fused {
    use super::super::{k4_words, IQ4_VALUES, Q8K_BSUMS};
    use crate::tile::neon::sdot;
    use std::arch::aarch64::*;

    /// Four i32 lanes whose sum is the dot of the 16 bytes `u` with the 16 int8 `x` (exact:
    /// `|2·127·128| < 2¹⁵` in the widening form).
    ///
    /// # Safety
    /// With `DOT`, FEAT_DotProd and a caller compiled with it.
    #[inline(always)]
    unsafe fn gdot<const DOT: bool>(acc: int32x4_t, u: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: register-only; `sdot` per the caller's guarantee.
        unsafe {
            if DOT {
                sdot(acc, u, x)
            } else {
                let p = vmlal_high_s8(vmull_s8(vget_low_s8(u), vget_low_s8(x)), u, x);
                vpadalq_s16(acc, p)
            }
        }
    }

    /// A group's dot: 16 quants at `u` against the 16 activations at `x`.
    ///
    /// # Safety
    /// As [`gdot`]; 16 readable bytes at `x`.
    #[inline(always)]
    unsafe fn g1<const DOT: bool>(u: uint8x16_t, x: *const i8) -> int32x4_t {
        // SAFETY: forwarded.
        unsafe { gdot::<DOT>(vdupq_n_s32(0), vreinterpretq_s8_u8(u), vld1q_s8(x)) }
    }

    /// A 32-value sub-block's dot: `u0`, `u1` against the 32 activations at `x`.
    ///
    /// # Safety
    /// As [`gdot`]; 32 readable bytes at `x`.
    #[inline(always)]
    unsafe fn g2<const DOT: bool>(u0: int8x16_t, u1: int8x16_t, x: *const i8) -> int32x4_t {
        // SAFETY: forwarded.
        unsafe {
            let p = gdot::<DOT>(vdupq_n_s32(0), u0, vld1q_s8(x));
            gdot::<DOT>(p, u1, vld1q_s8(x.add(16)))
        }
    }

    /// `acc + [Σ p0, Σ p1, Σ p2, Σ p3] · sc` (wrapping i32 lanes).
    #[inline(always)]
    fn mla4(acc: int32x4_t, p: [int32x4_t; 4], sc: int32x4_t) -> int32x4_t {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let s = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
            vmlaq_s32(acc, s, sc)
        }
    }

    /// Sixteen signed byte scales as four i32 vectors.
    #[inline(always)]
    fn widen16(sc: int8x16_t) -> [int32x4_t; 4] {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let (lo, hi) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
            [
                vmovl_s16(vget_low_s16(lo)),
                vmovl_high_s16(lo),
                vmovl_s16(vget_low_s16(hi)),
                vmovl_high_s16(hi),
            ]
        }
    }

    /// `Σ_g sc_g · bsum_g` over the 16 groups (wrapping i32), `sc` sixteen signed bytes.
    ///
    /// # Safety
    /// `a` is a Q8_K block.
    #[inline(always)]
    unsafe fn bsum16(sc: int8x16_t, a: *const u8) -> i32 {
        // SAFETY: the block's bsums are its last 32 bytes; NEON baseline.
        unsafe {
            let b = a.add(Q8K_BSUMS).cast::<i16>();
            let (b0, b1) = (vld1q_s16(b), vld1q_s16(b.add(8)));
            let (s0, s1) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
            let p = vmlal_high_s16(vmull_s16(vget_low_s16(s0), vget_low_s16(b0)), s0, b0);
            let p = vmlal_s16(p, vget_low_s16(s1), vget_low_s16(b1));
            vaddvq_s32(vmlal_high_s16(p, s1, b1))
        }
    }

    /// `Σ_j m_j · (bsum_2j + bsum_2j+1)` over the 8 sub-blocks (wrapping i32), `m` eight
    /// unsigned bytes (little-endian in a u64).
    ///
    /// # Safety
    /// `a` is a Q8_K block.
    #[inline(always)]
    unsafe fn bsum8(m: u64, a: *const u8) -> i32 {
        // SAFETY: the block's bsums are its last 32 bytes; NEON baseline.
        unsafe {
            let b = a.add(Q8K_BSUMS).cast::<i16>();
            let (p0, p1) = (vpaddlq_s16(vld1q_s16(b)), vpaddlq_s16(vld1q_s16(b.add(8))));
            let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m)));
            let v = vmulq_s32(vmovl_s16(vget_low_s16(m)), p0);
            vaddvq_s32(vmlaq_s32(v, vmovl_high_s16(m), p1))
        }
    }

    /// Eight sub-block scales (bytes of `sc`, signed) as two i32 vectors.
    #[inline(always)]
    fn widen8(sc: u64) -> [int32x4_t; 2] {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let v = vmovl_s8(vcreate_s8(sc));
            [vmovl_s16(vget_low_s16(v)), vmovl_high_s16(v)]
        }
    }

    /// `Σ_j sc_j · p_j` of eight sub-block dots.
    #[inline(always)]
    fn sum8(p: &[int32x4_t; 8], sc: u64) -> i32 {
        let sc = widen8(sc);
        let acc = mla4(
            // SAFETY: register-only NEON (baseline).
            unsafe { vdupq_n_s32(0) },
            [p[0], p[1], p[2], p[3]],
            sc[0],
        );
        // SAFETY: as above.
        unsafe { vaddvq_s32(mla4(acc, [p[4], p[5], p[6], p[7]], sc[1])) }
    }

    /// Q4_K (`FIVE = false`) and Q5_K.
    ///
    /// # Safety
    /// `b` a whole block of the type, `a` a Q8_K block; with `DOT`, FEAT_DotProd.
    #[inline(always)]
    pub(super) unsafe fn k4<const DOT: bool, const FIVE: bool>(
        b: *const u8,
        a: *const u8,
    ) -> (i32, i32) {
        // SAFETY: the scales are bytes 4..16, qh 16..48 (Q5_K), qs the last 128; the
        // activation quants are 256 bytes from byte 4; NEON baseline, `DOT` as the caller's.
        unsafe {
            let sb = std::slice::from_raw_parts(b.add(4), 12);
            let (sc, mn) = k4_words(sb);
            let qs = b.add(if FIVE { 48 } else { 16 });
            let x = a.add(4).cast::<i8>();
            let m4 = vdupq_n_u8(15);
            let (mut h0, mut h1) = (vld1q_u8(b.add(16)), vld1q_u8(b.add(32)));
            let mut p = [vdupq_n_s32(0); 8];
            for c in 0..4 {
                let (q0, q1) = (vld1q_u8(qs.add(32 * c)), vld1q_u8(qs.add(32 * c + 16)));
                let (mut l0, mut l1) = (vandq_u8(q0, m4), vandq_u8(q1, m4));
                let (mut u0, mut u1) = (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1));
                if FIVE {
                    let m = vdupq_n_u8(0x10);
                    l0 = vorrq_u8(l0, vandq_u8(vshlq_n_u8::<4>(h0), m));
                    l1 = vorrq_u8(l1, vandq_u8(vshlq_n_u8::<4>(h1), m));
                    u0 = vorrq_u8(u0, vandq_u8(vshlq_n_u8::<3>(h0), m));
                    u1 = vorrq_u8(u1, vandq_u8(vshlq_n_u8::<3>(h1), m));
                    (h0, h1) = (vshrq_n_u8::<2>(h0), vshrq_n_u8::<2>(h1));
                }
                let s = |v: uint8x16_t| vreinterpretq_s8_u8(v);
                p[2 * c] = g2::<DOT>(s(l0), s(l1), x.add(64 * c));
                p[2 * c + 1] = g2::<DOT>(s(u0), s(u1), x.add(64 * c + 32));
            }
            (sum8(&p, sc), bsum8(mn, a))
        }
    }

    /// IQ4_XS's eight sub-block scales (`iq4xs_sc`) as the signed bytes of a u64, computed in
    /// general registers: the four `scales_l` bytes spread to one nibble per byte, the 2-bit
    /// fields of `scales_h` to one per byte (shift-or-mask steps), joined, and 32 taken from
    /// each byte without a borrow between bytes (`(w | 0x80…) − 0x20…`, then bit 7 flipped back:
    /// every byte is at most 63). The byte-by-byte form compiled to lane moves and a four-table
    /// `tbl`, most of the loop on the in-order Cortex-A55 model.
    ///
    /// # Safety
    /// `b` is an IQ4_XS block.
    #[inline(always)]
    unsafe fn iq4xs_sc8(b: *const u8) -> u64 {
        // SAFETY: bytes 2..8 of the block; unaligned reads.
        let (h, l) = unsafe {
            (
                u64::from(u16::from_le(b.add(2).cast::<u16>().read_unaligned())),
                u64::from(u32::from_le(b.add(4).cast::<u32>().read_unaligned())),
            )
        };
        // `l`: byte i to bits 16i..16i+8, then its nibbles to bytes 2i, 2i+1.
        let l = (l | (l << 16)) & 0x0000_ffff_0000_ffff;
        let l = (l | (l << 8)) & 0x00ff_00ff_00ff_00ff;
        let l = (l & 0x000f_000f_000f_000f) | ((l & 0x00f0_00f0_00f0_00f0) << 4);
        // `h`: field j (bits 2j, 2j+1) to byte j.
        let h = (h | (h << 24)) & 0x0000_00ff_0000_00ff;
        let h = (h | (h << 12)) & 0x000f_000f_000f_000f;
        let h = (h | (h << 6)) & 0x0303_0303_0303_0303;
        let w = l | (h << 4);
        let m = 0x8080_8080_8080_8080u64;
        ((w | m) - 0x2020_2020_2020_2020) ^ m
    }

    /// IQ4_XS (`summ = 0`).
    ///
    /// # Safety
    /// As [`k4`].
    #[inline(always)]
    pub(super) unsafe fn iq4xs<const DOT: bool>(b: *const u8, a: *const u8) -> (i32, i32) {
        // SAFETY: the scales are bytes 2..8, qs 8..136; activations as in `k4`.
        unsafe {
            let sc = iq4xs_sc8(b);
            let t = vld1q_s8(IQ4_VALUES.as_ptr());
            let x = a.add(4).cast::<i8>();
            let mut p = [vdupq_n_s32(0); 8];
            for (j, p) in p.iter_mut().enumerate() {
                let q = vld1q_u8(b.add(8 + 16 * j));
                let lo = vqtbl1q_s8(t, vandq_u8(q, vdupq_n_u8(15)));
                let hi = vqtbl1q_s8(t, vshrq_n_u8::<4>(q));
                *p = g2::<DOT>(lo, hi, x.add(32 * j));
            }
            (sum8(&p, sc), 0)
        }
    }

    /// `Σ_g sc_g · p_g` of sixteen group dots, `sc` the sixteen signed byte scales.
    #[inline(always)]
    fn sum16(p: &[int32x4_t; 16], sc: int8x16_t) -> i32 {
        let sc = widen16(sc);
        // SAFETY: register-only NEON (baseline).
        let mut acc = unsafe { vdupq_n_s32(0) };
        for (q, sc) in sc.iter().enumerate() {
            acc = mla4(
                acc,
                [p[4 * q], p[4 * q + 1], p[4 * q + 2], p[4 * q + 3]],
                *sc,
            );
        }
        // SAFETY: as above.
        unsafe { vaddvq_s32(acc) }
    }

    /// Q2_K: `u` the 2-bit quants, a scale (low nibble) and a min (high nibble) per group.
    ///
    /// # Safety
    /// As [`k4`].
    #[inline(always)]
    pub(super) unsafe fn q2<const DOT: bool>(b: *const u8, a: *const u8) -> (i32, i32) {
        // SAFETY: scales are bytes 0..16, qs 16..80; activations as in `k4`.
        unsafe {
            let raw = vld1q_u8(b);
            let sc = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15)));
            let mn = vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw));
            let x = a.add(4).cast::<i8>();
            let m3 = vdupq_n_u8(3);
            let mut p = [vdupq_n_s32(0); 16];
            for n in 0..2 {
                let (mut q0, mut q1) = (vld1q_u8(b.add(16 + 32 * n)), vld1q_u8(b.add(32 + 32 * n)));
                for j in 0..4 {
                    let g = 8 * n + 2 * j;
                    p[g] = g1::<DOT>(vandq_u8(q0, m3), x.add(16 * g));
                    p[g + 1] = g1::<DOT>(vandq_u8(q1, m3), x.add(16 * g + 16));
                    (q0, q1) = (vshrq_n_u8::<2>(q0), vshrq_n_u8::<2>(q1));
                }
            }
            (sum16(&p, sc), bsum16(mn, a))
        }
    }

    /// Q3_K's sixteen scales times four, `4·(sc − 32)`, as i16 (groups 0..8, 8..16), from
    /// the 12 packed bytes at `sb` (the layout `q3_words` documents): the low nibbles of bytes
    /// 0..8 then their high nibbles, under the 2-bit fields of bytes 8..12 (field `f` of byte
    /// `i` belongs to group `4f + i`), inserted by `sli`. Bit 5 of each 6-bit scale is flipped
    /// on the way (`eor` on the fields) and the byte shifted left by two: `(s ^ 32) << 2` read
    /// as a signed byte is `4·(s − 32)`, with the two garbage bits above the field shifted out.
    ///
    /// # Safety
    /// 12 readable bytes at `sb`.
    #[inline(always)]
    unsafe fn q3_sc4(sb: *const u8) -> (int16x8_t, int16x8_t) {
        const FIELD: [i32; 4] = [0, -2, -4, -6];
        // SAFETY: bytes 0..12 at `sb` (the caller's); NEON baseline.
        unsafe {
            let a = vld1_u8(sb);
            let lo = vcombine_u8(a, vshr_n_u8::<4>(a));
            let hi = vdupq_lane_u32::<1>(vreinterpret_u32_u8(vld1_u8(sb.add(4))));
            let hi = veorq_u32(hi, vdupq_n_u32(0xaaaa_aaaa));
            let hi = vshlq_u32(hi, vld1q_s32(FIELD.as_ptr()));
            let s = vsliq_n_u8::<4>(lo, vreinterpretq_u8_u32(hi));
            let s = vreinterpretq_s8_u8(vshlq_n_u8::<2>(s));
            (vmovl_s8(vget_low_s8(s)), vmovl_high_s8(s))
        }
    }

    /// `cmtst`: 0xFF in each byte where `a & b` is nonzero. In `asm!`, as [`sri6`] and
    /// [`xtn2`]: LLVM rewrites the intrinsics' forms here into costlier ones (`cmtst` of a
    /// complement into `and` + `cmeq`, `sri` into `bsl` with a mask, `xtn` + `xtn2` into `shl`,
    /// `sshr` and `uzp1`), which the opaque form keeps it from doing.
    #[inline(always)]
    fn tst(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
        let r;
        // SAFETY: reads and writes vector registers only (NEON is baseline on aarch64).
        unsafe {
            std::arch::asm!(
                "cmtst {r:v}.16b, {a:v}.16b, {b:v}.16b",
                r = lateout(vreg) r,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        r
    }

    /// `sri #6`: the top six bits of `d` over the top two bits of `s` (moved to the bottom).
    #[inline(always)]
    fn sri6(d: uint8x16_t, s: uint8x16_t) -> uint8x16_t {
        let mut d = d;
        // SAFETY: as in [`tst`].
        unsafe {
            std::arch::asm!(
                "sri {d:v}.16b, {s:v}.16b, #6",
                d = inout(vreg) d,
                s = in(vreg) s,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        d
    }

    /// The low halves of the i32 lanes of `a` then `b`, as eight i16 (`xtn` + `xtn2`).
    #[inline(always)]
    fn xtn2(a: int32x4_t, b: int32x4_t) -> int16x8_t {
        let r;
        // SAFETY: as in [`tst`].
        unsafe {
            std::arch::asm!(
                "xtn {r:v}.4h, {a:v}.4s",
                "xtn2 {r:v}.8h, {b:v}.4s",
                r = out(vreg) r,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        r
    }

    /// Q3_K's four groups `(n, j)` of one half `q` of the quants: ggml's values, `low − 4`
    /// where the hmask bit is clear and `low` where it is set, as signed bytes. `low` is bits
    /// `2j..2j+2` of `q`; `m = cmtst(!h, bit[j])` (`hn` the complement of the hmask,
    /// `bit[j] = 1 << (4n + j)`) is all ones where the bit is clear, and its top six
    /// bits are then `−4` with the two low bits clear. [`sri6`] brings `low` from the top of a
    /// byte under them: `q` itself for `j = 3`, `q` shifted left by 6, 4, 2 for `j = 0, 1, 2`
    /// (the bits below the field shift out).
    #[inline(always)]
    fn q3_v(q: uint8x16_t, hn: uint8x16_t, bit: &[uint8x16_t]) -> [uint8x16_t; 4] {
        let m = |j: usize| tst(hn, bit[j]);
        // SAFETY: register-only NEON (baseline).
        let (q4, q2) = unsafe { (vshlq_n_u8::<4>(q), vshlq_n_u8::<2>(q)) };
        let v3 = sri6(m(3), q);
        let (v1, v2) = (sri6(m(1), q4), sri6(m(2), q2));
        // SAFETY: register-only NEON (baseline).
        let v0 = sri6(m(0), unsafe { vshlq_n_u8::<6>(q) });
        [v0, v1, v2, v3]
    }

    /// `acc` plus two groups' dots in one vector, lanes `[A, A, B, B]`: `u0 = [A₀..₈, B₀..₈]` and
    /// `u1 = [A₈..₁₆, B₈..₁₆]` against `x0`, `x1` in the same layout (as `ld2` of 64-bit
    /// elements lays out two consecutive 16-byte groups), by `smull`/`smlal` (the baseline
    /// form; [`pair_ld`] is the `sdot` one). Exact: `|u| ≤ 4`, so the i16 pair sums stay below
    /// `2·4·128`.
    #[inline(always)]
    fn pair(
        acc: int32x4_t,
        u0: uint8x16_t,
        u1: uint8x16_t,
        x0: int8x16_t,
        x1: int8x16_t,
    ) -> int32x4_t {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let (u0, u1) = (vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(u1));
            let lo = |u: int8x16_t, x: int8x16_t| vmull_s8(vget_low_s8(u), vget_low_s8(x));
            let a = vmlal_s8(lo(u0, x0), vget_low_s8(u1), vget_low_s8(x1));
            let b = vmlal_high_s8(vmull_high_s8(u0, x0), u1, x1);
            vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(a), vpaddlq_s16(b)))
        }
    }

    /// [`pair`] with `sdot`, loading the activations itself (`ld2` of 64-bit elements at
    /// `x`, 32 bytes, into v30 and v31: `ld2` needs two consecutive registers) in the same
    /// `asm!` block: as separate intrinsics LLVM hoists all eight activation loads of a
    /// super-block to its top, runs out of registers and spills.
    ///
    /// # Safety
    /// FEAT_DotProd and a caller compiled with it; 32 readable bytes at `x`.
    #[inline(always)]
    unsafe fn pair_ld(acc: int32x4_t, u0: uint8x16_t, u1: uint8x16_t, x: *const i64) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: reads 32 bytes at `x` (the caller's), writes vector registers only; `sdot`
        // per the caller's guarantee.
        unsafe {
            std::arch::asm!(
                "ld2 {{v30.2d, v31.2d}}, [{x}]",
                "sdot {acc:v}.4s, {u0:v}.16b, v30.16b",
                "sdot {acc:v}.4s, {u1:v}.16b, v31.16b",
                acc = inout(vreg) acc,
                u0 = in(vreg) u0,
                u1 = in(vreg) u1,
                x = in(reg) x,
                out("v30") _,
                out("v31") _,
                options(pure, readonly, nostack, preserves_flags)
            );
        }
        acc
    }

    /// Q3_K, on ggml's signed values `v = u − 4` ([`q3_v`]): returns `(Σ sc·Σ v·x, 0)`. The
    /// float step uses only `sumi − summ` (`super::step`), and the scalar twin's is `Σ sc·Σ
    /// u·x − 4·Σ sc·bsum`: the same integer when each stored `bsum` is its group's sum, as
    /// the Q8_K quantizer writes it (this kernel does not read the `bsums`). Nothing wraps:
    /// `|Σ v·x| ≤ 16·4·128 = 8192` per group (an i16), `|4·Σ sc·g| < 4·16·32·8192 < 2³¹`.
    /// The hmask, the quants and the activations are loaded with `ld2` of 64-bit elements, so
    /// one accumulator holds two groups ([`pair`], [`pair_ld`]); one `addp` per four groups
    /// folds them, [`xtn2`] narrows the sums to i16 and `smlal` multiplies them by the scales
    /// ([`q3_sc4`], times four, shifted back at the end).
    ///
    /// # Safety
    /// As [`k4`].
    #[inline(always)]
    pub(super) unsafe fn q3<const DOT: bool>(b: *const u8, a: *const u8) -> (i32, i32) {
        // SAFETY: hmask is bytes 0..32, qs 32..96, scales 96..108; activations as in `k4`.
        unsafe {
            let (s0, s1) = q3_sc4(b.add(96));
            let x = a.add(4).cast::<i64>();
            let u8s = |v: uint64x2_t| vreinterpretq_u8_u64(v);
            let s8 = |v: int64x2_t| vreinterpretq_s8_s64(v);
            let h = vld2q_u64(b.cast());
            let hn = [vmvnq_u8(u8s(h.0)), vmvnq_u8(u8s(h.1))];
            let bit = [1, 2, 4, 8, 16, 32, 64, 128].map(|v| vdupq_n_u8(v));
            let mut g = [vdupq_n_s16(0); 2];
            for n in 0..2 {
                let mut p = [vdupq_n_s32(0); 4];
                let q = vld2q_u64(b.add(32 + 32 * n).cast());
                let u0 = q3_v(u8s(q.0), hn[0], &bit[4 * n..]);
                let u1 = q3_v(u8s(q.1), hn[1], &bit[4 * n..]);
                for (j, p) in p.iter_mut().enumerate() {
                    let xj = x.add(16 * n + 4 * j);
                    *p = if DOT {
                        pair_ld(*p, u0[j], u1[j], xj)
                    } else {
                        let xv = vld2q_s64(xj);
                        pair(*p, u0[j], u1[j], s8(xv.0), s8(xv.1))
                    };
                }
                g[n] = xtn2(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
            }
            let acc = vmull_s16(vget_low_s16(g[0]), vget_low_s16(s0));
            let acc = vmlal_high_s16(acc, g[0], s0);
            let acc = vmlal_s16(acc, vget_low_s16(g[1]), vget_low_s16(s1));
            (vaddvq_s32(vmlal_high_s16(acc, g[1], s1)) >> 2, 0)
        }
    }

    /// Q6_K: `u` 6 bits, offset 32 (`summ = 32·Σ sc·bsum`).
    ///
    /// # Safety
    /// As [`k4`].
    #[inline(always)]
    pub(super) unsafe fn q6<const DOT: bool>(b: *const u8, a: *const u8) -> (i32, i32) {
        // SAFETY: ql is bytes 0..128, qh 128..192, scales 192..208; activations as in `k4`.
        unsafe {
            let sc = vld1q_s8(b.add(192).cast());
            let x = a.add(4).cast::<i8>();
            let (m4, m30) = (vdupq_n_u8(15), vdupq_n_u8(0x30));
            let mut p = [vdupq_n_s32(0); 16];
            for n in 0..2 {
                let ql = b.add(64 * n);
                let l: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(ql.add(16 * i)));
                let h = [vld1q_u8(b.add(128 + 32 * n)), vld1q_u8(b.add(144 + 32 * n))];
                for i in 0..4 {
                    // Groups 8n + i (values 128n + 16i ..) and 8n + 4 + i (values + 64 ..).
                    let hi = h[i % 2];
                    let (lo_h, hi_h) = if i < 2 {
                        (vshlq_n_u8::<4>(hi), hi)
                    } else {
                        (vshlq_n_u8::<2>(hi), vshrq_n_u8::<2>(hi))
                    };
                    let u0 = vorrq_u8(vandq_u8(l[i], m4), vandq_u8(lo_h, m30));
                    let u1 = vorrq_u8(vshrq_n_u8::<4>(l[i]), vandq_u8(hi_h, m30));
                    let g = 8 * n + i;
                    p[g] = g1::<DOT>(u0, x.add(16 * g));
                    p[g + 4] = g1::<DOT>(u1, x.add(16 * g + 64));
                }
            }
            (sum16(&p, sc), bsum16(sc, a).wrapping_mul(32))
        }
    }
}
