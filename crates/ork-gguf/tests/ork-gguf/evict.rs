//! `evict` gives a tensor's file pages back: RssFile drops.
use crate::common::lock_pages;
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile};

/// `RssFile` of this process in KiB, from /proc/self/status.
fn rss_file_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("RssFile:"))
        .expect("RssFile in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn evict_drops_resident_file_pages() {
    let _pages = lock_pages();
    const MIB: usize = 1 << 20;
    // One 64 MiB F32 tensor behind a small one (so the big one starts mid-page).
    let big: Vec<u8> = (0..64 * MIB).map(|i| (i * 7 + i / 4096) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    GgufBuilder::new()
        .tensor("small", &[3], GgmlType::F32, vec![1; 12])
        .tensor("big", &[(16 * MIB) as u64], GgmlType::F32, big)
        .write(&path)
        .unwrap();
    let file = GgufFile::open(&path).unwrap();
    let t = file.tensor("big").unwrap().clone();
    let page = 4096;
    let checksum = |data: &[u8]| {
        data.iter()
            .step_by(page / 2)
            .fold(0u64, |a, &b| a.wrapping_mul(31).wrapping_add(b as u64))
    };

    let before_touch = rss_file_kib();
    let sum = checksum(file.tensor_data(&t));
    let touched = rss_file_kib();
    file.evict(&t);
    let evicted = rss_file_kib();
    eprintln!("RssFile: {before_touch} KiB -> touched {touched} KiB -> evicted {evicted} KiB");
    assert!(
        touched >= before_touch + 60 * 1024,
        "touching 64 MiB should map it: {before_touch} -> {touched}"
    );
    assert!(
        evicted + 60 * 1024 <= touched,
        "evict should drop ~64 MiB: {touched} -> {evicted}"
    );
    // The bytes are still there (faulted back in from the file).
    assert_eq!(checksum(file.tensor_data(&t)), sum);
    // Interior rounding: a range within one page releases nothing.
    assert_eq!(file.evict_range(t.offset + 1, 100).unwrap(), 0);
    let released = file.evict_range(t.offset, t.size).unwrap();
    assert!(released <= t.size && released + 2 * page as u64 > t.size);
}
