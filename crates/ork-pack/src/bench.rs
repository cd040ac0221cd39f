//! Throughput measurement of the pack kernel (used by `ork bench pack`).

use crate::kernel::{layout_of, pack_into};
use crate::{PackDtype, PackError, RowSource};
use std::time::Instant;

/// Timing of repeated packs of one source.
#[derive(Clone, Debug, PartialEq)]
pub struct PackBenchResult {
    /// Dtype packed to.
    pub dtype: PackDtype,
    /// Source K.
    pub k: usize,
    /// Source N.
    pub n: usize,
    /// Worker threads used.
    pub threads: usize,
    /// Timed iterations (after one untimed warm-up).
    pub iters: usize,
    /// Fastest iteration, seconds.
    pub best_seconds: f64,
    /// Mean iteration, seconds.
    pub mean_seconds: f64,
    /// Bytes of packed output per iteration (the blob, padding included; scales excluded).
    pub out_bytes: usize,
}

impl PackBenchResult {
    /// Logical source elements (`k · n`) per iteration.
    pub fn elems(&self) -> usize {
        self.k * self.n
    }
    /// Output bytes per second at the fastest iteration.
    pub fn out_bytes_per_sec(&self) -> f64 {
        self.out_bytes as f64 / self.best_seconds
    }
    /// Output bytes per second per thread at the fastest iteration.
    pub fn out_bytes_per_sec_per_thread(&self) -> f64 {
        self.out_bytes_per_sec() / self.threads as f64
    }
    /// Source elements per second at the fastest iteration.
    pub fn elems_per_sec(&self) -> f64 {
        self.elems() as f64 / self.best_seconds
    }
}

/// Pack `src` to `dtype` `iters` times (at least once) on a fresh pool of `threads` workers
/// (at least one) after one warm-up pack, reusing the output buffers so that the figure is the
/// kernel's (decode + quantize + tile), not the allocator's.
///
/// # Errors
/// [`PackError::Threads`] if the pool cannot be built, otherwise what [`crate::pack`] reports.
pub fn bench_pack(
    src: &dyn RowSource,
    dtype: PackDtype,
    threads: usize,
    iters: usize,
) -> Result<PackBenchResult, PackError> {
    let (threads, iters) = (threads.max(1), iters.max(1));
    let layout = layout_of(src, dtype)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut data = vec![0u8; layout.blob_bytes()];
    let mut scales = vec![0f32; layout.n];
    let times = pool.install(|| -> Result<Vec<f64>, PackError> {
        pack_into(src, dtype, &mut data, &mut scales)?;
        (0..iters)
            .map(|_| {
                let t0 = Instant::now();
                pack_into(src, dtype, &mut data, &mut scales)?;
                Ok(t0.elapsed().as_secs_f64())
            })
            .collect()
    })?;
    Ok(PackBenchResult {
        dtype,
        k: layout.k,
        n: layout.n,
        threads,
        iters,
        best_seconds: times.iter().copied().fold(f64::INFINITY, f64::min),
        mean_seconds: times.iter().sum::<f64>() / iters as f64,
        out_bytes: data.len(),
    })
}
