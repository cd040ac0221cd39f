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
//! The mins term is `smull`/`smlal2` of the 16 `mn_g` with the 16 `bsum_g`. All sums are i32
//! and wrap like the scalar twin's, and the float step is the shared [`super::combine`], so
//! both equal the scalar twin bit for bit (property tests in `tests.rs`, run under
//! qemu-aarch64 as cortex-a76 and cortex-a53; never timed on a board).

use std::arch::aarch64::*;

use super::{Engine, KType, Super, Q8K_BSUMS, Q8K_BYTES};
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
        super::decode(ty, blk, s);
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
