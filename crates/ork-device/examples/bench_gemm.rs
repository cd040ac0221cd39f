//! Print the emulator's GEMM benchmark: `cargo run --release -p ork-device --example bench_gemm`.

use ork_device::bench::{bench_gemm, BenchOptions};
use ork_device::EmuDevice;

fn main() -> Result<(), ork_device::DeviceError> {
    let dev = EmuDevice::new();
    let r = bench_gemm(&dev, &BenchOptions::default())?;
    println!(
        "isa {}  threads {}  peak {:.1} GOP/s  read bandwidth {:.2} GB/s",
        r.isa, r.threads, r.peak_gops, r.bandwidth_gbs
    );
    println!(
        "{:>4} {:>5} {:>6} {:>10} {:>9} {:>9} {:>8} {:>8}",
        "M", "K", "N", "ms", "GOP/s", "wGB/s", "%peak", "%bw"
    );
    for c in &r.cases {
        println!(
            "{:>4} {:>5} {:>6} {:>10.3} {:>9.1} {:>9.2} {:>7.1}% {:>7.1}%",
            c.m,
            c.k,
            c.n,
            c.seconds * 1e3,
            c.gops,
            c.weight_gbs,
            100.0 * c.compute_ratio,
            100.0 * c.bandwidth_ratio
        );
    }
    Ok(())
}
