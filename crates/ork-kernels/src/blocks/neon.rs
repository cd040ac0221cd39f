//! aarch64 pieces the block kernels share: f16 widening of a register and the dot-product
//! instruction (`sdot`, issued by the tile kernels' helper).

pub(super) use crate::tile::neon::sdot;
use std::arch::aarch64::*;

/// The eight f16 in `h` as two f32 vectors (`fcvtl`, `fcvtl2`: Armv8.0 Advanced SIMD; their
/// intrinsics are stable only from Rust 1.94, above the workspace's minimum). Exact.
#[inline(always)]
pub(super) fn widen_f16(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register-only instructions of the aarch64 baseline.
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    (lo, hi)
}

/// The f16 at `p + j·stride` for j in 0..8, widened.
///
/// # Safety
/// Each of those 2-byte fields must be readable.
#[inline(always)]
pub(super) unsafe fn f16x8(p: *const u8, stride: usize) -> (float32x4_t, float32x4_t) {
    // SAFETY: the caller vouches for the eight fields; the array is 16 bytes.
    let h: [u16; 8] =
        std::array::from_fn(|j| unsafe { p.add(j * stride).cast::<u16>().read_unaligned() });
    // SAFETY: `h` is 16 readable bytes.
    widen_f16(unsafe { vld1q_u16(h.as_ptr()) })
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
