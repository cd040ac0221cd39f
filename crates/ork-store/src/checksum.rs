//! XXH3-64, the one checksum of the format (blobs, scales, index, header, footer, fingerprints).
//!
//! Computed with `twox-hash`, which picks AVX2 / SSE2 / NEON at run time: a default x86-64 build
//! then hashes a cached chunk at AVX2 speed, which is what keeps a verified load close to a plain
//! memcpy (`xxhash-rust` selects its SIMD path at compile time only, i.e. SSE2 on a default
//! build). The values are the standard XXH3-64 ones (seed 0 unless stated).

use std::hash::Hasher;

use twox_hash::XxHash3_64;

/// XXH3-64 of `bytes`.
pub(crate) fn xxh3(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// Streaming XXH3-64; equal to [`xxh3`] of the concatenated input.
pub(crate) struct Xxh3Stream(XxHash3_64);

impl Xxh3Stream {
    /// Seed 0.
    pub(crate) fn new() -> Self {
        Xxh3Stream(XxHash3_64::new())
    }
    /// With a seed.
    pub(crate) fn with_seed(seed: u64) -> Self {
        Xxh3Stream(XxHash3_64::with_seed(seed))
    }
    /// Feed bytes.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
    /// The hash of everything fed so far.
    pub(crate) fn digest(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_streaming_agree() {
        // Reference values of XXH3-64 (seed 0) from the xxHash test vectors.
        assert_eq!(xxh3(b""), 0x2D06_8005_38D3_94C2);
        let data: Vec<u8> = (0..1_000_003u32)
            .map(|i| i.wrapping_mul(2654435761) as u8)
            .collect();
        for piece in [1, 63, 64, 1000, 4096, 1 << 20] {
            let mut s = Xxh3Stream::new();
            for c in data.chunks(piece) {
                s.update(c);
            }
            assert_eq!(s.digest(), xxh3(&data), "piece {piece}");
        }
        let mut s = Xxh3Stream::with_seed(7);
        s.update(&data);
        assert_eq!(s.digest(), XxHash3_64::oneshot_with_seed(7, &data));
        assert_ne!(s.digest(), xxh3(&data));
    }
}
