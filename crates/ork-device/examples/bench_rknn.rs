//! `ORK_RKNN_LIB=… cargo run --release -p ork-device --example bench_rknn [steps]`: the `rknn`
//! backend's own overhead per matmul (context lookup, binding, A/C copies, syncs — everything
//! outside `rknn_matmul_run`) on SmolLM2-135M's decode matmuls (M = 1; 30 layers × q, k, v, o,
//! gate, up, down, then the lm head), against the emulator's time for the same decode step, in
//! the same run. The runtime is whatever `ORK_RKNN_LIB` names; on CI that is the stand-in, whose
//! `rknn_matmul_run` computes with the emulator's kernels.
//!
//! Steps alternate between the two devices so that both see the same machine load.

use std::time::{Duration, Instant};

use ork_device::{
    upload, Activations, CoreMask, Device, DeviceWeight, DomainId, EmuDevice, MatmulTask,
    OpenOptions, RknnDevice,
};
use ork_pack::{PackDtype, PackedWeight, ScaleGroup, TiledLayout};

use ork_device::bench::{
    SMOLLM2_HEAD as HEAD, SMOLLM2_LAYER as LAYER_SHAPES, SMOLLM2_LAYERS as LAYERS,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args().nth(1).map_or(Ok(20), |s| s.parse())?;
    let lib = std::env::var("ORK_RKNN_LIB")
        .map_err(|_| "set ORK_RKNN_LIB (e.g. target/release/libork_rknn_standin.so)")?;
    let rknn = RknnDevice::open_path(&lib, &OpenOptions::new().domains(1))?;
    let emu = EmuDevice::new();
    println!(
        "runtime {} ({}); emulator kernel {}, {} threads",
        rknn.version().runtime,
        lib,
        emu.isa().name(),
        emu.max_threads()
    );
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut packed = Vec::new();
    for _ in 0..LAYERS {
        for &(k, n) in &LAYER_SHAPES {
            packed.push((k, n));
        }
    }
    packed.push(HEAD);
    let weights: Vec<PackedWeight> = packed
        .iter()
        .map(|&(k, n)| {
            let layout = TiledLayout::new(PackDtype::I8, k, n);
            PackedWeight {
                layout,
                data: (0..layout.blob_bytes()).map(|_| rnd() as u8).collect(),
                scales: (0..n).map(|i| 0.01 + i as f32 * 1e-6).collect(),
                group: ScaleGroup::PerChannel,
            }
        })
        .collect();
    let on = |d: &dyn Device| -> Result<Vec<DeviceWeight>, ork_device::DeviceError> {
        weights.iter().map(|w| upload(d, w, DomainId(0))).collect()
    };
    let (wr, we) = (on(&rknn)?, on(&emu)?);
    let a: Vec<i8> = (0..1536).map(|_| rnd() as i8).collect();
    let mut out = vec![0f32; HEAD.1];
    let step = |d: &dyn Device, ws: &[DeviceWeight], out: &mut [f32]| {
        for w in ws {
            let l = w.layout;
            let t = MatmulTask {
                m: 1,
                activations: Activations::Host(&a[..l.k]),
                act_scales: &[0.02],
                weight: w.as_weight(),
                cores: CoreMask::AUTO,
            };
            d.matmul(&t, &mut out[..l.n]).expect("matmul");
        }
    };
    for _ in 0..3 {
        step(&rknn, &wr, &mut out);
        step(&emu, &we, &mut out);
    }
    let (mut t_rknn, mut t_emu, mut t_run) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..steps {
        let (_, run0) = rknn.run_time();
        let t = Instant::now();
        step(&rknn, &wr, &mut out);
        t_rknn += t.elapsed();
        t_run += rknn.run_time().1 - run0;
        let t = Instant::now();
        step(&emu, &we, &mut out);
        t_emu += t.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
    let matmuls = wr.len();
    let overhead = per(t_rknn) - per(t_run);
    println!(
        "decode step ({matmuls} matmuls, M = 1), ms: emulator {:.3} | rknn total {:.3} = inside \
         rknn_matmul_run {:.3} + backend overhead {:.3}",
        per(t_emu),
        per(t_rknn),
        per(t_run),
        overhead
    );
    println!(
        "backend overhead: {:.2} µs per matmul, {:.2} % of the emulator's decode step \
         (goal ≤ 5 %); rknn_matmul_run calls: {} per step (the lm head runs as {} N-chunks)",
        overhead * 1e3 / matmuls as f64,
        100.0 * overhead / per(t_emu),
        (matmuls - 1) + HEAD.1.div_ceil(4096),
        HEAD.1.div_ceil(4096)
    );
    Ok(())
}
