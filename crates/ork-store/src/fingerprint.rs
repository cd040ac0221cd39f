//! Source fingerprints: the staleness key of an entry.
//!
//! A fingerprint must change when the source tensor's values change even if its name, shape and
//! type stay the same (a fine-tune), yet stay cheap on multi-GB models. It is the xxh3-64 of
//! the ggml type id, the dims, the byte length, and a sample of the bytes: all of them up to
//! [`FULL_HASH_LIMIT`], otherwise the first and last 64 KiB plus 16 evenly spaced 4 KiB windows
//! (200 KiB read per tensor whatever its size). A fine-tune changes essentially every block, so
//! any sample catches it; a change confined to unsampled bytes is not detected (documented in
//! docs/orkpack.md).

use crate::checksum::Xxh3Stream;
use ork_gguf::{GgufFile, TensorInfo};

/// Tensors up to this many bytes are hashed completely.
pub const FULL_HASH_LIMIT: usize = 256 * 1024;
const EDGE: usize = 64 * 1024;
const WINDOW: usize = 4 * 1024;
const WINDOWS: usize = 16;
/// Domain-separation seed, so a fingerprint never equals a plain xxh3 of the same bytes.
const SEED: u64 = 0x6f72_6b5f_6670_0001; // "ork_fp" v1

/// Fingerprint of a GGUF tensor (see the module docs for what is hashed).
pub fn fingerprint(file: &GgufFile, t: &TensorInfo) -> u64 {
    fingerprint_bytes(t.ty.id(), &t.dims, file.tensor_data(t))
}

/// Fingerprint of a tensor given its ggml type id, dims and data bytes.
pub fn fingerprint_bytes(ggml_type: u32, dims: &[u64], data: &[u8]) -> u64 {
    let mut h = Xxh3Stream::with_seed(SEED);
    h.update(&ggml_type.to_le_bytes());
    h.update(&(dims.len() as u64).to_le_bytes());
    for d in dims {
        h.update(&d.to_le_bytes());
    }
    h.update(&(data.len() as u64).to_le_bytes());
    let len = data.len();
    if len <= FULL_HASH_LIMIT {
        h.update(data);
    } else {
        h.update(&data[..EDGE]);
        // Windows spread evenly over the middle part [EDGE, len - EDGE - WINDOW].
        let span = len - 2 * EDGE - WINDOW;
        for i in 0..WINDOWS {
            let at = EDGE + span * i / (WINDOWS - 1);
            h.update(&data[at..at + WINDOW]);
        }
        h.update(&data[len - EDGE..]);
    }
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ salt)
            .collect()
    }

    #[test]
    fn small_tensors_hash_every_byte() {
        let a = bytes(FULL_HASH_LIMIT, 0);
        for at in [0, 1, FULL_HASH_LIMIT / 2, FULL_HASH_LIMIT - 1] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_ne!(
                fingerprint_bytes(3, &[64, 8], &a),
                fingerprint_bytes(3, &[64, 8], &b)
            );
        }
    }

    #[test]
    fn large_tensors_hash_edges_and_windows() {
        let len = 10 << 20;
        let a = bytes(len, 0);
        let base = fingerprint_bytes(3, &[4096, 4096], &a);
        // Edges and every window start are sampled.
        let span = len - 2 * EDGE - WINDOW;
        let mut sampled = vec![0, EDGE - 1, len - 1, len - EDGE];
        sampled.extend((0..WINDOWS).map(|i| EDGE + span * i / (WINDOWS - 1)));
        for at in sampled {
            let mut b = a.clone();
            b[at] ^= 0x80;
            assert_ne!(base, fingerprint_bytes(3, &[4096, 4096], &b), "byte {at}");
        }
        // A whole-tensor change (fine-tune) is caught.
        assert_ne!(base, fingerprint_bytes(3, &[4096, 4096], &bytes(len, 7)));
    }

    #[test]
    fn type_dims_and_length_are_part_of_the_key() {
        let a = bytes(4096, 0);
        let f = fingerprint_bytes(3, &[64, 8], &a);
        assert_ne!(f, fingerprint_bytes(2, &[64, 8], &a));
        assert_ne!(f, fingerprint_bytes(3, &[8, 64], &a));
        assert_ne!(f, fingerprint_bytes(3, &[64, 8, 1], &a));
        assert_ne!(f, fingerprint_bytes(3, &[64, 8], &a[..4095]));
        assert_eq!(f, fingerprint_bytes(3, &[64, 8], &a.clone()));
    }
}
