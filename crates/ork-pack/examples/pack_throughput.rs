//! Best-of-N pack throughput per thread through [`ork_pack::bench_pack`], at SmolLM2-135M shapes
//! from synthetic Q4_1 blocks and from the same weights pre-decoded to f32.
//!
//! `cargo run --release -p ork-pack --example pack_throughput [threads] [iters] [model.gguf]`
//!
//! With a model path it also packs every 2-D tensor of the model to int8 once, end to end.
//!
//! The best iteration is reported (not the mean) so that a machine shared with other work still
//! shows what the kernel can do.

use ork_gguf::GgmlType;
use ork_pack::{bench_pack, GgufRows, MatrixRows, PackDtype, RowSource};
use std::time::Instant;

#[path = "../benches/common/mod.rs"]
mod common;
use common::q4_1_blocks;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let iters: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(30);
    println!("threads={threads} iters={iters} (best iteration; MB = 1e6 bytes of packed output)");
    for (k, n) in [(576, 1536), (1536, 576), (576, 49152)] {
        let blocks = q4_1_blocks(k, n);
        let q41 = GgufRows::from_blocks("bench", GgmlType::Q4_1, &[k as u64, n as u64], &blocks)?;
        let mut dense = vec![0f32; k * n];
        q41.read_rows(0, &mut dense)?;
        let f32_rows = MatrixRows::new(&dense, k, n)?;
        // Decode alone, tile-sized reads as the kernel does them.
        let mut tile = vec![0f32; 32 * k];
        let mut best = f64::INFINITY;
        for _ in 0..iters {
            let t0 = Instant::now();
            for first in (0..n).step_by(32) {
                let rows = (n - first).min(32);
                q41.read_rows(first, &mut tile[..rows * k])?;
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "K={k:5} N={n:5}  decode Q4_1 only      {:7.0} Melem/s",
            (k * n) as f64 / best / 1e6
        );
        for (label, src) in [("Q4_1", &q41 as &dyn RowSource), ("f32 ", &f32_rows)] {
            for dtype in [PackDtype::I8, PackDtype::I4, PackDtype::F16] {
                let r = bench_pack(src, dtype, threads, iters)?;
                println!(
                    "K={k:5} N={n:5}  {label} -> {:3}  {:7.0} MB/s/thread  {:7.0} Melem/s  ({:.3} ms)",
                    dtype.name(),
                    r.out_bytes_per_sec_per_thread() / 1e6,
                    r.elems_per_sec() / 1e6,
                    r.best_seconds * 1e3
                );
            }
        }
    }
    if let Some(path) = args.next() {
        let file = ork_gguf::GgufFile::open(std::path::Path::new(&path))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let matrices: Vec<_> = file
            .tensors()
            .iter()
            .filter(|t| t.dims.len() == 2)
            .collect();
        let src_bytes: usize = matrices.iter().map(|t| file.tensor_data(t).len()).sum();
        // Pass 1: `pack`, a fresh output per tensor (allocation and first-touch page faults).
        // Pass 2: `pack_into` one reused buffer (the kernel alone, source pages now cached).
        let mut buf = Vec::new();
        let mut scales = Vec::new();
        for reuse in [false, true] {
            let (mut out_bytes, t0) = (0usize, Instant::now());
            for t in &matrices {
                let rows = GgufRows::new(&file, t)?;
                if reuse {
                    let layout = ork_pack::TiledLayout::new(PackDtype::I8, rows.k(), rows.n());
                    buf.resize(layout.blob_bytes(), 0u8);
                    scales.resize(layout.n, 0f32);
                    pool.install(|| {
                        ork_pack::pack_into(&rows, PackDtype::I8, &mut buf, &mut scales)
                    })?;
                    out_bytes += buf.len();
                } else {
                    out_bytes += ork_pack::pack_in(&pool, &rows, PackDtype::I8)?.data.len();
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "{path} via {}: {} tensors, {:.1} MB GGUF -> {:.1} MB int8 in {:.3} s = {:.0} MB/s/thread",
                if reuse { "pack_into (reused buffer)" } else { "pack (fresh output)" },
                matrices.len(),
                src_bytes as f64 / 1e6,
                out_bytes as f64 / 1e6,
                secs,
                out_bytes as f64 / secs / 1e6 / threads as f64
            );
        }
    }
    Ok(())
}
