//! The k-quants: 256-value super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//!
//! Reference: ggml `ggml/src/ggml-quants.c` `dequantize_row_q2_K` … `dequantize_row_q6_K` and
//! `get_scale_min_k4`; layouts `block_q2_K` … `block_q6_K` in `ggml/src/ggml-common.h`
//! (`QK_K = 256`). Scales are applied as ggml does: the sub-block factor `d * sc` (and
//! `dmin * m`) is formed first, then multiplied by the quant.

use super::{blocks, f16_at};

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes
/// of Q4_K / Q5_K.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `block_q2_K`: scales[16] (low nibble scale, high nibble min), qs[64] (2-bit), f16 d, f16 dmin.
/// Value `i` uses the bits `2·((i % 128) / 32)` of `qs[(i / 128)·32 + i % 32]` and sub-block
/// `i / 16`; `y = (d·sc) · q − (dmin·m)`.
pub(super) fn q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<84, 256>(src, dst) {
        let scales: &[u8; 16] = b[0..16].try_into().unwrap();
        let qs: &[u8; 64] = b[16..80].try_into().unwrap();
        let d = f16_at(b, 80);
        let dmin = f16_at(b, 82);
        for half in 0..2 {
            let q: &[u8; 32] = qs[half * 32..half * 32 + 32].try_into().unwrap();
            for shift in 0..4 {
                for sub in 0..2 {
                    let sc = scales[half * 8 + shift * 2 + sub];
                    let dl = d * f32::from(sc & 0x0F);
                    let ml = dmin * f32::from(sc >> 4);
                    let base = half * 128 + shift * 32 + sub * 16;
                    let out: &mut [f32; 16] = (&mut y[base..base + 16]).try_into().unwrap();
                    let q: &[u8; 16] = q[sub * 16..sub * 16 + 16].try_into().unwrap();
                    for l in 0..16 {
                        out[l] = dl * f32::from((q[l] >> (2 * shift)) & 3) - ml;
                    }
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of Q3_K: low 4 bits from `s[j % 8]` (nibble `j / 8`), high 2 bits
/// from `s[8 + j % 4]` (bits `2·(j / 4)`), minus 32.
#[inline(always)]
fn q3_k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// `block_q3_K`: hmask[32], qs[64] (2-bit), scales[12] (6-bit, packed), f16 d.
/// Value `i`: low bits as in Q2_K; bit `i / 32` of `hmask[i % 32]` clear means subtract 4;
/// `y = (d·sc) · q`.
pub(super) fn q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<110, 256>(src, dst) {
        let hmask: &[u8; 32] = b[0..32].try_into().unwrap();
        let qs: &[u8; 64] = b[32..96].try_into().unwrap();
        let scales = q3_k_scales(b[96..108].try_into().unwrap());
        let d = f16_at(b, 108);
        for half in 0..2 {
            let q: &[u8; 32] = qs[half * 32..half * 32 + 32].try_into().unwrap();
            for shift in 0..4 {
                let bit = half * 4 + shift;
                for sub in 0..2 {
                    let dl = d * f32::from(scales[half * 8 + shift * 2 + sub]);
                    let base = half * 128 + shift * 32 + sub * 16;
                    let out: &mut [f32; 16] = (&mut y[base..base + 16]).try_into().unwrap();
                    let q: &[u8; 16] = q[sub * 16..sub * 16 + 16].try_into().unwrap();
                    let h: &[u8; 16] = hmask[sub * 16..sub * 16 + 16].try_into().unwrap();
                    for l in 0..16 {
                        let low = i32::from((q[l] >> (2 * shift)) & 3);
                        let minus = if (h[l] >> bit) & 1 == 0 { 4 } else { 0 };
                        out[l] = dl * (low - minus) as f32;
                    }
                }
            }
        }
    }
}

/// `block_q4_K`: f16 d, f16 dmin, scales[12] (6-bit scale/min pairs), qs[128] (nibbles).
/// Sub-block `j` (32 values) takes nibble `j % 2` of `qs[(j / 2)·32 ..][..32]`;
/// `y = (d·sc) · q − (dmin·m)`.
pub(super) fn q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<144, 256>(src, dst) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales: &[u8; 12] = b[4..16].try_into().unwrap();
        let qs: &[u8; 128] = b[16..144].try_into().unwrap();
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            let d1 = d * f32::from(sc);
            let m1 = dmin * f32::from(m);
            let q: &[u8; 32] = qs[(j / 2) * 32..(j / 2) * 32 + 32].try_into().unwrap();
            let out: &mut [f32; 32] = (&mut y[j * 32..j * 32 + 32]).try_into().unwrap();
            let shift = 4 * (j % 2);
            for l in 0..32 {
                out[l] = d1 * f32::from((q[l] >> shift) & 0x0F) - m1;
            }
        }
    }
}

/// `block_q5_K`: f16 d, f16 dmin, scales[12], qh[32], qs[128]. As Q4_K with a fifth bit:
/// bit `j` of `qh[l]` for value `l` of sub-block `j`.
pub(super) fn q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<176, 256>(src, dst) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales: &[u8; 12] = b[4..16].try_into().unwrap();
        let qh: &[u8; 32] = b[16..48].try_into().unwrap();
        let qs: &[u8; 128] = b[48..176].try_into().unwrap();
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            let d1 = d * f32::from(sc);
            let m1 = dmin * f32::from(m);
            let q: &[u8; 32] = qs[(j / 2) * 32..(j / 2) * 32 + 32].try_into().unwrap();
            let out: &mut [f32; 32] = (&mut y[j * 32..j * 32 + 32]).try_into().unwrap();
            let shift = 4 * (j % 2);
            for l in 0..32 {
                let v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
                out[l] = d1 * f32::from(v) - m1;
            }
        }
    }
}

/// `block_q6_K`: ql[128] (low nibbles), qh[64] (2 high bits), scales[16] (i8), f16 d.
/// In half `h` (128 values), value `r` takes nibble `r / 64` of `ql[h·64 + r % 64]` and bits
/// `2·(r / 32)` of `qh[h·32 + r % 32]`; `y = (d·sc) · (q − 32)`.
pub(super) fn q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<210, 256>(src, dst) {
        let ql: &[u8; 128] = b[0..128].try_into().unwrap();
        let qh: &[u8; 64] = b[128..192].try_into().unwrap();
        let scales: &[u8; 16] = b[192..208].try_into().unwrap();
        let d = f16_at(b, 208);
        for half in 0..2 {
            let ql: &[u8; 64] = ql[half * 64..half * 64 + 64].try_into().unwrap();
            let qh: &[u8; 32] = qh[half * 32..half * 32 + 32].try_into().unwrap();
            for quarter in 0..4 {
                let lo_base = (quarter % 2) * 32;
                let lo_shift = 4 * (quarter / 2);
                let hi_shift = 2 * quarter;
                for sub in 0..2 {
                    let dl = d * f32::from(scales[half * 8 + quarter * 2 + sub] as i8);
                    let base = half * 128 + quarter * 32 + sub * 16;
                    let out: &mut [f32; 16] = (&mut y[base..base + 16]).try_into().unwrap();
                    let ql: &[u8; 16] = ql[lo_base + sub * 16..lo_base + sub * 16 + 16]
                        .try_into()
                        .unwrap();
                    let qh: &[u8; 16] = qh[sub * 16..sub * 16 + 16].try_into().unwrap();
                    for l in 0..16 {
                        let low = (ql[l] >> lo_shift) & 0x0F;
                        let high = (qh[l] >> hi_shift) & 0x03;
                        out[l] = dl * (i32::from(low | (high << 4)) - 32) as f32;
                    }
                }
            }
        }
    }
}
