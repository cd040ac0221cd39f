//! Open arbitrary bytes as an `.orkpack`, twice: as given, and "resealed" — header, footer and
//! index checksums recomputed — so mutations reach the index parser instead of stopping at a
//! checksum. Then load every entry. Any panic or out-of-memory is a bug: bad input must come
//! back as a `StoreError`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_store::format::{FOOTER_LEN, HEADER_LEN};
use ork_store::Orkpack;
use twox_hash::XxHash3_64;

/// Recompute the checksums the writer would have written, where the structure allows.
fn reseal(b: &mut [u8]) {
    let len = b.len();
    if len < HEADER_LEN + FOOTER_LEN {
        return;
    }
    let f = len - FOOTER_LEN;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (io, is) = (u64_at(b, f) as usize, u64_at(b, f + 8) as usize);
    if io.checked_add(is) == Some(f) {
        let h = XxHash3_64::oneshot(&b[io..f]);
        b[f + 16..f + 24].copy_from_slice(&h.to_le_bytes());
    }
    let h = XxHash3_64::oneshot(&b[f..f + 48]);
    b[f + 48..f + 56].copy_from_slice(&h.to_le_bytes());
    b[24..32].copy_from_slice(&(len as u64).to_le_bytes());
    let h = XxHash3_64::oneshot(&b[..56]);
    b[56..64].copy_from_slice(&h.to_le_bytes());
}

fn exercise(bytes: Vec<u8>) {
    let Ok(pack) = Orkpack::from_bytes("fuzz.orkpack", bytes) else {
        return;
    };
    for e in pack.entries() {
        assert_eq!(pack.entry(e.name()), Some(e));
        assert_eq!(pack.blob(e).len() as u64, e.blob_range().1);
        let _ = pack.scales(e);
        let _ = pack.load(e.name(), true);
    }
}

fuzz_target!(|data: &[u8]| {
    exercise(data.to_vec());
    let mut sealed = data.to_vec();
    reseal(&mut sealed);
    exercise(sealed);
});
