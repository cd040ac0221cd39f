//! Single-thread throughput of the int8 tile kernels (`ork_kernels::tile::tile_dot`), in
//! multiply-adds per second of wall time and of the thread's CPU time (from
//! `/proc/thread-self/schedstat`, which a loaded machine does not dilute):
//! `tile_speed ISA M K N TN SECONDS`. One pass computes an `M × N` output from `M` activation
//! rows of `K` values against `N / TN` weight tiles of `TN` channels, tile after tile as a
//! device task does (`N · K` weight bytes: make it larger than the caches to time the M = 1
//! pass's DRAM streaming). A/B two builds by running both binaries in alternation (see
//! `docs/kernels.md`). A timing tool, not a test: it asserts nothing.
use ork_kernels::tile::{tile_dot, Isa, PreparedA};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        eprintln!("usage: tile_speed ISA M K N TN SECONDS");
        std::process::exit(2);
    }
    let isa = Isa::named(&a[1]).expect("an ISA this CPU runs");
    let num = |i: usize| a[i].parse::<usize>().expect("a number");
    let (m, k, n, tn) = (num(2), num(3), num(4), num(5));
    let secs: f64 = a[6].parse().expect("seconds");
    assert!(
        k.is_multiple_of(32) && n.is_multiple_of(tn),
        "K % 32 == 0, N % TN == 0"
    );
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s as i8
    };
    let x: Vec<i8> = (0..m * k).map(|_| next()).collect();
    let w: Vec<i8> = (0..n * k).map(|_| next()).collect();
    let p = PreparedA::new(isa, m, k, k, &x);
    let mut out = vec![0i32; m * tn];
    let mut sum = 0i64;
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut passes = 0u64;
    while start.elapsed().as_secs_f64() < secs || passes < 3 {
        for tile in w.chunks_exact(tn * k) {
            tile_dot(&p, 0, m, tile, tn, &mut out);
            sum = sum.wrapping_add(i64::from(out[0]));
        }
        passes += 1;
    }
    let t = start.elapsed().as_secs_f64() / passes as f64;
    let tc = (cpu_ns() - cpu0) as f64 * 1e-9 / passes as f64;
    let macs = (m * n * k) as f64;
    println!(
        "{{\"isa\": \"{}\", \"m\": {m}, \"k\": {k}, \"n\": {n}, \"tn\": {tn}, \"gmacs\": {:.3}, \"cpu_gmacs\": {:.3}, \"checksum\": {sum}}}",
        isa.name(),
        macs / t / 1e9,
        macs / tc / 1e9,
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
