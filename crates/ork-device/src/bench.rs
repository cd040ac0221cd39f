//! GEMM benchmark of the emulator against this machine's own rooflines, measured in the same run.
//!
//! The compute roofline is the peak of the best int8 multiply-add instruction the CPU has
//! (AVX-512 VNNI `vpdpbusd` zmm where present), whatever kernel the device was told to use, so a
//! slower kernel shows as a lower ratio instead of hiding behind its own peak; every figure says
//! which ISA made it.

use std::time::Instant;

use ork_pack::{PackDtype, PackedWeight, TiledLayout};
use rayon::prelude::*;

use crate::kernel;
use crate::{
    upload, ActPrecision, Activations, CoreMask, Device, DeviceError, DomainId, EmuDevice,
    MatmulTask,
};

/// SmolLM2-135M's matmuls of one transformer layer in the order a forward pass runs them,
/// `(K, N)`: q, k, v, o, gate, up, down.
pub const SMOLLM2_LAYER: [(usize, usize); 7] = [
    (576, 576),
    (576, 192),
    (576, 192),
    (576, 576),
    (576, 1536),
    (576, 1536),
    (1536, 576),
];

/// SmolLM2-135M's transformer layers.
pub const SMOLLM2_LAYERS: usize = 30;

/// SmolLM2-135M's LM head `(K, N)` (tied to the token embedding).
pub const SMOLLM2_HEAD: (usize, usize) = (576, 49152);

/// SmolLM2-135M matmul shapes, `(K, N)`: q/o proj, k/v proj, gate/up, down, lm head.
pub const SMOLLM2_SHAPES: [(usize, usize); 5] = [
    (576, 576),
    (576, 192),
    (576, 1536),
    (1536, 576),
    (576, 49152),
];

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Activation rows per case (prefill 128, 512; decode 1).
    pub ms: Vec<usize>,
    /// `(K, N)` weight shapes.
    pub shapes: Vec<(usize, usize)>,
    /// Minimum wall time per case, seconds.
    pub min_seconds: f64,
    /// Bytes read by the bandwidth probe.
    pub bandwidth_bytes: usize,
    /// Activation precisions to run every case in (int8 = w8a8, fp16 = w8a16, which needs a device
    /// modelling the RK3576); default int8 only.
    pub activations: Vec<ActPrecision>,
    /// Layers of the decode pass ([`DecodePass`]): M = 1 through `layers ×` [`SMOLLM2_LAYER`] and
    /// the LM head, every weight distinct (a model-sized working set); 0 skips it.
    pub decode_layers: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            ms: vec![1, 128, 512],
            shapes: SMOLLM2_SHAPES.to_vec(),
            min_seconds: 0.3,
            bandwidth_bytes: 512 << 20,
            activations: vec![ActPrecision::Int8],
            decode_layers: SMOLLM2_LAYERS,
        }
    }
}

/// One measured case.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmCase {
    /// Activation precision (the weight is int8 in every case).
    pub activations: ActPrecision,
    /// Kernel that computed the case (the device's int8 ISA, or its float kernel for fp16
    /// activations).
    pub kernel: &'static str,
    /// Rows.
    pub m: usize,
    /// Reduction dim.
    pub k: usize,
    /// Output channels.
    pub n: usize,
    /// Seconds per matmul (best of the repetitions).
    pub seconds: f64,
    /// Ops per second, `2·M·K·N / seconds / 1e9` (integer or float multiply-adds).
    pub gops: f64,
    /// Weight bytes streamed per second, GB/s.
    pub weight_gbs: f64,
    /// `gops / peak_gops` (the prefill figure of merit; against the int8 peak for fp16 cases too,
    /// whose f32 FMA peak is half of it on AVX2).
    pub compute_ratio: f64,
    /// `weight_gbs / bandwidth_gbs` (the decode figure of merit).
    pub bandwidth_ratio: f64,
}

/// The matmuls of one decode step of a SmolLM2-135M-sized model at M = 1, int8 activations, each
/// weight distinct so that the pass streams the whole model from memory as a real decode step
/// does (the per-shape M = 1 cases reread one cache-resident weight). Run inside the device's
/// worker pool, as the executor runs its forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePass {
    /// Matmuls per pass.
    pub matmuls: usize,
    /// Weight bytes per pass.
    pub weight_bytes: u64,
    /// Seconds per pass (median of the repetitions).
    pub seconds: f64,
    /// Weight bytes streamed per second, GB/s.
    pub weight_gbs: f64,
    /// `weight_gbs / bandwidth_gbs`.
    pub bandwidth_ratio: f64,
    /// Kernel that computed the pass.
    pub kernel: &'static str,
}

/// Benchmark result.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmBenchReport {
    /// Kernel ISA of the device (int8 activations).
    pub isa: &'static str,
    /// Worker threads.
    pub threads: usize,
    /// ISA of the compute roofline: the best int8 ISA this CPU has.
    pub peak_isa: &'static str,
    /// Peak int8 ops/s (2 per multiply-add) of `peak_isa`'s multiply-add instruction,
    /// in-register, on `threads` threads, GOP/s.
    pub peak_gops: f64,
    /// Read bandwidth of a large buffer on `threads` threads, GB/s.
    pub bandwidth_gbs: f64,
    /// The cases.
    pub cases: Vec<GemmCase>,
    /// The model-sized decode pass (`None` when `decode_layers` is 0).
    pub decode: Option<DecodePass>,
}

/// The best int8 ISA this CPU has (the roofline's instruction), regardless of `ORK_KERNEL`.
fn best_isa() -> kernel::Isa {
    kernel::Isa::available()
        .last()
        .copied()
        .unwrap_or(kernel::Isa::Scalar)
}

fn peak_gops(dev: &EmuDevice, isa: kernel::Isa) -> f64 {
    let threads = dev.max_threads();
    // Many short runs, best kept: the host is shared, and a quiet slice shows the true peak.
    let iters = 2_000_000u64;
    let _ = kernel::peak_loop(isa, iters / 10); // warm-up (clocks, pool)
    let mut best = 0f64;
    for _ in 0..30 {
        let t = Instant::now();
        let macs: u64 = dev.run_on(threads, || {
            (0..threads)
                .into_par_iter()
                .map(|_| std::hint::black_box(kernel::peak_loop(isa, iters)).0)
                .sum()
        });
        best = best.max(2.0 * macs as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn bandwidth_gbs(dev: &EmuDevice, bytes: usize) -> f64 {
    let threads = dev.max_threads();
    let buf: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut best = 0f64;
    for _ in 0..8 {
        let t = Instant::now();
        let s: u64 = dev.run_on(threads, || {
            buf.par_chunks(buf.len().div_ceil(threads))
                .map(|c| {
                    c.chunks_exact(8).fold([0u64; 8], |mut acc, x| {
                        acc.iter_mut()
                            .zip(x)
                            .for_each(|(a, &v)| *a = a.wrapping_add(v));
                        acc
                    })
                })
                .map(|a| a.iter().fold(0u64, |s, &v| s.wrapping_add(v)))
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(s);
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Measure prefill and decode GEMMs on `dev` (all cores) for every `(M, K, N)` in `opts`, plus
/// the machine's compute and bandwidth rooflines in the same run.
pub fn bench_gemm(dev: &EmuDevice, opts: &BenchOptions) -> Result<GemmBenchReport, DeviceError> {
    let peak_isa = best_isa();
    let peak = peak_gops(dev, peak_isa);
    let bw = bandwidth_gbs(dev, opts.bandwidth_bytes);
    let mut cases = Vec::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u8
    };
    for &(k, n) in &opts.shapes {
        let layout = TiledLayout::new(PackDtype::I8, k, n);
        let data: Vec<u8> = (0..layout.blob_bytes()).map(|_| rnd()).collect();
        let w = upload(
            dev,
            &PackedWeight {
                layout,
                data,
                scales: vec![0.01; n],
                group: ork_pack::ScaleGroup::PerChannel,
            },
            DomainId(0),
        )?;
        for &m in &opts.ms {
            for &precision in &opts.activations {
                let a: Vec<i8> = (0..m * k).map(|_| rnd() as i8).collect();
                let ah: Vec<half::f16> = a
                    .iter()
                    .map(|&v| half::f16::from_f32(f32::from(v) / 64.0))
                    .collect();
                let sa = vec![0.02f32; m];
                let mut out = vec![0f32; m * n];
                let task = MatmulTask {
                    m,
                    activations: match precision {
                        ActPrecision::Int8 => Activations::Host(&a),
                        ActPrecision::F16 => Activations::HostF16(&ah),
                    },
                    act_scales: match precision {
                        ActPrecision::Int8 => &sa,
                        ActPrecision::F16 => &[],
                    },
                    weight: w.as_weight(),
                    cores: CoreMask::AUTO,
                };
                let kernel = dev.matmul(&task, &mut out)?.kernel; // warm-up
                let mut best = f64::MAX;
                let start = Instant::now();
                let mut reps = 0;
                while reps < 3 || start.elapsed().as_secs_f64() < opts.min_seconds {
                    let t = Instant::now();
                    dev.matmul(&task, &mut out)?;
                    best = best.min(t.elapsed().as_secs_f64());
                    reps += 1;
                }
                let gops = 2.0 * (m * k * n) as f64 / best / 1e9;
                let weight_gbs = layout.blob_bytes() as f64 / best / 1e9;
                cases.push(GemmCase {
                    activations: precision,
                    kernel,
                    m,
                    k,
                    n,
                    seconds: best,
                    gops,
                    weight_gbs,
                    compute_ratio: gops / peak,
                    bandwidth_ratio: weight_gbs / bw,
                });
            }
        }
    }
    let decode = match opts.decode_layers {
        0 => None,
        layers => Some(decode_pass(dev, layers, opts.min_seconds, bw, &mut rnd)?),
    };
    Ok(GemmBenchReport {
        isa: dev.isa().name(),
        threads: dev.max_threads(),
        peak_isa: peak_isa.name(),
        peak_gops: peak,
        bandwidth_gbs: bw,
        cases,
        decode,
    })
}

/// Upload `layers ×` [`SMOLLM2_LAYER`] + [`SMOLLM2_HEAD`] distinct random int8 weights and time M =
/// 1 through all of them in order, inside the device's pool (median of at least 5 passes).
fn decode_pass(
    dev: &EmuDevice,
    layers: usize,
    min_seconds: f64,
    bandwidth_gbs: f64,
    rnd: &mut impl FnMut() -> u8,
) -> Result<DecodePass, DeviceError> {
    let shapes: Vec<(usize, usize)> = (0..layers)
        .flat_map(|_| SMOLLM2_LAYER)
        .chain([SMOLLM2_HEAD])
        .collect();
    let mut weights = Vec::with_capacity(shapes.len());
    let mut weight_bytes = 0u64;
    for &(k, n) in &shapes {
        let layout = TiledLayout::new(PackDtype::I8, k, n);
        let data: Vec<u8> = (0..layout.blob_bytes()).map(|_| rnd()).collect();
        weight_bytes += data.len() as u64;
        weights.push(upload(
            dev,
            &PackedWeight {
                layout,
                data,
                scales: vec![0.01; n],
                group: ork_pack::ScaleGroup::PerChannel,
            },
            DomainId(0),
        )?);
    }
    let kmax = shapes.iter().map(|s| s.0).max().unwrap_or(0);
    let nmax = shapes.iter().map(|s| s.1).max().unwrap_or(0);
    let a: Vec<i8> = (0..kmax).map(|_| rnd() as i8).collect();
    let sa = [0.02f32];
    let mut out = vec![0f32; nmax];
    let pass = |out: &mut [f32]| -> Result<&'static str, DeviceError> {
        let mut kernel = "";
        for (w, &(k, n)) in weights.iter().zip(&shapes) {
            let task = MatmulTask {
                m: 1,
                activations: Activations::Host(&a[..k]),
                act_scales: &sa,
                weight: w.as_weight(),
                cores: CoreMask::AUTO,
            };
            kernel = dev.matmul(&task, &mut out[..n])?.kernel;
        }
        Ok(kernel)
    };
    dev.run_on(dev.max_threads(), || {
        let kernel = pass(&mut out)?; // warm-up
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < 5 || start.elapsed().as_secs_f64() < min_seconds {
            let t = Instant::now();
            pass(&mut out)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let seconds = times[times.len() / 2];
        let weight_gbs = weight_bytes as f64 / seconds / 1e9;
        Ok(DecodePass {
            matmuls: shapes.len(),
            weight_bytes,
            seconds,
            weight_gbs,
            bandwidth_ratio: weight_gbs / bandwidth_gbs,
            kernel,
        })
    })
}
