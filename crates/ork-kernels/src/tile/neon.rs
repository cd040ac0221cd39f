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
//! Loop structure, as the x86 kernels have it:
//! * blocks of 4 rows × 2 channels: each k-run of the two weight channels is loaded once for
//!   4 activation rows (8 accumulators);
//! * a single row (decode, M = 1) reads the tile in memory order: each k-run's `tn × 32` bytes
//!   front to back, one accumulator per channel (up to 64 at a time), so the weight streams from
//!   DRAM sequentially;
//! * leftover rows of a block, a channel pair at a time.
//!
//! `sdot` is issued through `asm!`: its intrinsic (`vdotq_s32`) is unstable on the project's
//! toolchain (feature `stdarch_neon_dotprod`, rustc 1.95).

use std::arch::aarch64::*;

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
    // SAFETY: forwarded from the caller.
    unsafe { body::<Widen>(a, kpad, w, tn, out) }
}

/// # Safety
/// As [`body`], and the CPU must have FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_dot_sdot(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    // SAFETY: forwarded from the caller.
    unsafe { body::<Sdot>(a, kpad, w, tn, out) }
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

/// The two 16-byte halves of the 32 bytes at `p`.
///
/// # Safety
/// `p .. p + 32` must be readable.
#[inline(always)]
unsafe fn load32(p: *const i8) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller guarantees 32 readable bytes; `ld1` takes unaligned addresses.
    unsafe { (vld1q_s8(p), vld1q_s8(p.add(16))) }
}

/// An accumulator of zeros.
#[inline(always)]
fn zero() -> int32x4_t {
    // SAFETY: register-only; NEON is part of the aarch64 baseline.
    unsafe { vdupq_n_s32(0) }
}

/// The sum of the four lanes (`addv`).
#[inline(always)]
fn hsum(v: int32x4_t) -> i32 {
    // SAFETY: register-only; NEON is part of the aarch64 baseline.
    unsafe { vaddvq_s32(v) }
}

/// Channels the single-row pass accumulates at once.
const M1_CHANNELS: usize = 64;

/// `out[r·tn + j] = Σ_k a[r, k] · w[j, k]` for every row of `a`.
///
/// # Safety
/// `a` is `rows × kpad` i8, `w` is `tn × kpad` i8 in tile order, `kpad % 32 == 0`, `tn` even,
/// `out.len() ≥ rows · tn`, and the CPU has what `S` uses.
#[inline(always)]
unsafe fn body<S: Step>(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    let kt_n = kpad / 32;
    let (ap, wp) = (a.as_ptr(), w.as_ptr());
    let mut r = 0;
    while r + 4 <= rows {
        for j in (0..tn).step_by(2) {
            let mut acc = [zero(); 8];
            for kt in 0..kt_n {
                // SAFETY: kt < kpad/32 and j + 1 < tn, so both weight runs lie inside `w`; rows
                // r..r+4 and k-run kt lie inside `a`; `S::step` is what the caller enabled.
                unsafe {
                    let (w00, w01) = load32(wp.add(kt * tn * 32 + j * 32));
                    let (w10, w11) = load32(wp.add(kt * tn * 32 + j * 32 + 32));
                    for i in 0..4 {
                        let (a0, a1) = load32(ap.add((r + i) * kpad + kt * 32));
                        acc[2 * i] = S::step(acc[2 * i], a0, a1, w00, w01);
                        acc[2 * i + 1] = S::step(acc[2 * i + 1], a0, a1, w10, w11);
                    }
                }
            }
            for i in 0..4 {
                out[(r + i) * tn + j] = hsum(acc[2 * i]);
                out[(r + i) * tn + j + 1] = hsum(acc[2 * i + 1]);
            }
        }
        r += 4;
    }
    if rows == 1 {
        // Decode (M = 1): every weight byte is read once. Each k-run's `tn × 32` bytes are read
        // front to back, every channel's 32 bytes into its own accumulator (they live on the
        // stack: 64 do not fit in 32 registers), as the AVX2 kernel's M = 1 pass does. Tiles
        // wider than 64 channels (none today: ork-pack's are 32 and 64) take 64 at a time.
        let mut acc = [zero(); M1_CHANNELS];
        for c0 in (0..tn).step_by(M1_CHANNELS) {
            let width = (tn - c0).min(M1_CHANNELS);
            acc[..width].fill(zero());
            for kt in 0..kt_n {
                let base = kt * tn * 32 + c0 * 32;
                // SAFETY: k-run kt of the single row lies inside `a`; c0 + c < tn, so the 32
                // bytes at `base + 32 c` lie inside `w`; `S::step` is what the caller enabled.
                unsafe {
                    let (a0, a1) = load32(ap.add(kt * 32));
                    for (c, acc) in acc[..width].iter_mut().enumerate() {
                        let (w0, w1) = load32(wp.add(base + 32 * c));
                        *acc = S::step(*acc, a0, a1, w0, w1);
                    }
                }
            }
            for (c, v) in acc[..width].iter().enumerate() {
                out[c0 + c] = hsum(*v);
            }
        }
        return;
    }
    // Leftover rows of a multi-row block, a channel pair at a time.
    while r < rows {
        for j in (0..tn).step_by(2) {
            let (mut acc0, mut acc1) = (zero(), zero());
            for kt in 0..kt_n {
                // SAFETY: as in the 4-row block, for the single row r.
                unsafe {
                    let (w00, w01) = load32(wp.add(kt * tn * 32 + j * 32));
                    let (w10, w11) = load32(wp.add(kt * tn * 32 + j * 32 + 32));
                    let (a0, a1) = load32(ap.add(r * kpad + kt * 32));
                    acc0 = S::step(acc0, a0, a1, w00, w01);
                    acc1 = S::step(acc1, a0, a1, w10, w11);
                }
            }
            out[r * tn + j] = hsum(acc0);
            out[r * tn + j + 1] = hsum(acc1);
        }
        r += 1;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Both aarch64 kernels (the dotprod one where the CPU has `sdot`) equal the scalar twin
        /// for every even tile width up to 160, not only the multiples of 8 the shared twin test
        /// draws: the M = 1 pass's 64-channel chunks and their remainders, the 4-row blocks and
        /// the leftover rows, values mostly at the i8 extremes.
        #[test]
        fn aarch64_kernels_match_the_scalar_twin_at_every_even_width(rows in 1usize..7, kt_n in 1usize..5, pairs in 1usize..81, seed in any::<u64>()) {
            let (tn, kpad) = (2 * pairs, 32 * kt_n);
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                match s % 6 { 0 => -128, 1 => 127, _ => (s >> 8) as i8 }
            };
            let a: Vec<i8> = (0..rows * kpad).map(|_| next()).collect();
            let w: Vec<i8> = (0..tn * kpad).map(|_| next()).collect();
            let mut want = vec![0i32; rows * tn];
            super::super::scalar_tile_dot(&a, kpad, &w, tn, &mut want);
            let mut got = vec![i32::MIN; rows * tn];
            super::tile_dot(&a, kpad, &w, tn, &mut got);
            prop_assert_eq!(&got, &want, "neon");
            if super::has_dotprod() {
                let mut got = vec![i32::MIN; rows * tn];
                super::tile_dot_dotprod(&a, kpad, &w, tn, &mut got);
                prop_assert_eq!(&got, &want, "neon-dotprod");
            }
        }
    }
}
