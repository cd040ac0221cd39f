//! Single-thread throughput of the block kernels (`ork_kernels::blocks`), in GB/s of weight
//! bytes read per second of wall time and per second of the thread's CPU time (from
//! `/proc/thread-self/schedstat`, which a loaded machine does not dilute):
//! `blocks_speed TYPE K ROWS M SECONDS [ISA]`. `scripts/blocks-speed.sh` runs it
//! beside ggml-cpu's own `vec_dot` on the same shapes and prints the ratio. A timing tool, not a
//! test: it asserts nothing.
use ork_kernels::blocks::{Isa, Kernel, WeightType};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 6 {
        eprintln!("usage: blocks_speed TYPE K ROWS M SECONDS [ISA]");
        std::process::exit(2);
    }
    let ty = *WeightType::ALL
        .iter()
        .find(|t| t.name() == a[1])
        .unwrap_or_else(|| panic!("unknown type {}", a[1]));
    let num = |i: usize| a[i].parse::<usize>().expect("a number");
    let (k, rows, m) = (num(2), num(3), num(4));
    let secs: f64 = a[5].parse().expect("seconds");
    let kern = match a.get(6) {
        Some(n) => Kernel::with_isa(ty, Isa::named(n).expect("an ISA this CPU runs")),
        None => Kernel::best(ty),
    }
    .expect("a kernel for the type");
    let (len, bytes) = ty.geometry();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut w: Vec<u8> = (0..rows * ty.row_bytes(k)).map(|_| next() as u8).collect();
    if len > 1 {
        // Sane f16 scales (and mins) at the front of every block.
        for blk in w.chunks_exact_mut(bytes) {
            blk[..4].copy_from_slice(&[0x00, 0x20, 0x00, 0x20]);
        }
    } else if ty == WeightType::F32 {
        for v in w.chunks_exact_mut(4) {
            v.copy_from_slice(&((next() % 1000) as f32 / 1000.0).to_le_bytes());
        }
    } else {
        // f16 in 1..2, bf16 in 2⁻⁷..2 (as scripts/blocks_speed_ggml.c): no subnormal products,
        // which x86 computes slowly.
        for v in w.chunks_exact_mut(2) {
            v[1] = 0x3c | (v[1] & 3);
        }
    }
    let x: Vec<f32> = (0..m * k)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut acts = vec![0u8; m * kern.act_type().row_bytes(k)];
    let mut out = vec![0f32; rows * m];
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs || n < 3 {
        kern.quantize(&x, k, &mut acts);
        kern.rows(k, &w, rows, &acts, m, &mut out);
        n += 1;
    }
    let t = start.elapsed().as_secs_f64() / n as f64;
    let tc = (cpu_ns() - cpu0) as f64 * 1e-9 / n as f64;
    println!(
        "{{\"type\": \"{}\", \"isa\": \"{}\", \"k\": {k}, \"rows\": {rows}, \"m\": {m}, \"gbps\": {:.3}, \"cpu_gbps\": {:.3}, \"checksum\": {}}}",
        ty.name(),
        kern.isa().name(),
        w.len() as f64 / t / 1e9,
        w.len() as f64 / tc / 1e9,
        out.iter().sum::<f32>()
    );
}

/// This thread's time on a CPU so far, in ns (the first field of its schedstat).
fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number")
}
