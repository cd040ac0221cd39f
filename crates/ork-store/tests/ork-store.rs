//! Integration tests of the `.orkpack` format, writer and reader.
//!
//! Crash tests re-run this test binary as a child process (the ignored `child_writer` test,
//! selected with `--exact --ignored` and driven by environment variables) and kill it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ork_pack::{LayoutId, PackDtype, PackedWeight, TiledLayout};
use ork_store::format::{FileHeader, Footer, FOOTER_LEN, HEADER_LEN};
use ork_store::{
    check_entry_key, EntryKey, EntryStatus, ModelIdentity, Orkpack, OrkpackWriter, SourceInfo,
    StoreError,
};
use ork_testkit::SmallFs;
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::{FromBytes, IntoBytes};

#[path = "ork-store/gguf_model.rs"]
mod gguf_model;
#[path = "ork-store/target.rs"]
mod target;

/// A deterministic synthetic packed weight.
fn weight(dtype: PackDtype, k: usize, n: usize, seed: u32) -> PackedWeight {
    let layout = TiledLayout::new(dtype, k, n);
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    let data = (0..layout.blob_bytes())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let scales = (0..n)
        .map(|i| (i as f32 + 1.0) * 0.001 + seed as f32)
        .collect();
    PackedWeight {
        layout,
        data,
        scales,
        group: ork_pack::ScaleGroup::PerChannel,
    }
}

fn source(i: u64) -> SourceInfo {
    SourceInfo {
        fingerprint: 0x1234_5678_9abc_def0 ^ i,
        ggml_type: 3,
    }
}

/// One test entry: name, weight, source.
type Sample = (String, PackedWeight, SourceInfo);

/// Entries of a small test pack.
fn sample_entries() -> Vec<Sample> {
    let shapes = [
        (PackDtype::I8, 64, 32),
        (PackDtype::I4, 96, 64),
        (PackDtype::F16, 40, 20), // K and N not aligned: padded
        (PackDtype::I8, 576, 96),
        (PackDtype::I4, 33, 1),
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(d, k, n))| {
            (
                format!("blk.{i}.ffn_up.weight"),
                weight(d, k, n, i as u32),
                source(i as u64),
            )
        })
        .collect()
}

fn write_pack(path: &Path, entries: &[Sample]) {
    let mut w = OrkpackWriter::create(path).unwrap();
    w.set_model_identity(ModelIdentity {
        file_len: 98_362_432,
        fingerprint: 42,
    });
    for (name, pw, src) in entries {
        w.add(name, pw, *src).unwrap();
    }
    w.finish().unwrap();
}

/// Files in `dir` other than `keep`.
fn other_files(dir: &Path, keep: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != keep)
        .collect()
}

#[test]
fn roundtrip_preserves_bytes_scales_and_meta() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries);
    assert!(
        other_files(dir.path(), &path).is_empty(),
        "temp left behind"
    );

    let pack = Orkpack::open(&path).unwrap();
    assert_eq!(
        pack.model_identity(),
        Some(ModelIdentity {
            file_len: 98_362_432,
            fingerprint: 42
        })
    );
    assert_eq!(pack.entries().len(), entries.len());
    for (i, (name, pw, src)) in entries.iter().enumerate() {
        let e = pack.entry(name).unwrap();
        assert_eq!(pack.entries()[i].name(), name, "file order kept");
        assert_eq!(e.layout(), pw.layout);
        assert_eq!(e.layout_id(), LayoutId::Rk3588NativeB);
        assert_eq!(e.source(), *src);
        let (off, size) = e.blob_range();
        assert_eq!(off % 4096, 0, "blob page-aligned");
        assert_eq!(size as usize, pw.layout.blob_bytes());
        assert_eq!(pack.blob(e), &pw.data[..]);
        assert_eq!(pack.scales(e).unwrap(), pw.scales);
        let mut dst = vec![0u8; size as usize];
        pack.load_into(e, &mut dst, true).unwrap();
        assert_eq!(dst, pw.data);
        assert_eq!(&pack.load(name, true).unwrap(), pw);
        assert_eq!(&pack.load(name, false).unwrap(), pw);
        let key = EntryKey {
            layout: pw.layout,
            layout_id: LayoutId::Rk3588NativeB,
            source: *src,
            group: pw.group,
        };
        assert_eq!(check_entry_key(&pack, e, &key), EntryStatus::Valid);
        assert!(pack.load_keyed(name, &key, true).is_ok());
    }
    assert!(matches!(
        pack.load("nope", true),
        Err(StoreError::MissingEntry { .. })
    ));
    let e = pack.entries()[0].clone();
    let mut short = vec![0u8; 3];
    assert!(matches!(
        pack.load_into(&e, &mut short, true),
        Err(StoreError::BufferSize { .. })
    ));
}

/// A blob is hashed until it has once matched its checksum; after that a load is a plain copy
/// while the file's modification time is the one it had when opened, and every load is hashed
/// again once the file has been written to in place.
#[test]
fn a_verified_blob_is_rehashed_only_after_the_file_is_written_to() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // An old modification time, so that any write below moves it whatever the clock's
    // granularity.
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 30);
    file.set_modified(old).unwrap();
    let pack = Orkpack::open(&path).unwrap();
    let (name, pw, _) = &entries[3];
    let e = pack.entry(name).unwrap();
    let (off, size) = e.blob_range();
    let mut dst = vec![0u8; size as usize];
    pack.load_into(e, &mut dst, true).unwrap();
    assert_eq!(dst, pw.data, "first load: hashed and verified");

    // A flipped byte hidden from the modification time: the verified entry is copied, not
    // hashed, so it passes. This is the documented trade (the pack's bytes are trusted while
    // the file is unchanged since open).
    let flipped = pw.data[5] ^ 0xff;
    file.write_at(&[flipped], off + 5).unwrap();
    file.set_modified(old).unwrap();
    pack.load_into(e, &mut dst, true).unwrap();
    assert_eq!(
        dst[5], flipped,
        "a verified blob is a plain copy while the file is unchanged"
    );

    // A write that moves the modification time: every load is hashed again.
    file.write_at(&[flipped], off + 5).unwrap();
    assert!(matches!(
        pack.load_into(e, &mut dst, true),
        Err(StoreError::CorruptBlob { tensor, .. }) if tensor == *name
    ));
    // Restored bytes verify again (the file stays changed, so they are hashed each time).
    file.write_at(&pw.data[5..6], off + 5).unwrap();
    for _ in 0..2 {
        pack.load_into(e, &mut dst, true).unwrap();
        assert_eq!(dst, pw.data);
    }
    // An entry never loaded before the write is hashed on its first load, as always.
    let (name2, pw2, _) = &entries[0];
    let e2 = pack.entry(name2).unwrap();
    let (off2, size2) = e2.blob_range();
    file.write_at(&[pw2.data[0] ^ 1], off2).unwrap();
    let mut dst2 = vec![0u8; size2 as usize];
    assert!(matches!(
        pack.load_into(e2, &mut dst2, true),
        Err(StoreError::CorruptBlob { .. })
    ));
}

#[test]
fn in_memory_image_reads_like_the_file() {
    let (bytes, entries) = valid_pack_bytes();
    let pack = Orkpack::from_bytes("image.orkpack", bytes).unwrap();
    assert_eq!(pack.path(), Path::new("image.orkpack"));
    for (name, pw, _) in &entries {
        assert_eq!(&pack.load(name, true).unwrap(), pw);
    }
    assert!(matches!(
        Orkpack::from_bytes("empty", Vec::new()),
        Err(StoreError::Truncated { actual: 0, .. })
    ));
}

#[test]
fn empty_pack_roundtrips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.orkpack");
    OrkpackWriter::create(&path).unwrap().finish().unwrap();
    let pack = Orkpack::open(&path).unwrap();
    assert!(pack.entries().is_empty());
    assert_eq!(pack.model_identity(), None);
}

#[test]
fn writer_refuses_bad_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.orkpack");
    let mut w = OrkpackWriter::create(&path).unwrap();
    let good = weight(PackDtype::I8, 64, 32, 1);
    w.add("a", &good, source(0)).unwrap();
    assert!(matches!(
        w.add("a", &good, source(0)),
        Err(StoreError::InvalidEntry { .. })
    ));
    let mut short = good.clone();
    short.data.pop();
    assert!(matches!(
        w.add("b", &short, source(0)),
        Err(StoreError::InvalidEntry { .. })
    ));
    let mut few_scales = good.clone();
    few_scales.scales.pop();
    assert!(matches!(
        w.add("c", &few_scales, source(0)),
        Err(StoreError::InvalidEntry { .. })
    ));
    assert!(matches!(
        w.add("", &good, source(0)),
        Err(StoreError::InvalidEntry { .. })
    ));
    assert_eq!(w.len(), 1);
    w.finish().unwrap();
    assert_eq!(Orkpack::open(&path).unwrap().entries().len(), 1);
}

/// A valid pack's bytes plus the entries it was written from.
fn valid_pack_bytes() -> (Vec<u8>, Vec<Sample>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries);
    (std::fs::read(&path).unwrap(), entries)
}

fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, PathBuf, Result<Orkpack, StoreError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.orkpack");
    std::fs::write(&path, bytes).unwrap();
    let r = Orkpack::open(&path);
    (dir, path, r)
}

#[test]
fn flipped_blob_byte_is_refused_naming_the_tensor() {
    let (mut bytes, entries) = valid_pack_bytes();
    let (_d, _p, pack) = open_bytes(&bytes);
    let pack = pack.unwrap();
    let victim = &entries[3].0;
    let (off, size) = pack.entry(victim).unwrap().blob_range();
    bytes[(off + size / 2) as usize] ^= 0x10;
    let (_d, _p, pack) = open_bytes(&bytes);
    let pack = pack.expect("blob damage is found on load, not on open");
    match pack.load(victim, true) {
        Err(StoreError::CorruptBlob { tensor, .. }) => assert_eq!(&tensor, victim),
        other => panic!("expected CorruptBlob, got {other:?}"),
    }
    let e = pack.entry(victim).unwrap();
    let key = EntryKey {
        layout: e.layout(),
        layout_id: e.layout_id(),
        source: e.source(),
        group: e.group(),
    };
    assert!(matches!(
        check_entry_key(&pack, e, &key),
        EntryStatus::Corrupt { .. }
    ));
    // Unverified loads do not check (that is what `verify = false` means); others are intact.
    assert!(pack.load(victim, false).is_ok());
    assert_eq!(&pack.load(&entries[0].0, true).unwrap(), &entries[0].1);
}

#[test]
fn flipped_scale_byte_is_refused() {
    let (mut bytes, entries) = valid_pack_bytes();
    let (_d, _p, pack) = open_bytes(&bytes);
    let (off, _) = pack.unwrap().entry(&entries[1].0).unwrap().scale_range();
    bytes[off as usize + 1] ^= 1;
    let (_d, _p, pack) = open_bytes(&bytes);
    let pack = pack.unwrap();
    let e = pack.entry(&entries[1].0).unwrap();
    assert!(matches!(
        pack.scales(e),
        Err(StoreError::CorruptBlob { .. })
    ));
    assert!(matches!(
        pack.load(&entries[1].0, true),
        Err(StoreError::CorruptBlob { .. })
    ));
}

#[test]
fn flipped_index_byte_fails_open() {
    let (bytes, _) = valid_pack_bytes();
    let footer = Footer::read_from_bytes(&bytes[bytes.len() - FOOTER_LEN..]).unwrap();
    let (io, is) = (footer.index_offset.get(), footer.index_size.get());
    for at in [io, io + 8, io + is / 2, io + is - 1] {
        let mut b = bytes.clone();
        b[at as usize] ^= 0x01;
        let (_d, _p, r) = open_bytes(&b);
        assert!(
            matches!(r, Err(StoreError::CorruptIndex { .. })),
            "byte {at}: {:?}",
            r.err()
        );
    }
    // Footer and header damage too.
    for at in [bytes.len() - FOOTER_LEN, bytes.len() - 20, 30] {
        let mut b = bytes.clone();
        b[at] ^= 0x01;
        let (_d, _p, r) = open_bytes(&b);
        assert!(
            matches!(r, Err(StoreError::CorruptIndex { .. })),
            "byte {at}"
        );
    }
}

#[test]
fn truncated_file_fails_open() {
    let (bytes, _) = valid_pack_bytes();
    let len = bytes.len();
    for cut in [
        0,
        3,
        8,
        HEADER_LEN - 1,
        HEADER_LEN,
        4096,
        5000,
        len / 2,
        len - FOOTER_LEN,
        len - 1,
    ] {
        let (_d, _p, r) = open_bytes(&bytes[..cut]);
        match r {
            Err(StoreError::Truncated { actual, .. }) => assert_eq!(actual, cut as u64),
            other => panic!("cut at {cut}: expected Truncated, got {:?}", other.err()),
        }
    }
    // Extra bytes after the footer are not a valid file either.
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 10]);
    let (_d, _p, r) = open_bytes(&longer);
    assert!(matches!(r, Err(StoreError::CorruptIndex { .. })));
}

/// Rewrite the header of `bytes` through `f`, re-sealing its checksum.
fn edit_header(bytes: &mut [u8], f: impl FnOnce(&mut FileHeader)) {
    let mut h = FileHeader::read_from_bytes(&bytes[..HEADER_LEN]).unwrap();
    f(&mut h);
    h.checksum.set(xxh3_64(h.checksum_input()));
    bytes[..HEADER_LEN].copy_from_slice(h.as_bytes());
}

#[test]
fn wrong_version_is_unsupported() {
    let (mut bytes, _) = valid_pack_bytes();
    // Version 1 (per-channel scales only, no target chip) is another format now.
    edit_header(&mut bytes, |h| h.version.set(1));
    let (_d, _p, r) = open_bytes(&bytes);
    match r {
        Err(StoreError::UnsupportedVersion {
            found, supported, ..
        }) => assert_eq!((found, supported), (1, 2)),
        other => panic!("expected UnsupportedVersion, got {:?}", other.err()),
    }
    // Even without a matching checksum (the checksum scheme of another version is unknown).
    let (mut bytes, _) = valid_pack_bytes();
    bytes[8] = 7;
    let (_d, _p, r) = open_bytes(&bytes);
    assert!(matches!(
        r,
        Err(StoreError::UnsupportedVersion { found: 7, .. })
    ));
}

#[test]
fn unknown_required_flag_is_refused_and_optional_flag_ignored() {
    let (mut bytes, entries) = valid_pack_bytes();
    edit_header(&mut bytes, |h| h.optional_flags.set(0x8000_0000));
    let (_d, _p, r) = open_bytes(&bytes);
    assert_eq!(
        &r.unwrap().load(&entries[0].0, true).unwrap(),
        &entries[0].1
    );
    edit_header(&mut bytes, |h| h.required_flags.set(0x4));
    let (_d, _p, r) = open_bytes(&bytes);
    assert!(matches!(
        r,
        Err(StoreError::UnsupportedFlags { flags: 0x4, .. })
    ));
}

/// Apply `f` to the index bytes (and then the footer) of `bytes`, re-sealing both checksums, so
/// only the structural validation can catch the edit.
fn edit_index(bytes: &mut [u8], f: impl FnOnce(&mut [u8], &mut Footer)) {
    let at = bytes.len() - FOOTER_LEN;
    let mut footer = Footer::read_from_bytes(&bytes[at..]).unwrap();
    let (io, is) = (
        footer.index_offset.get() as usize,
        footer.index_size.get() as usize,
    );
    f(&mut bytes[io..io + is], &mut footer);
    footer.index_checksum.set(xxh3_64(&bytes[io..io + is]));
    footer.checksum.set(xxh3_64(footer.checksum_input()));
    bytes[at..].copy_from_slice(footer.as_bytes());
}

#[test]
fn structurally_invalid_index_is_refused_even_with_valid_checksums() {
    let (bytes, _) = valid_pack_bytes();
    let put = |idx: &mut [u8], at: usize, v: u64| idx[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let get = |idx: &[u8], at: usize| u64::from_le_bytes(idx[at..at + 8].try_into().unwrap());
    // Second record: after the first (88 bytes + "blk.0.ffn_up.weight" padded to 24).
    let second = ork_store::format::RECORD_LEN + 24;
    type Edit = Box<dyn Fn(&mut [u8], &mut Footer)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("unknown dtype", Box::new(|i, _| i[2] = 9)),
        // The group kind byte (offset 84): unknown, or affine on a per-channel entry.
        ("unknown group kind", Box::new(|i, _| i[84] = 7)),
        ("affine without a group", Box::new(|i, _| i[84] = 1)),
        ("unknown layout", Box::new(|i, _| i[3] = 7)),
        ("k = 0", Box::new(move |i, _| put(i, 8, 0))),
        ("k too large", Box::new(move |i, _| put(i, 8, 1 << 40))),
        (
            "blob size off by one",
            Box::new(move |i, _| put(i, 32, get(i, 32) + 1)),
        ),
        (
            "misaligned blob",
            Box::new(move |i, _| put(i, 24, get(i, 24) + 8)),
        ),
        (
            "blob past the data",
            Box::new(move |i, _| put(i, 24, 1 << 30)),
        ),
        (
            "scales overlap the blob",
            Box::new(move |i, _| put(i, 40, get(i, 24))),
        ),
        (
            "scale size",
            Box::new(move |i, _| put(i, 48, get(i, 48) + 4)),
        ),
        (
            "blobs overlap",
            Box::new(move |i, _| put(i, second + 24, get(i, 24))),
        ),
        (
            "name not UTF-8",
            Box::new(|i, _| i[ork_store::format::RECORD_LEN] = 0xff),
        ),
        (
            "duplicate name",
            Box::new(move |i, _| i[second + ork_store::format::RECORD_LEN + 4] = b'0'),
        ),
        (
            "name length 0",
            Box::new(|i, _| i[0..2].copy_from_slice(&[0, 0])),
        ),
        (
            "count + 1",
            Box::new(|_, f| f.entry_count.set(f.entry_count.get() + 1)),
        ),
        (
            "count - 1",
            Box::new(|_, f| f.entry_count.set(f.entry_count.get() - 1)),
        ),
        ("count huge", Box::new(|_, f| f.entry_count.set(u32::MAX))),
    ];
    for (what, edit) in cases {
        let mut b = bytes.clone();
        edit_index(&mut b, |i, f| edit(i, f));
        let r = Orkpack::from_bytes("edited", b);
        assert!(
            matches!(r, Err(StoreError::CorruptIndex { .. })),
            "{what}: {:?}",
            r.err()
        );
    }
    // The helper itself keeps a file valid when it changes nothing.
    let mut b = bytes.clone();
    edit_index(&mut b, |_, _| {});
    assert!(Orkpack::from_bytes("same", b).is_ok());
}

#[test]
fn wrong_magic_is_refused() {
    let (mut bytes, _) = valid_pack_bytes();
    bytes[0] = b'G';
    let (_d, _p, r) = open_bytes(&bytes);
    assert!(matches!(r, Err(StoreError::BadMagic { .. })));
    let (_d, _p, r) = open_bytes(
        b"GGUF\x03\0\0\0 not an orkpack at all, but long enough to hold a header.......",
    );
    assert!(matches!(r, Err(StoreError::BadMagic { .. })));
    let (_d, _p, r) = open_bytes(b"GG");
    assert!(matches!(r, Err(StoreError::BadMagic { .. })));
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.orkpack");
    match Orkpack::open(&path) {
        Err(StoreError::Io {
            path: p, source, ..
        }) => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {:?}", other.err()),
    }
}

#[test]
fn dropping_an_unfinished_writer_leaves_no_temp_and_keeps_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries[..2]);
    let before = std::fs::read(&path).unwrap();
    {
        let mut w = OrkpackWriter::create(&path).unwrap();
        let temp = w.temp_path().to_path_buf();
        assert_eq!(temp.parent(), Some(dir.path()), "temp beside the target");
        let name = temp.file_name().unwrap().to_str().unwrap().to_string();
        let prefix = format!(".orkpack-tmp.{}.", std::process::id());
        assert!(name.starts_with(&prefix), "{name}");
        w.add("x", &entries[3].1, entries[3].2).unwrap();
        assert!(temp.exists());
    }
    assert!(
        other_files(dir.path(), &path).is_empty(),
        "temp left behind"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn concurrent_writers_both_succeed_and_leave_a_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let all = sample_entries();
    let (a, b) = (all[..3].to_vec(), all[2..].to_vec());
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for set in [&a, &b] {
            let (path, barrier) = (&path, &barrier);
            s.spawn(move || {
                let mut w = OrkpackWriter::create(path).unwrap();
                barrier.wait();
                for (name, pw, src) in set.iter() {
                    w.add(name, pw, *src).unwrap();
                }
                w.finish().unwrap();
            });
        }
    });
    let pack = Orkpack::open(&path).unwrap();
    let names: Vec<&str> = pack.entries().iter().map(|e| e.name()).collect();
    let winner = if names.len() == a.len() && names[0] == a[0].0 {
        &a
    } else {
        &b
    };
    assert_eq!(
        names,
        winner.iter().map(|e| e.0.as_str()).collect::<Vec<_>>()
    );
    for (name, pw, _) in winner {
        assert_eq!(&pack.load(name, true).unwrap(), pw);
    }
    assert!(
        other_files(dir.path(), &path).is_empty(),
        "temp left behind"
    );
}

// ---------------------------------------------------------------------------------------------
// Child-process tests (kill -9, SIGINT, RLIMIT_FSIZE).

const CHILD_TARGET: &str = "ORK_STORE_CHILD_TARGET";
const CHILD_MODE: &str = "ORK_STORE_CHILD_MODE";
const CHILD_SEED: &str = "ORK_STORE_CHILD_SEED";
const CHILD_FULL_ENTRIES: u32 = 40;

/// Run as a child by the tests below: writes entries to `$ORK_STORE_CHILD_TARGET`, announcing
/// the temp path on stdout. Mode `slow`: one entry every 50 ms for up to a minute (the parent
/// kills it). Mode `fsize`: set RLIMIT_FSIZE to 1 MiB, write until the limit stops the writer,
/// and print the error. Mode `full`: write `CHILD_FULL_ENTRIES` entries from seed
/// `$ORK_STORE_CHILD_SEED` and finish.
#[test]
#[ignore = "child process of the crash tests, run by them"]
fn child_writer() {
    let Ok(target) = std::env::var(CHILD_TARGET) else {
        return;
    };
    let mode = std::env::var(CHILD_MODE).unwrap_or_default();
    let started = Instant::now();
    if mode == "fsize" {
        // Without a handler SIGXFSZ kills the process; with one, write() returns EFBIG.
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGXFSZ, flag).unwrap();
        let lim = rustix::process::Rlimit {
            current: Some(1 << 20),
            maximum: Some(1 << 20),
        };
        rustix::process::setrlimit(rustix::process::Resource::Fsize, lim).unwrap();
    }
    if mode == "handover" {
        // A server: a pack written at start-up (the listener is armed), then its own handler.
        let mut w = OrkpackWriter::create(Path::new(&target)).unwrap();
        w.add("t0", &weight(PackDtype::I8, 256, 256, 0), source(0))
            .unwrap();
        w.finish().unwrap();
        let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGTERM, std::sync::Arc::clone(&term))
            .unwrap();
        ork_store::leave_signals_to_application();
        println!("READY");
        while !term.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(started.elapsed() < Duration::from_secs(60), "no SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Still alive after the signal: the application drains and ends on its own.
        std::thread::sleep(Duration::from_millis(200));
        println!("DRAINED");
        return;
    }
    if mode == "full" {
        let seed: u32 = std::env::var(CHILD_SEED).unwrap().parse().unwrap();
        let mut w = OrkpackWriter::create(Path::new(&target)).unwrap();
        // Start adding together with the sibling: wait for the parent's go file.
        let go = PathBuf::from(format!("{target}.go"));
        while !go.exists() {
            assert!(started.elapsed() < Duration::from_secs(60), "no go signal");
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..CHILD_FULL_ENTRIES {
            let pw = weight(PackDtype::I8, 256, 256, seed + i);
            w.add(&format!("t{i}"), &pw, source(u64::from(seed)))
                .unwrap();
        }
        w.finish().unwrap();
        return;
    }
    let mut w = OrkpackWriter::create(Path::new(&target)).unwrap();
    println!("TEMP {}", w.temp_path().display());
    let mut i = 0u32;
    let err = loop {
        let pw = weight(PackDtype::I8, 256, 256, i);
        if let Err(e) = w.add(&format!("t{i}"), &pw, source(u64::from(i))) {
            break e;
        }
        i += 1;
        if mode == "slow" {
            println!("ADDED {i}");
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "parent never killed us"
            );
        } else if i > 64 {
            // 64 × 64 KiB blobs exceed the 1 MiB limit; finish() must fail at the latest.
            match w.finish() {
                Ok(()) => panic!("wrote past RLIMIT_FSIZE"),
                Err(e) => {
                    println!("ERROR {e:?}");
                    return;
                }
            }
        }
    };
    println!("ERROR {err:?}");
    drop(w);
}

fn spawn_child(
    target: &Path,
    mode: &str,
) -> (Child, PathBuf, BufReader<std::process::ChildStdout>) {
    let (child, mut out) = spawn_child_process(target, mode);
    let mut temp = None;
    let mut line = String::new();
    while temp.is_none() {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        // The harness prints "test child_writer ... " before the child's first line.
        if let Some((_, p)) = line.trim_end().split_once("TEMP ") {
            temp = Some(PathBuf::from(p));
        }
    }
    (child, temp.unwrap(), out)
}

/// Run `child_writer` in `mode` on `target`; its stdout is piped.
fn spawn_child_process(target: &Path, mode: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_TARGET, target)
        .env(CHILD_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Read child lines until `n` entries were added.
fn wait_added(out: &mut BufReader<std::process::ChildStdout>, n: u32) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        if line.trim_end() == format!("ADDED {n}") {
            return;
        }
    }
}

#[test]
fn kill_9_mid_write_never_leaves_a_partial_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let entries = sample_entries();

    // 1. No target before: absent after.
    let (mut child, temp, mut out) = spawn_child(&path, "slow");
    wait_added(&mut out, 3);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!path.exists(), "partial target published");
    assert!(temp.exists(), "kill -9 cannot clean up (test premise)");

    // 2. A good target before: the same bytes after; the stale temp goes with the next writer.
    write_pack(&path, &entries);
    let good = std::fs::read(&path).unwrap();
    let (mut child, temp2, mut out) = spawn_child(&path, "slow");
    wait_added(&mut out, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), good);
    Orkpack::open(&path).unwrap();

    let w = OrkpackWriter::create(&path).unwrap();
    assert!(
        !temp.exists() && !temp2.exists(),
        "stale temps of dead pids not removed"
    );
    drop(w);
    assert!(other_files(dir.path(), &path).is_empty());
}

#[test]
fn concurrent_writer_processes_both_succeed_and_leave_a_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let children: Vec<Child> = [1000u32, 2000]
        .iter()
        .map(|seed| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_writer", "--ignored", "--test-threads=1"])
                .env(CHILD_TARGET, &path)
                .env(CHILD_MODE, "full")
                .env(CHILD_SEED, seed.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // Both children have created their temp files before either starts adding.
    let t0 = Instant::now();
    while std::fs::read_dir(dir.path()).unwrap().count() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "children did not start"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let go = dir.path().join("m.orkpack.go");
    std::fs::write(&go, b"").unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a writer process failed");
    }
    std::fs::remove_file(&go).unwrap();
    let pack = Orkpack::open(&path).unwrap();
    assert_eq!(pack.entries().len(), CHILD_FULL_ENTRIES as usize);
    let seed = pack.entry("t0").unwrap().source().fingerprint ^ 0x1234_5678_9abc_def0;
    assert!(seed == 1000 || seed == 2000, "seed {seed}");
    for i in 0..CHILD_FULL_ENTRIES {
        let want = weight(PackDtype::I8, 256, 256, seed as u32 + i);
        assert_eq!(
            pack.load(&format!("t{i}"), true).unwrap(),
            want,
            "t{i} mixes writers"
        );
    }
    assert!(
        other_files(dir.path(), &path).is_empty(),
        "temp left behind"
    );
}

#[test]
fn sigint_mid_write_removes_the_temp() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries);
    let good = std::fs::read(&path).unwrap();
    for sig in [rustix::process::Signal::INT, rustix::process::Signal::TERM] {
        let (mut child, temp, mut out) = spawn_child(&path, "slow");
        wait_added(&mut out, 2);
        assert!(temp.exists());
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig.as_raw()), "dies of the signal");
        assert!(!temp.exists(), "temp not removed on {sig:?}");
        assert_eq!(std::fs::read(&path).unwrap(), good);
    }
    assert!(other_files(dir.path(), &path).is_empty());
}

/// A process that wrote a pack and then handles SIGTERM itself (`ork serve`) is not killed by
/// the writers' listener: it handles the signal and exits on its own.
#[test]
fn an_application_that_takes_the_signals_is_not_killed_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    let (mut child, mut out) = spawn_child_process(&path, "handover");
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        if line.contains("READY") {
            break;
        }
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status:?}: killed by the writer's listener"
    );
    assert!(rest.contains("DRAINED"), "{rest}");
    assert!(Orkpack::open(&path).is_ok());
    assert!(other_files(dir.path(), &path).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Full disk.

#[test]
fn full_disk_errors_keeps_target_and_removes_temp() {
    let fs = match SmallFs::mount("1m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("tmpfs mount not permitted ({why}); using RLIMIT_FSIZE instead");
            return full_disk_by_rlimit();
        }
    };
    let dir = fs.path();
    let path = dir.join("m.orkpack");
    let entries = sample_entries();
    write_pack(&path, &entries[..2]);
    let good = std::fs::read(&path).unwrap();

    let mut w = OrkpackWriter::create(&path).unwrap();
    let temp = w.temp_path().to_path_buf();
    let mut err = None;
    for i in 0..64u32 {
        // 64 KiB each: 1 MiB fills after ~15.
        if let Err(e) = w.add(
            &format!("t{i}"),
            &weight(PackDtype::I8, 256, 256, i),
            source(0),
        ) {
            err = Some(e);
            break;
        }
    }
    let err = match err {
        Some(e) => {
            // A writer that failed mid-entry refuses to go on (its offsets no longer match).
            let small = weight(PackDtype::I4, 32, 1, 0);
            assert!(matches!(
                w.add("after", &small, source(0)),
                Err(StoreError::Io { .. })
            ));
            assert!(matches!(w.finish(), Err(StoreError::Io { .. })));
            e
        }
        None => w.finish().expect_err("1 MiB tmpfs cannot hold 4 MiB"),
    };
    match &err {
        StoreError::Io {
            path: p, source, ..
        } => {
            assert_eq!(p, &path, "error names the target");
            assert_eq!(source.kind(), std::io::ErrorKind::StorageFull, "{err}");
        }
        other => panic!("expected Io(ENOSPC), got {other:?}"),
    }
    assert!(!temp.exists(), "temp left on a full disk");
    assert_eq!(std::fs::read(&path).unwrap(), good, "target changed");
    assert_eq!(other_files(dir, &path), Vec::<PathBuf>::new());
}

/// Fallback when tmpfs cannot be mounted: a child process with RLIMIT_FSIZE = 1 MiB.
fn full_disk_by_rlimit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.orkpack");
    write_pack(&path, &sample_entries()[..2]);
    let good = std::fs::read(&path).unwrap();
    let (mut child, temp, mut out) = spawn_child(&path, "fsize");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "child failed: {rest}");
    assert!(rest.contains("ERROR Io"), "child output: {rest}");
    assert!(!temp.exists());
    assert_eq!(std::fs::read(&path).unwrap(), good);
}

#[test]
fn rlimit_fsize_write_failure_keeps_target_and_removes_temp() {
    full_disk_by_rlimit();
}

// ---------------------------------------------------------------------------------------------
// Mutations.

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Random byte edits of a valid file: open + verified load never panic and never return
    /// bytes other than those written.
    #[test]
    fn mutated_files_never_yield_wrong_data(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (bytes, entries) = &*VALID;
        let mut b = bytes.clone();
        for (at, x) in &edits {
            let i = at.index(b.len());
            b[i] ^= x;
        }
        if let Some(c) = cut {
            b.truncate(c.index(b.len()));
        }
        if let Ok(pack) = Orkpack::from_bytes("mutated.orkpack", b) {
            for (name, pw, src) in entries {
                if let Ok(got) = pack.load(name, true) {
                    prop_assert_eq!(&got, pw);
                    prop_assert_eq!(pack.entry(name).unwrap().source(), *src);
                }
            }
        }
    }
}

static VALID: std::sync::LazyLock<(Vec<u8>, Vec<Sample>)> =
    std::sync::LazyLock::new(valid_pack_bytes);

fn sample_smoothing() -> ork_store::PackSmoothing {
    let v = |seed: f32| {
        (0..24)
            .map(|i| 0.25 + seed + i as f32 / 16.0)
            .collect::<Vec<f32>>()
    };
    ork_store::PackSmoothing {
        alpha: 0.5,
        calib_hash: 0xfeed_beef,
        calib_tokens: 1234,
        model_fingerprint: 77,
        v_to_o: true,
        up_to_down: true,
        blocks: vec![
            ork_store::SmoothedBlock {
                attn: v(0.0),
                ffn: Some(v(1.0)),
                vo: Some(v(5.0)[..8].to_vec()),
                down: Some([v(6.0), v(7.0)].concat()),
            },
            ork_store::SmoothedBlock {
                attn: v(2.0),
                ffn: None,
                vo: Some(v(8.0)[..8].to_vec()),
                down: None,
            },
            ork_store::SmoothedBlock {
                attn: v(3.0),
                ffn: Some(v(4.0)),
                vo: Some(v(9.0)[..8].to_vec()),
                down: Some([v(1.5), v(2.5)].concat()),
            },
        ],
    }
}

/// [`sample_smoothing`] with the normed inputs only.
fn sample_norm_smoothing() -> ork_store::PackSmoothing {
    let mut s = sample_smoothing();
    s.v_to_o = false;
    s.up_to_down = false;
    for b in &mut s.blocks {
        b.vo = None;
        b.down = None;
    }
    s
}

/// The smoothing section round-trips (factors, presence per block, parameters) beside the
/// entries, which read as before; a pack without one reports none; ragged or non-positive
/// factors are refused by the writer.
#[test]
fn smoothing_section_roundtrips_beside_the_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.orkpack");
    let entries = sample_entries();
    let smoothing = sample_smoothing();
    let mut w = OrkpackWriter::create(&path).unwrap();
    w.set_smoothing(&smoothing).unwrap();
    for (name, pw, src) in &entries {
        w.add(name, pw, *src).unwrap();
    }
    w.finish().unwrap();
    let pack = Orkpack::open(&path).unwrap();
    assert_eq!(pack.smoothing(), Some(&smoothing));
    assert!(pack.smoothing().unwrap().same_parameters(&smoothing));
    for (name, pw, _) in &entries {
        assert_eq!(&pack.load(name, true).unwrap(), pw);
    }
    let (bytes, _) = valid_pack_bytes();
    let (_d, _p, r) = open_bytes(&bytes);
    assert!(r.unwrap().smoothing().is_none());

    let mut w = OrkpackWriter::create(&dir.path().join("bad.orkpack")).unwrap();
    let mut ragged = sample_smoothing();
    ragged.blocks[1].attn.pop();
    let mut zero = sample_smoothing();
    zero.blocks[2].ffn.as_mut().unwrap()[3] = 0.0;
    let mut ragged_vo = sample_smoothing();
    ragged_vo.blocks[2].vo.as_mut().unwrap().pop();
    let mut zero_down = sample_smoothing();
    zero_down.blocks[0].down.as_mut().unwrap()[30] = 0.0;
    // A vector for a target the record does not name.
    let mut unnamed = sample_smoothing();
    unnamed.up_to_down = false;
    for bad in [ragged, zero, ragged_vo, zero_down, unnamed] {
        assert!(matches!(
            w.set_smoothing(&bad),
            Err(StoreError::InvalidEntry { tensor, .. }) if tensor == "(smoothing)"
        ));
    }
}

/// A pack written before `v → o` / `up → down` smoothing (section version 1: no targets record,
/// presence bytes 0/1) still reads, as smoothing of the normed inputs only.
#[test]
fn a_version_1_smoothing_section_reads_as_norm_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.orkpack");
    let norm = sample_norm_smoothing();
    let mut w = OrkpackWriter::create(&path).unwrap();
    w.set_smoothing(&norm).unwrap();
    for (name, pw, src) in &sample_entries() {
        w.add(name, pw, *src).unwrap();
    }
    w.finish().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let footer = Footer::read_from_bytes(&bytes[bytes.len() - FOOTER_LEN..]).unwrap();
    let at = footer.smoothing_offset.get() as usize;
    // Rewrite it in place as version 1: the data without its targets record (the 16 bytes
    // left over before the index stay unused), checksums redone.
    let mut header = ork_store::SmoothingHeader::read_from_bytes(&bytes[at..at + 64]).unwrap();
    let size = header.data_size.get() as usize;
    let data = bytes[at + 64 + 16..at + 64 + size].to_vec();
    bytes[at + 64..at + 64 + data.len()].copy_from_slice(&data);
    header.magic = ork_store::SMOOTHING_MAGIC_V1;
    header.data_size.set(data.len() as u64);
    header.data_checksum.set(xxh3_64(&data));
    header.checksum.set(xxh3_64(&header.as_bytes()[..56]));
    bytes[at..at + 64].copy_from_slice(header.as_bytes());
    let (_d, _p, r) = open_bytes(&bytes);
    let pack = r.unwrap();
    assert_eq!(pack.smoothing(), Some(&norm));
    assert!(!pack
        .smoothing()
        .unwrap()
        .same_parameters(&sample_smoothing()));
}

/// A damaged smoothing section (a flipped factor, a flag without a section) fails open.
#[test]
fn a_damaged_smoothing_section_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.orkpack");
    let mut w = OrkpackWriter::create(&path).unwrap();
    w.set_smoothing(&sample_smoothing()).unwrap();
    for (name, pw, src) in &sample_entries() {
        w.add(name, pw, *src).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let footer = Footer::read_from_bytes(&bytes[bytes.len() - FOOTER_LEN..]).unwrap();
    let at = footer.smoothing_offset.get() as usize;
    assert!(at >= 4096 && at < footer.index_offset.get() as usize);
    // A byte of the factors (past the 64-byte header, the 16-byte targets record and the 8
    // presence bytes).
    let mut flipped = bytes.clone();
    flipped[at + 64 + 16 + 8 + 5] ^= 0x40;
    let (_d, _p, r) = open_bytes(&flipped);
    assert!(matches!(r, Err(StoreError::CorruptIndex { .. })), "{r:?}");
    // The flag set on a file that has no section.
    let (mut plain, _) = valid_pack_bytes();
    edit_header(&mut plain, |h| {
        h.optional_flags.set(ork_store::OPT_SMOOTHING)
    });
    let (_d, _p, r) = open_bytes(&plain);
    assert!(matches!(r, Err(StoreError::CorruptIndex { .. })), "{r:?}");
}
