//! Activation quantizers (ggml's `quantize_row_q8_0`, `quantize_row_q8_1`, `quantize_row_q8_K`,
//! f16/bf16/f32 copies), each with its scalar twin.
//!
//! **Q8_0 / Q8_1** follow ggml-cpu's x86 path (`ggml-cpu/arch/x86/quants.c`, the one llama.cpp
//! runs on x86): per block of 32, `amax = max |x|`, `d = amax / 127` stored as f16 (round to
//! nearest even), `id = 127 / amax` (0 when `amax` is 0), `q = round_half_even(x · id)`, and for
//! Q8_1 `s = f16(d · Σq)` with the unrounded f32 `d` and the rounded `q`. ggml's reference
//! (`quantize_row_q8_0_ref`, gguf-py) uses `id = 1/d` and `roundf` (half away from zero), its
//! NEON path `id = 1/d` and round-half-even; these differ from the x86 bytes only where
//! `x · id` lands on or next to a half. ork writes the x86 bytes on every ISA.
//!
//! Rules beyond ggml (whose C converts NaN or an overflowing `x · id` to int8 with undefined
//! behaviour): a block holding a NaN or an infinity stores `d = s = NaN` and `q = 0`, so every
//! output of that activation row is NaN; a block whose `127 / amax` overflows (`amax` below
//! about 3.7e-37, so `d` is 0 in f16 anyway) stores `q = 0`.
//!
//! **F16 / BF16** round to nearest even (ggml's `GGML_FP32_TO_FP16` / `GGML_FP32_TO_BF16`); a
//! NaN stays a NaN (bf16: quiet, as ggml). **F32** is a copy. These three have one scalar
//! routine for every ISA (a conversion pass, not the matmul's hot loop).

use super::{ActType, Isa, QuantFn};
use half::{bf16, f16};

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

/// The quantizer for `act` on `isa`, if that ISA has one and this CPU runs it.
pub(super) fn quantizer(act: ActType, isa: Isa) -> Option<QuantFn> {
    if !Isa::available().contains(&isa) {
        return None;
    }
    match act {
        ActType::Q8_0 => q8(isa, false),
        ActType::Q8_1 => q8(isa, true),
        ActType::Q8_K => super::act_k::quantizer(isa),
        ActType::F16 => Some(to_f16 as QuantFn),
        ActType::BF16 => Some(to_bf16 as QuantFn),
        ActType::F32 => Some(to_f32 as QuantFn),
    }
}

/// Q8_0 (`sum == false`) or Q8_1 on `isa`.
fn q8(isa: Isa, sum: bool) -> Option<QuantFn> {
    match isa {
        Isa::Scalar => Some(if sum { q8_1_scalar } else { q8_0_scalar }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => x86::q8(sum),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDot => Some(if sum { neon::q8_1 } else { neon::q8_0 }),
        _ => None,
    }
}

/// The per-block constants of the quantization: `(d as stored, id)`, or `None` for a block
/// with a NaN or an infinity (module docs). `amax` is `max |x|` over the finite block.
#[inline]
pub(super) fn scale(amax: f32, finite: bool) -> Option<(f32, f32)> {
    if !finite {
        return None;
    }
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    Some((d, if id.is_finite() { id } else { 0.0 }))
}

/// Write a block's header: `d` (and for Q8_1 `s = d · Σq`) as f16; `None` writes NaN.
#[inline]
pub(super) fn header(dst: &mut [u8], d: Option<f32>, qsum: i32, sum: bool) {
    let (dh, sh) = match d {
        Some(d) => (f16::from_f32(d), f16::from_f32(d * qsum as f32)),
        None => (f16::NAN, f16::NAN),
    };
    dst[..2].copy_from_slice(&dh.to_le_bytes());
    if sum {
        dst[2..4].copy_from_slice(&sh.to_le_bytes());
    }
}

/// The scalar twin of Q8_0 / Q8_1 (`sum`).
fn q8_scalar(x: &[f32], dst: &mut [u8], sum: bool) {
    let (len, bytes) = if sum { (32, 36) } else { (32, 34) };
    let qs = bytes - 32;
    for (xb, yb) in x.chunks_exact(len).zip(dst.chunks_exact_mut(bytes)) {
        let finite = xb.iter().all(|v| v.is_finite());
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sc = scale(amax, finite);
        let id = sc.map_or(0.0, |(_, id)| id);
        let mut qsum = 0;
        for (q, &v) in yb[qs..].iter_mut().zip(xb) {
            let r = if sc.is_some() {
                (v * id).round_ties_even() as i32
            } else {
                0
            };
            qsum += r;
            *q = r as i8 as u8;
        }
        header(yb, sc.map(|(d, _)| d), qsum, sum);
    }
}

fn q8_0_scalar(x: &[f32], dst: &mut [u8]) {
    q8_scalar(x, dst, false)
}

fn q8_1_scalar(x: &[f32], dst: &mut [u8]) {
    q8_scalar(x, dst, true)
}

fn to_f16(x: &[f32], dst: &mut [u8]) {
    for (v, d) in x.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
    }
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even; a NaN keeps its top bits, made quiet.
fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

fn to_bf16(x: &[f32], dst: &mut [u8]) {
    for (v, d) in x.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&bf16::from_bits(bf16_bits(*v)).to_le_bytes());
    }
}

fn to_f32(x: &[f32], dst: &mut [u8]) {
    for (v, d) in x.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
