//! The F16 kernel for aarch64 cores with fp16 arithmetic (FEAT_FP16, `asimdhp` in
//! `/proc/cpuinfo`: the Cortex-A76 and A55): ggml's `ggml_vec_dot_f16` order, accumulating in
//! fp16 with `fmla .8h` (`super::super::fp16`, whose [`rows_scalar`](super::super::fp16::rows_scalar)
//! is its twin). fp16 vector intrinsics are unstable in Rust, so the arithmetic is `asm!` inside
//! functions compiled with the `fp16` target feature; the loads are NEON intrinsics.
//!
//! Per (weight row, activation row) pair: four accumulators of eight fp16 lanes, 32 elements a
//! step, one `fmla` per accumulator; then `fadd .8h` (acc0 + acc2, acc1 + acc3, their sum),
//! `fcvtl`/`fcvtl2`, `fadd .4s` and two `faddp`; the last `k mod 32` elements in f64 by the
//! twin's own code. Decode computes four weight rows against one activation row (16
//! accumulators, each activation vector loaded once for the four rows), prefill one weight row
//! against four activation rows.

use super::super::fp16::{tail, whole};
use super::super::{drive, RowsFn, Tile};
use std::arch::aarch64::*;
use std::arch::asm;

/// Four vectors of eight fp16 lanes (bit patterns): 32 consecutive values, or ggml's four
/// accumulators.
type Quad = [uint16x8_t; 4];

/// The 32 f16 values at `p`.
///
/// # Safety
/// 64 readable bytes at `p`.
#[inline(always)]
unsafe fn load(p: *const u8) -> Quad {
    // SAFETY: 64 readable bytes (caller); unaligned loads of the aarch64 baseline.
    unsafe {
        [
            vld1q_u16(p.cast()),
            vld1q_u16(p.add(16).cast()),
            vld1q_u16(p.add(32).cast()),
            vld1q_u16(p.add(48).cast()),
        ]
    }
}

/// `acc[j] = acc[j] + w[j] · a[j]` lane by lane, each a fused multiply-add rounded once to
/// binary16 (`fmla .8h`, ggml's `vfmaq_f16`).
///
/// # Safety
/// The CPU must have FEAT_FP16.
#[inline(always)]
unsafe fn fmla(acc: &mut Quad, w: &Quad, a: &Quad) {
    // SAFETY: register-only instructions (no memory, stack or flags); the caller vouches for
    // FEAT_FP16.
    unsafe {
        asm!(
            "fmla {c0:v}.8h, {w0:v}.8h, {a0:v}.8h",
            "fmla {c1:v}.8h, {w1:v}.8h, {a1:v}.8h",
            "fmla {c2:v}.8h, {w2:v}.8h, {a2:v}.8h",
            "fmla {c3:v}.8h, {w3:v}.8h, {a3:v}.8h",
            c0 = inout(vreg) acc[0],
            c1 = inout(vreg) acc[1],
            c2 = inout(vreg) acc[2],
            c3 = inout(vreg) acc[3],
            w0 = in(vreg) w[0],
            w1 = in(vreg) w[1],
            w2 = in(vreg) w[2],
            w3 = in(vreg) w[3],
            a0 = in(vreg) a[0],
            a1 = in(vreg) a[1],
            a2 = in(vreg) a[2],
            a3 = in(vreg) a[3],
            options(pure, nomem, nostack, preserves_flags)
        );
    }
}

/// ggml's `GGML_F16x8_REDUCE` of four accumulators to one f32: `(acc0 + acc2) + (acc1 + acc3)`
/// in fp16, the low and high four lanes widened and added in f32, then `faddp` twice.
///
/// # Safety
/// The CPU must have FEAT_FP16.
#[inline(always)]
unsafe fn reduce(acc: Quad) -> f32 {
    let out: f32;
    // SAFETY: register-only instructions; the caller vouches for FEAT_FP16 (`fadd .8h`).
    unsafe {
        asm!(
            "fadd {a0:v}.8h, {a0:v}.8h, {a2:v}.8h",
            "fadd {a1:v}.8h, {a1:v}.8h, {a3:v}.8h",
            "fadd {a0:v}.8h, {a0:v}.8h, {a1:v}.8h",
            "fcvtl2 {a1:v}.4s, {a0:v}.8h",
            "fcvtl {a0:v}.4s, {a0:v}.4h",
            "fadd {a0:v}.4s, {a0:v}.4s, {a1:v}.4s",
            "faddp {a0:v}.4s, {a0:v}.4s, {a0:v}.4s",
            "faddp {o:s}, {a0:v}.2s",
            a0 = inout(vreg) acc[0] => _,
            a1 = inout(vreg) acc[1] => _,
            a2 = in(vreg) acc[2],
            a3 = in(vreg) acc[3],
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// `R` weight rows against `N` activation rows (module docs).
///
/// # Safety
/// The CPU must have FEAT_FP16; every `wr[j]` and `ar[i]` hold the same whole number of f16.
#[target_feature(enable = "fp16")]
unsafe fn tile<const R: usize, const N: usize>(wr: [&[u8]; R], ar: [&[u8]; N]) -> [[f32; N]; R] {
    let np = whole(wr[0].len() / 2);
    let zero = vdupq_n_u16(0);
    let mut acc = [[[zero; 4]; N]; R];
    for c in (0..np).step_by(32) {
        for j in 0..R {
            // SAFETY: values c .. c + 32 <= np lie inside every row; FEAT_FP16 (caller).
            unsafe {
                let w = load(wr[j].as_ptr().add(2 * c));
                for i in 0..N {
                    let a = load(ar[i].as_ptr().add(2 * c));
                    fmla(&mut acc[j][i], &w, &a);
                }
            }
        }
    }
    let mut res = [[0f32; N]; R];
    for j in 0..R {
        for i in 0..N {
            // SAFETY: FEAT_FP16 (caller).
            let red = unsafe { reduce(acc[j][i]) };
            res[j][i] = tail(red, wr[j], ar[i], np);
        }
    }
    res
}

/// Safe entry (`RowsFn`), handed out by [`rows`] only where the CPU has FEAT_FP16;
/// `Kernel::rows` checks the lengths.
fn entry(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let t = (
        tile::<4, 1> as Tile<4, 1>,
        tile::<1, 4> as Tile<1, 4>,
        tile::<1, 1> as Tile<1, 1>,
    );
    // SAFETY: `rows` returns this function only after detecting FEAT_FP16, and it is private
    // to this module otherwise; the rows hold `k` f16 each (checked by `Kernel::rows`).
    unsafe { drive(2 * k, w, rows, acts, m, out, t) }
}

/// The fp16-accumulating F16 kernel, where this CPU has FEAT_FP16 (detected at run time).
pub(super) fn rows() -> Option<RowsFn> {
    std::arch::is_aarch64_feature_detected!("fp16").then_some(entry as RowsFn)
}

/// The CPU's own binary16 fused multiply-add (`fmadd h`), for the twin's test.
///
/// # Safety
/// The CPU must have FEAT_FP16.
#[cfg(test)]
#[target_feature(enable = "fp16")]
pub(in super::super) unsafe fn fmadd(a: u16, b: u16, c: u16) -> u16 {
    let out: u16;
    // SAFETY: one register-only instruction; the caller vouches for FEAT_FP16.
    unsafe {
        asm!(
            "fmadd {o:h}, {a:h}, {b:h}, {c:h}",
            a = in(vreg) a,
            b = in(vreg) b,
            c = in(vreg) c,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}
