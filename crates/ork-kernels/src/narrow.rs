//! f32 → f16 (little-endian bytes, round-to-nearest-even) for the pack kernel's fp16 tiles.
//!
//! On aarch64 `fcvtn`/`fcvtn2` (Armv8.0 Advanced SIMD, always present; they round by FPCR, whose
//! mode Linux leaves at round-to-nearest-even, with subnormals kept: FZ clear) convert eight
//! values per step, where `half`'s conversion checks for FEAT_FP16 on every four. Elsewhere the
//! scalar twin runs ([`portable`]; ork-pack's x86 encoder keeps `half`'s slice conversion, which
//! uses F16C). Tested under qemu-aarch64 only, not timed (`docs/kernels.md`).

use half::f16;

/// `dst[2i..2i + 2]` = `src[i]` as fp16, little-endian, round-to-nearest-even
/// (`dst.len() == 2 · src.len()`). Values beyond fp16's range become ±Inf, NaN stays NaN.
#[inline]
pub fn f32_to_f16_le(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len(), "f32_to_f16_le: lengths differ");
    #[cfg(target_arch = "aarch64")]
    fcvtn(src, dst);
    #[cfg(not(target_arch = "aarch64"))]
    portable(src, dst);
}

/// The scalar twin: `half`'s conversion, one value at a time.
#[inline]
pub fn portable(src: &[f32], dst: &mut [u8]) {
    for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(x).to_le_bytes());
    }
}

/// The aarch64 loop (see the module docs).
#[cfg(target_arch = "aarch64")]
#[inline]
fn fcvtn(src: &[f32], dst: &mut [u8]) {
    use std::arch::aarch64::{uint16x8_t, vld1q_f32, vreinterpretq_u8_u16, vst1q_u8};
    let whole = src.len() - src.len() % 8;
    for (s, d) in src[..whole]
        .chunks_exact(8)
        .zip(dst[..2 * whole].chunks_exact_mut(16))
    {
        // SAFETY: `s` holds 8 f32 (32 bytes) and `d` 16 bytes (chunks_exact), which is what
        // the two loads and the store touch; `ld1`/`st1` take unaligned addresses; NEON is part
        // of the aarch64 baseline, and `fcvtn`/`fcvtn2` read and write vector registers only.
        // aarch64 Linux is little-endian, so lane order is byte order. (The intrinsics,
        // `vcvt_f16_f32`/`vcvt_high_f16_f32`, are stable only from Rust 1.94, above the
        // workspace's minimum.)
        unsafe {
            let (a, b) = (vld1q_f32(s.as_ptr()), vld1q_f32(s.as_ptr().add(4)));
            let h: uint16x8_t;
            std::arch::asm!(
                "fcvtn {h:v}.4h, {a:v}.4s",
                "fcvtn2 {h:v}.8h, {b:v}.4s",
                a = in(vreg) a,
                b = in(vreg) b,
                h = out(vreg) h,
                options(pure, nomem, nostack, preserves_flags)
            );
            vst1q_u8(d.as_mut_ptr(), vreinterpretq_u8_u16(h));
        }
    }
    portable(&src[whole..], &mut dst[2 * whole..]);
}

#[cfg(test)]
mod tests {
    use half::f16;

    /// The dispatched conversion (`fcvtn` on aarch64) equals the scalar twin bit for bit at
    /// every finite fp16 value, every midpoint between neighbours (the ties, rounded to even),
    /// one f32 step either side of each midpoint, values below fp16's smallest subnormal, the
    /// overflow edge, ±Inf and NaN (both signs), at every remainder length.
    #[test]
    fn narrowing_equals_half_s_at_every_fp16_value_and_tie() {
        let mut vals = Vec::new();
        for bits in 0..0x7bffu16 {
            let (v, up) = (
                f16::from_bits(bits).to_f32(),
                f16::from_bits(bits + 1).to_f32(),
            );
            let mid = (v + up) / 2.0; // exact: 12 significant bits
            let next = |x: f32, d: i32| f32::from_bits((x.to_bits() as i32 + d) as u32);
            for x in [v, mid, next(mid, -1), next(mid, 1), v * 1e-6] {
                vals.extend([x, -x]);
            }
        }
        for x in [65504.0, 65519.0, 65520.0, 1e6, f32::INFINITY, f32::NAN] {
            vals.extend([x, -x]);
        }
        let (mut got, mut want) = (vec![0u8; 2 * vals.len()], vec![0u8; 2 * vals.len()]);
        super::f32_to_f16_le(&vals, &mut got);
        super::portable(&vals, &mut want);
        for (i, (g, w)) in got.chunks_exact(2).zip(want.chunks_exact(2)).enumerate() {
            assert_eq!(g, w, "{}", vals[i]);
        }
        for len in 0..20 {
            let (mut g, mut w) = (vec![0u8; 2 * len], vec![0u8; 2 * len]);
            super::f32_to_f16_le(&vals[3..3 + len], &mut g);
            super::portable(&vals[3..3 + len], &mut w);
            assert_eq!(g, w, "len {len}");
        }
    }
}
