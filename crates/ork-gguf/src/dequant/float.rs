//! Plain float types: F32, F16, BF16 (`ggml_fp16_to_fp32_row`, `ggml_bf16_to_fp32_row` in
//! ggml's `ggml.c`; gguf-py `quants.py` `dequantize` / class `BF16`).

use half::slice::HalfFloatSliceExt;

/// Values converted per step of the F16 path (a stack buffer, no allocation).
const CHUNK: usize = 256;

pub(super) fn f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in super::blocks::<4, 1>(src, dst) {
        y[0] = f32::from_le_bytes(*b);
    }
}

pub(super) fn f16(src: &[u8], dst: &mut [f32]) {
    let mut halves = [half::f16::ZERO; CHUNK];
    for (s, y) in src.chunks(2 * CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let h = &mut halves[..y.len()];
        for (h, b) in h.iter_mut().zip(s.chunks_exact(2)) {
            *h = half::f16::from_le_bytes([b[0], b[1]]);
        }
        // The slice conversion uses F16C / NEON fp16 where the CPU has it; exact either way.
        h.convert_to_f32_slice(y);
    }
}

pub(super) fn bf16(src: &[u8], dst: &mut [f32]) {
    for (b, y) in super::blocks::<2, 1>(src, dst) {
        y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
    }
}
