//! Load-throughput measurement for `ork bench`: a verified load of a blob from the mapped file
//! into a page-aligned buffer, against a plain `memcpy` of the same bytes from the same mapping.

use std::hint::black_box;
use std::time::Instant;

use memmap2::MmapMut;

use crate::{Entry, Orkpack, StoreError};

/// Result of [`bench_load`]. Throughputs are in GB/s (10^9 bytes per second), best of
/// `iterations` interleaved runs each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadBench {
    /// Blob bytes copied per run.
    pub bytes: u64,
    /// Runs per method.
    pub iterations: u32,
    /// Plain `copy_from_slice` from the mapping.
    pub memcpy_gb_s: f64,
    /// [`Orkpack::load_into`] with `verify = true` (copy + xxh3).
    pub load_verified_gb_s: f64,
    /// [`Orkpack::load_into`] with `verify = false`.
    pub load_unverified_gb_s: f64,
    /// XXH3-64 of the blob in place (no copy).
    pub hash_gb_s: f64,
}

impl LoadBench {
    /// Verified load throughput as a fraction of memcpy throughput.
    pub fn verified_ratio(&self) -> f64 {
        self.load_verified_gb_s / self.memcpy_gb_s
    }
}

/// Measure loading `entry` of `pack`. The mapping is warmed first (the blob is page-cached and
/// faulted in), and the destination is a page-aligned anonymous buffer touched once before
/// timing, so the figures compare copy+hash against copy, not page faults.
///
/// # Errors
/// [`StoreError::CorruptBlob`] if the blob does not match its checksum; [`StoreError::Io`] if
/// the buffer cannot be mapped.
///
/// # Panics
/// If `entry` came from another [`Orkpack`].
pub fn bench_load(pack: &Orkpack, entry: &Entry, iterations: u32) -> Result<LoadBench, StoreError> {
    let iterations = iterations.max(1);
    let src = pack.blob(entry);
    let len = src.len();
    let mut dst =
        MmapMut::map_anon(len).map_err(|e| StoreError::io(pack.path(), "map buffer", e))?;
    dst.fill(0);
    // Warm: one verified load (faults the mapping in and proves the blob intact).
    pack.load_into(entry, &mut dst, true)?;

    // The methods take turns within each iteration, so a burst of load from other processes
    // hits all of them alike; each keeps its best time.
    let mut best = [f64::INFINITY; 4];
    for _ in 0..iterations {
        for (m, slot) in best.iter_mut().enumerate() {
            let t = Instant::now();
            match m {
                0 => dst.copy_from_slice(black_box(src)),
                1 => pack.load_into(entry, &mut dst, true)?,
                2 => pack.load_into(entry, &mut dst, false)?,
                _ => {
                    black_box(crate::checksum::xxh3(black_box(src)));
                }
            }
            black_box(&mut dst[..]);
            *slot = slot.min(t.elapsed().as_secs_f64());
        }
    }
    let [memcpy, verified, unverified, hash] = best.map(|t| len as f64 / t.max(1e-9) / 1e9);
    Ok(LoadBench {
        bytes: len as u64,
        iterations,
        memcpy_gb_s: memcpy,
        load_verified_gb_s: verified,
        load_unverified_gb_s: unverified,
        hash_gb_s: hash,
    })
}
