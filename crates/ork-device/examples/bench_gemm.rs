//! `cargo run -p ork-device --example bench_gemm [M...]`: emulated GEMM on SmolLM2's shapes with
//! int8 and fp16 activations (int8 weights), GOP/s, in one run. The emulator models the RK3576
//! here: fp16 × int8 (w8a16) is not an RK3588 type (docs/chip.md).

use ork_device::bench::{bench_gemm, BenchOptions};
use ork_device::{ActPrecision, EmuConfig, EmuDevice, Soc};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ms: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let dev = EmuDevice::with_config(EmuConfig {
        soc: Soc::Rk3576,
        ..EmuConfig::default()
    })?;
    let opts = BenchOptions {
        ms: if ms.is_empty() { vec![1, 128, 512] } else { ms },
        activations: vec![ActPrecision::Int8, ActPrecision::F16],
        ..BenchOptions::default()
    };
    let r = bench_gemm(&dev, &opts)?;
    println!(
        "isa {} threads {} int8 peak {:.1} GOP/s ({}), bandwidth {:.1} GB/s",
        r.isa, r.threads, r.peak_gops, r.peak_isa, r.bandwidth_gbs
    );
    for c in &r.cases {
        println!(
            "{:>4} {:>12} M={:<4} K={:<5} N={:<6} {:>9.3} ms {:>7.1} GOP/s {:>6.2} GB/s",
            c.activations.name(),
            c.kernel,
            c.m,
            c.k,
            c.n,
            c.seconds * 1e3,
            c.gops,
            c.weight_gbs
        );
    }
    if let Some(d) = &r.decode {
        println!(
            "decode pass ({}): {} matmuls, {:.0} MB, {:.2} ms, {:.2} GB/s ({:.0}% of bandwidth)",
            d.kernel,
            d.matmuls,
            d.weight_bytes as f64 / 1e6,
            d.seconds * 1e3,
            d.weight_gbs,
            d.bandwidth_ratio * 100.0
        );
    }
    Ok(())
}
