//! Pack throughput on one thread at SmolLM2-135M shapes, from Q4_1 blocks (the model's own type)
//! and, to separate the kernel from the decoder, from an f32 matrix. Throughput is reported in
//! output bytes (the packed blob), so "MB/s" reads as packed megabytes per second per thread.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ork_gguf::GgmlType;

mod common;
use common::q4_1_blocks;
use ork_pack::{pack_into, GgufRows, MatrixRows, PackDtype, RowSource, TiledLayout};

/// SmolLM2-135M matmul shapes `(K, N)`: ffn up/gate, ffn down, and the tied output projection.
const SHAPES: [(usize, usize); 3] = [(576, 1536), (1536, 576), (576, 49152)];

fn bench_source(
    c: &mut Criterion,
    group_name: &str,
    src: &dyn RowSource,
    dtypes: &[PackDtype],
    pool: &rayon::ThreadPool,
) {
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10);
    for &dtype in dtypes {
        let layout = TiledLayout::new(dtype, src.k(), src.n());
        let mut data = vec![0u8; layout.blob_bytes()];
        let mut scales = vec![0f32; layout.n];
        group.throughput(Throughput::Bytes(data.len() as u64));
        let id = BenchmarkId::new(dtype.name(), format!("K{}xN{}", src.k(), src.n()));
        group.bench_function(id, |b| {
            b.iter(|| {
                pool.install(|| pack_into(src, dtype, &mut data, &mut scales))
                    .expect("pack")
            })
        });
    }
    group.finish();
}

fn pack_benches(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    for &(k, n) in &SHAPES {
        let blocks = q4_1_blocks(k, n);
        let q41 = GgufRows::from_blocks("bench", GgmlType::Q4_1, &[k as u64, n as u64], &blocks)
            .expect("rows");
        let all = [PackDtype::I8, PackDtype::I4, PackDtype::F16];
        bench_source(c, "pack_q4_1_1thread", &q41, &all, &pool);

        // The same weights already decoded: the kernel's share of the cost.
        let mut dense = vec![0f32; k * n];
        q41.read_rows(0, &mut dense).expect("decode");
        let f32_rows = MatrixRows::new(&dense, k, n).expect("matrix");
        bench_source(c, "pack_f32_1thread", &f32_rows, &[PackDtype::I8], &pool);

        // Decoding alone (into a tile-sized buffer, as the kernel does).
        let mut group = c.benchmark_group("decode_q4_1_1thread");
        group.sample_size(10);
        group.throughput(Throughput::Bytes((k * n) as u64));
        let mut tile = vec![0f32; 32 * k];
        group.bench_function(format!("K{k}xN{n}"), |b| {
            b.iter(|| {
                for first in (0..n).step_by(32) {
                    let rows = (n - first).min(32);
                    q41.read_rows(first, &mut tile[..rows * k]).expect("decode");
                }
            })
        });
        group.finish();
    }
}

criterion_group!(benches, pack_benches);
criterion_main!(benches);
