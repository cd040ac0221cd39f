//! Synthetic source weights shared by the pack bench and the throughput example.

use half::f16;

/// Deterministic Q4_1 blocks for an `n × k` weight: f16 d and m in a typical range, random nibbles.
pub fn q4_1_blocks(k: usize, n: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(k / 32 * n * 20);
    for _ in 0..k / 32 * n {
        let r = next();
        let d = f16::from_f32(0.001 + (r & 0xFFFF) as f32 / 65536.0 * 0.01);
        let m = f16::from_f32(-8.0 * d.to_f32() * (1.0 + ((r >> 16) & 0xFF) as f32 / 1024.0));
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&m.to_le_bytes());
        out.extend_from_slice(&next().to_le_bytes());
        out.extend_from_slice(&next().to_le_bytes());
    }
    out
}
