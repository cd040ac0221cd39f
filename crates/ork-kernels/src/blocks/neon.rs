//! aarch64 pieces the block kernels share: f16 widening of a register and the dot-product
//! instruction (`sdot`, issued by the tile kernels' helper).

pub(super) use crate::tile::neon::sdot;
use std::arch::aarch64::*;

/// f16 widening of a register, shared with the KV cache's ([`crate::widen`]).
pub(super) use crate::widen::widen_f16;

/// Two general registers as one vector (`fmov` + `mov v.d[1]`), in `asm!` so that the compiler
/// does not turn the loads that fill them back into a chain of lane loads (`ld1 {v.h}[j]`, each
/// waiting for the last: the critical path of the legacy loops under llvm-mca's model).
#[inline(always)]
fn join(lo: u64, hi: u64) -> uint16x8_t {
    let v: uint16x8_t;
    // SAFETY: register-only instructions of the aarch64 baseline.
    unsafe {
        std::arch::asm!(
            "fmov {v:d}, {lo}",
            "mov {v:v}.d[1], {hi}",
            lo = in(reg) lo,
            hi = in(reg) hi,
            v = out(vreg) v,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    v
}

/// Four `W`-bit fields (`W` 16 or 32) packed little-endian into a u64 from `f(0..4)` (fields
/// of 16 bits: only the first four fit; of 32: the first two).
#[inline(always)]
fn pack<const W: u32>(f: impl Fn(usize) -> u64) -> u64 {
    (0..(64 / W) as usize).fold(0, |acc, j| acc | f(j) << (W * j as u32))
}

/// The f16 at `p + j·stride` for j in 0..8, widened.
///
/// # Safety
/// Each of those 2-byte fields must be readable.
#[inline(always)]
pub(super) unsafe fn f16x8(p: *const u8, stride: usize) -> (float32x4_t, float32x4_t) {
    // SAFETY: the caller vouches for the eight fields.
    let h = |j: usize| u64::from(unsafe { p.add(j * stride).cast::<u16>().read_unaligned() });
    widen_f16(join(pack::<16>(h), pack::<16>(|j| h(4 + j))))
}

/// The f16 pairs `(d, m)` at `p + j·stride` for j in 0..8 (Q4_1/Q5_1's scale and min), each
/// widened: one 4-byte load per block instead of two lane loads.
///
/// # Safety
/// Each of those 4-byte fields must be readable.
#[inline(always)]
pub(super) unsafe fn f16x8_pairs(
    p: *const u8,
    stride: usize,
) -> ((float32x4_t, float32x4_t), (float32x4_t, float32x4_t)) {
    // SAFETY: the caller vouches for the eight fields.
    let w = |j: usize| u64::from(unsafe { p.add(j * stride).cast::<u32>().read_unaligned() });
    let a = join(pack::<32>(w), pack::<32>(|j| w(2 + j)));
    let b = join(pack::<32>(|j| w(4 + j)), pack::<32>(|j| w(6 + j)));
    // SAFETY: register-only; NEON is the aarch64 baseline.
    let (d, m) = unsafe { (vuzp1q_u16(a, b), vuzp2q_u16(a, b)) };
    (widen_f16(d), widen_f16(m))
}

/// The IEEE half with bits `h` as f32 (`fcvt`, Armv8.0 floating point), exact. `half`'s
/// conversion tests std_detect's fp16 bit on every call (a load and a branch), which the k-quant
/// loops paid once per scale; `fcvt` between half and single precision needs no FEAT_FP16.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let out: f32;
    // SAFETY: one register-only instruction of the aarch64 baseline.
    unsafe {
        std::arch::asm!(
            "fcvt {o:s}, {h:h}",
            h = in(vreg) h,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}
