//! aarch64 kernels, one body compiled twice:
//!
//! * **NEON** (the aarch64 baseline, every Cortex-A): `smull`/`smull2` widen the i8 products to
//!   i16 (exact: `|a·w| ≤ 16384`), `sadalp` adds pairs of them into i32 lanes (exact).
//! * **NEON dotprod** (`sdot`, Armv8.2 FEAT_DotProd: the RK3588's Cortex-A76 and A55, detected at
//!   run time): each i32 lane adds four i8 × i8 products at once, exact.
//!
//! The two differ only in the step that adds one 32-byte k-run's products into an accumulator
//! ([`Step`]); both give every i32 sum exactly, so both equal the scalar twin
//! [`super::scalar_tile_dot`] bit for bit (property tests in `super`, run under qemu-aarch64 with
//! and without dotprod; `docs/kernels.md`).
//!
//! The loops are the shared generic body ([`super::body`]) with AVX2's shape: blocks of 4 rows ×
//! 2 channels (each k-run of the two weight channels loaded once for 4 activation rows, 8
//! accumulators); a single row (decode, M = 1) reads the tile in memory order, one accumulator
//! per channel (up to 64 at a time), so the weight streams from DRAM sequentially (no prefetch:
//! its worth on the Cortex-A76 is unmeasured); leftover rows of a block a channel pair at a time.
//!
//! `sdot` is issued through `asm!`: its intrinsic (`vdotq_s32`) is unstable on the project's
//! toolchain (feature `stdarch_neon_dotprod`, rustc 1.95).

use super::body::{body, TileVec};
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// Whether the CPU has the dot-product instructions (`sdot`).
pub(crate) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// Safe entry of the NEON kernel: checks shapes (NEON is part of the aarch64 baseline).
pub(super) fn tile_dot(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    check(a, kpad, w, tn, out);
    // SAFETY: shapes checked by `check`; NEON is part of the aarch64 baseline.
    unsafe { tile_dot_neon(a, kpad, w, tn, out) }
}

/// Safe entry of the dotprod kernel: checks shapes and that the CPU has `sdot`.
pub(super) fn tile_dot_dotprod(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    check(a, kpad, w, tn, out);
    assert!(has_dotprod(), "the dotprod kernel needs a CPU with sdot");
    // SAFETY: shapes checked by `check`; the CPU has FEAT_DotProd (asserted just above).
    unsafe { tile_dot_sdot(a, kpad, w, tn, out) }
}

/// The shapes both kernels require (see [`body`]'s `# Safety`).
fn check(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &[i32]) {
    let rows = a.len() / kpad;
    assert!(
        kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && w.len() == tn * kpad
            && tn.is_multiple_of(2)
            && out.len() >= rows * tn
    );
}

/// # Safety
/// As [`body`].
#[target_feature(enable = "neon")]
unsafe fn tile_dot_neon(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    // SAFETY: forwarded from the caller; NEON is enabled here, which is what `Neon<Widen>` uses.
    unsafe { body::<Neon<Widen>, 2, 2, true>(a, &[], kpad, w, tn, out) }
}

/// # Safety
/// As [`body`], and the CPU must have FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_dot_sdot(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    // SAFETY: forwarded from the caller; NEON + dotprod are enabled here, which is what
    // `Neon<Sdot>` uses.
    unsafe { body::<Neon<Sdot>, 2, 2, true>(a, &[], kpad, w, tn, out) }
}

/// The aarch64 vector operations for [`body`], generic over the multiply-add step `S`: a k-run
/// is two 16-byte halves, an accumulator's four lanes are summed at the end (`addv`).
struct Neon<S>(PhantomData<S>);

impl<S: Step> TileVec for Neon<S> {
    type Elem = i8;
    type Acc = int32x4_t;
    type A = (int8x16_t, int8x16_t);
    type W = (int8x16_t, int8x16_t);
    const CH: usize = 1;
    const PREFETCH: bool = false;

    #[inline(always)]
    unsafe fn zero() -> int32x4_t {
        // SAFETY: register-only; NEON is part of the aarch64 baseline.
        unsafe { vdupq_n_s32(0) }
    }

    #[inline(always)]
    unsafe fn load_a(p: *const i8) -> Self::A {
        // SAFETY: 32 readable bytes (caller); `ld1` takes unaligned addresses.
        unsafe { (vld1q_s8(p), vld1q_s8(p.add(16))) }
    }

    #[inline(always)]
    unsafe fn load_w(p: *const i8) -> Self::W {
        // SAFETY: as `load_a`.
        unsafe { Self::load_a(p) }
    }

    #[inline(always)]
    unsafe fn madd(acc: int32x4_t, a: Self::A, w: Self::W) -> int32x4_t {
        // SAFETY: the caller enabled what `S` uses.
        unsafe { S::step(acc, a.0, a.1, w.0, w.1) }
    }

    #[inline(always)]
    unsafe fn finish(acc: &[int32x4_t], corr: i32, out: *mut i32) {
        for (c, &v) in acc.iter().enumerate() {
            // SAFETY: `acc.len()` writable outputs at `out` (caller); `addv` is NEON.
            unsafe { *out.add(c) = vaddvq_s32(v).wrapping_sub(corr) };
        }
    }

    #[inline(always)]
    unsafe fn prefetch(_: *const i8) {}
}

/// One k-run's contribution: `acc` lanes gain the products of `a0 · w0` and `a1 · w1` (the two
/// 16-byte halves of a 32-byte run). The lane a product lands in may differ between steps; only
/// the sum of the four lanes is used.
trait Step {
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn step(
        acc: int32x4_t,
        a0: int8x16_t,
        a1: int8x16_t,
        w0: int8x16_t,
        w1: int8x16_t,
    ) -> int32x4_t;
}

/// NEON baseline: `smull` + `sadalp`.
struct Widen;

impl Step for Widen {
    #[inline(always)]
    unsafe fn step(
        acc: int32x4_t,
        a0: int8x16_t,
        a1: int8x16_t,
        w0: int8x16_t,
        w1: int8x16_t,
    ) -> int32x4_t {
        // SAFETY: register-only NEON arithmetic; NEON is part of the aarch64 baseline.
        unsafe {
            let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a0), vget_low_s8(w0)));
            let acc = vpadalq_s16(acc, vmull_high_s8(a0, w0));
            let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(w1)));
            vpadalq_s16(acc, vmull_high_s8(a1, w1))
        }
    }
}

/// FEAT_DotProd: two `sdot`.
struct Sdot;

impl Step for Sdot {
    #[inline(always)]
    unsafe fn step(
        acc: int32x4_t,
        a0: int8x16_t,
        a1: int8x16_t,
        w0: int8x16_t,
        w1: int8x16_t,
    ) -> int32x4_t {
        // SAFETY: the caller guarantees FEAT_DotProd.
        unsafe { sdot(sdot(acc, a0, w0), a1, w1) }
    }
}

/// `acc[i] += Σ_{j<4} a[4i + j] · b[4i + j]` (signed bytes, exact in i32).
///
/// # Safety
/// The CPU must have FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads and writes vector registers only (no memory, flags or stack); the
    // caller guarantees the CPU implements it.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}
