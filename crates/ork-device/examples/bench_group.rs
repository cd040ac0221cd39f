//! `cargo run --release -p ork-device --example bench_group`: what per-group int8 scales cost the
//! emulator, against per-channel int8 in the same run: SmolLM2's `ffn_down` shape (K 1536, N 576)
//! and a 7B-sized one (K 4096, N 4096), decode (M = 1) and prefill (M = 128).

use std::time::Instant;

use ork_device::{upload, Activations, CoreMask, Device, DomainId, EmuDevice, MatmulTask};
use ork_pack::{PackDtype, PackedWeight, ScaleGroup, TiledLayout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = EmuDevice::new();
    println!(
        "kernel {} threads {}; ms per matmul (ratio to per-channel)",
        dev.isa().name(),
        dev.max_threads()
    );
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (k, n) in [(1536, 576), (4096, 4096)] {
        let layout = TiledLayout::new(PackDtype::I8, k, n);
        let data: Vec<u8> = (0..layout.blob_bytes()).map(|_| rnd() as u8).collect();
        for m in [1, 128] {
            let a: Vec<i8> = (0..m * k).map(|_| rnd() as i8).collect();
            let sa = vec![0.01f32; m];
            let mut out = vec![0f32; m * n];
            let mut base = 0f64;
            for group in [
                ScaleGroup::PerChannel,
                ScaleGroup::Group(512),
                ScaleGroup::Group(256),
                ScaleGroup::Group(128),
            ] {
                let pw = PackedWeight {
                    layout,
                    data: data.clone(),
                    scales: vec![0.01; group.scales_len(k, n)?],
                    group,
                };
                let w = upload(&dev, &pw, DomainId(0))?;
                let task = MatmulTask {
                    m,
                    activations: Activations::Host(&a),
                    act_scales: &sa,
                    weight: w.as_weight(),
                    cores: CoreMask::AUTO,
                };
                dev.matmul(&task, &mut out)?;
                let (t0, mut reps) = (Instant::now(), 0u32);
                while t0.elapsed().as_secs_f64() < 0.5 {
                    dev.matmul(&task, &mut out)?;
                    reps += 1;
                }
                let ms = t0.elapsed().as_secs_f64() * 1e3 / f64::from(reps);
                if group == ScaleGroup::PerChannel {
                    base = ms;
                }
                println!(
                    "K={k:<5} N={n:<5} M={m:<4} {:<12} {ms:>9.3} ms ({:.2}x)",
                    group.name(),
                    ms / base
                );
            }
        }
    }
    Ok(())
}
