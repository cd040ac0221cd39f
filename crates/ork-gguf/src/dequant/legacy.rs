//! The 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Reference: ggml `ggml/src/ggml-quants.c` `dequantize_row_q4_0` … `dequantize_row_q8_0`;
//! layouts `block_q4_0` … `block_q8_0` in `ggml/src/ggml-common.h`. Within a block, value `j`
//! (0..16) comes from the low nibble of byte `j` and value `j + 16` from its high nibble; the
//! fifth bit of value `j` (Q5) is bit `j` of the little-endian u32 `qh`.

use super::{blocks, f16_at};

/// `block_q4_0`: f16 d, 16 bytes of nibbles; `y = (q - 8) * d`.
pub(super) fn q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<18, 32>(src, dst) {
        let d = f16_at(b, 0);
        let qs: &[u8; 16] = b[2..].try_into().unwrap();
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            lo[j] = (i32::from(qs[j] & 0x0F) - 8) as f32 * d;
            hi[j] = (i32::from(qs[j] >> 4) - 8) as f32 * d;
        }
    }
}

/// `block_q4_1`: f16 d, f16 m, 16 bytes of nibbles; `y = q * d + m`.
pub(super) fn q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<20, 32>(src, dst) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qs: &[u8; 16] = b[4..].try_into().unwrap();
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            lo[j] = f32::from(qs[j] & 0x0F) * d + m;
            hi[j] = f32::from(qs[j] >> 4) * d + m;
        }
    }
}

/// `block_q5_0`: f16 d, u32 qh, 16 bytes of nibbles; `y = (q - 16) * d`.
pub(super) fn q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<22, 32>(src, dst) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes(b[2..6].try_into().unwrap());
        let qs: &[u8; 16] = b[6..].try_into().unwrap();
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            lo[j] = ((u32::from(qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
            hi[j] = ((u32::from(qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }
}

/// `block_q5_1`: f16 d, f16 m, u32 qh, 16 bytes of nibbles; `y = q * d + m`.
pub(super) fn q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<24, 32>(src, dst) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let qs: &[u8; 16] = b[8..].try_into().unwrap();
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            lo[j] = (u32::from(qs[j] & 0x0F) | h0) as f32 * d + m;
            hi[j] = (u32::from(qs[j] >> 4) | h1) as f32 * d + m;
        }
    }
}

/// `block_q8_0`: f16 d, 32 × i8; `y = q * d`.
pub(super) fn q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<34, 32>(src, dst) {
        let d = f16_at(b, 0);
        let qs: &[u8; 32] = b[2..].try_into().unwrap();
        for j in 0..32 {
            y[j] = f32::from(qs[j] as i8) * d;
        }
    }
}
