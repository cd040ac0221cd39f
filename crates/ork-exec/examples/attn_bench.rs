//! Attention alone at decode: one query row of a SmolLM2-shaped model (9 query heads, 3
//! key/value heads of 64) over `T` cached positions in each of 30 layers, on random data, from
//! an f16 cache as the session keeps it (`f32`: from an f32 one); prints the best time per token
//! of 200 and a checksum of the output (equal checksums across builds: equal results).
//!
//! `cargo run --release -p ork-exec --example attn_bench -- [T] [f16|f32]` (default 256 f16).
use half::f16;
use ork_exec::ops::{attention, AttentionShape, KvValue};
use std::time::Instant;

fn main() {
    let t: usize = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 256,
        Some(Ok(t)) if t > 0 => t,
        Some(_) => {
            eprintln!("attn_bench: T must be a positive number of cached positions");
            std::process::exit(2);
        }
    };
    let shape = AttentionShape {
        n_head: 9,
        n_head_kv: 3,
        head_dim_k: 64,
        head_dim_v: 64,
    };
    match std::env::args().nth(2).as_deref() {
        None | Some("f16") => run(t, shape, f16::from_f32),
        Some("f32") => run(t, shape, |x| x),
        Some(other) => {
            eprintln!("attn_bench: the cache type is f16 or f32, not {other:?}");
            std::process::exit(2);
        }
    }
}

fn run<T: KvValue>(t: usize, shape: AttentionShape, from: impl Fn(f32) -> T) {
    let layers = 30;
    let mut s = 1u64;
    let mut r = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 1000) as f32 / 1000.0 - 0.5
    };
    // Per layer, per key/value head: `t × 64` values, the layout `attention` takes.
    let mut cache = || -> Vec<Vec<Vec<T>>> {
        (0..layers)
            .map(|_| {
                (0..shape.n_head_kv)
                    .map(|_| (0..t * shape.head_dim_k).map(|_| from(r())).collect())
                    .collect()
            })
            .collect()
    };
    let ks = cache();
    let vs = cache();
    let q: Vec<f32> = (0..shape.n_head * shape.head_dim_k).map(|_| r()).collect();
    let mut out = vec![0f32; shape.n_head * shape.head_dim_v];
    let mut best = f64::MAX;
    let mut checksum = 0.0f64;
    // On a worker of the pool, as the executor's forward pass runs.
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool");
    pool.install(|| {
        for _ in 0..200 {
            let start = Instant::now();
            for (k, v) in ks.iter().zip(&vs) {
                let k: Vec<&[T]> = k.iter().map(Vec::as_slice).collect();
                let v: Vec<&[T]> = v.iter().map(Vec::as_slice).collect();
                attention(shape, &q, &k, &v, 1, &mut out);
            }
            best = best.min(start.elapsed().as_secs_f64());
            checksum += out.iter().map(|&x| f64::from(x)).sum::<f64>();
        }
    });
    println!(
        "attention, {t} cached positions, {layers} layers: best {:.1} µs per token (checksum {checksum:.9e})",
        best * 1e6
    );
}
