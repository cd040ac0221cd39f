//! The measurements that would recalibrate the board clock (`ork-board`,
//! `docs/board-model.md`), in the units of its board-file parameters: per-call submit cost,
//! the weight-read rate of M = 1 matmuls and the throughput of a large-M one, the allocation,
//! mapping, copy and sync costs of a DMA buffer, and the host's read rate. Run by `ork doctor`
//! where a runtime can compute; against the CI stand-in they are labelled as its (the
//! emulator's timings are not a board's), and without one they are not measured at all.

use std::time::Instant;

use ork_device::check_data::{random_weight, CheckRng};
use ork_device::{upload, Activations, BufferIntent, CoreMask, Device, DomainId, MatmulTask};
use ork_pack::{PackDtype, ScaleGroup};
use serde::Serialize;

/// The measurements, each under the board-file parameter it would set (seconds, bytes per
/// second, operations per second).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Calibration {
    /// `call_s`: median time of a tiny int8 matmul (M 1, K 64, N 64).
    pub call_s: f64,
    /// `npu_read_bw`: weight bytes over (time − `call_s`) of the largest M = 1 matmul below.
    pub npu_read_bw: f64,
    /// Per M = 1 matmul measured: (K, N, weight bytes, median seconds).
    pub m1: Vec<(usize, usize, u64, f64)>,
    /// `npu_int8_ops`: 2·M·K·N over (time − `call_s`) of an int8 matmul of M 128, K 2048, N 2048.
    pub npu_int8_ops: f64,
    /// `alloc_s`: the intercept of a DMA buffer's create time over its size (1 and 64 MiB).
    pub alloc_s: f64,
    /// `map_s_per_byte`: the slope of the same line.
    pub map_s_per_byte: f64,
    /// `memcpy_bw`: one thread copying 64 MiB from host memory into a DMA buffer.
    pub memcpy_bw: f64,
    /// `sync_s_per_byte`: syncing that buffer to the device, per byte.
    pub sync_s_per_byte: f64,
    /// Every host thread reading 256 MiB at once: a lower bound on `ddr_bw` (the shared bus).
    pub host_read_bw: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `reps` int8 matmuls of `m × k × n` on `dev` (after one warm-up); the
/// weight's device bytes.
fn time_matmul(
    dev: &dyn Device,
    m: usize,
    k: usize,
    n: usize,
    reps: usize,
) -> Result<(f64, u64), String> {
    let mut rng = CheckRng::new(0xca1b ^ (k * n) as u64);
    let (pw, _) = random_weight(PackDtype::I8, k, n, ScaleGroup::PerChannel, &mut rng);
    let w = upload(dev, &pw, DomainId(0)).map_err(|e| e.to_string())?;
    let a: Vec<i8> = (0..m * k).map(|_| rng.next_u64() as i8).collect();
    let sa = vec![0.01f32; m];
    let mut out = vec![0f32; m * n];
    let mut times = Vec::with_capacity(reps);
    for i in 0..=reps {
        let task = MatmulTask {
            m,
            activations: Activations::Host(&a),
            act_scales: &sa,
            weight: w.as_weight(),
            cores: CoreMask::AUTO,
        };
        let t0 = Instant::now();
        dev.matmul(&task, &mut out).map_err(|e| e.to_string())?;
        if i > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok((median(times), pw.layout.blob_bytes() as u64))
}

/// Seconds to create a DMA buffer of `bytes` (median of 3).
fn time_create(dev: &dyn Device, bytes: usize) -> Result<f64, String> {
    let mut times = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let b = dev
            .create_buffer(bytes as u64, BufferIntent::Weight, DomainId(0))
            .map_err(|e| e.to_string())?;
        times.push(t0.elapsed().as_secs_f64());
        drop(b);
    }
    Ok(median(times))
}

/// Every host thread summing its share of a 256 MiB buffer: bytes per second.
fn host_read_bw() -> f64 {
    let words = (256usize << 20) / 8;
    let data: Vec<u64> = (0..words as u64).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            data.chunks(words.div_ceil(threads))
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64());
    }
    best
}

/// Measure everything on `dev`.
pub fn calibrate(dev: &dyn Device) -> Result<Calibration, String> {
    let mut c = Calibration {
        call_s: time_matmul(dev, 1, 64, 64, 30)?.0,
        ..Calibration::default()
    };
    for (k, n) in [(1024, 1024), (2048, 2048), (4096, 4096)] {
        let (t, bytes) = time_matmul(dev, 1, k, n, 5)?;
        c.m1.push((k, n, bytes, t));
    }
    let &(_, _, bytes, t) = c.m1.last().expect("three sizes");
    c.npu_read_bw = bytes as f64 / (t - c.call_s).max(1e-9);
    let (m, k, n) = (128, 2048, 2048);
    let (t, _) = time_matmul(dev, m, k, n, 3)?;
    c.npu_int8_ops = 2.0 * (m * k * n) as f64 / (t - c.call_s).max(1e-9);
    let (small, large) = (1usize << 20, 64usize << 20);
    let (ts, tl) = (time_create(dev, small)?, time_create(dev, large)?);
    c.map_s_per_byte = ((tl - ts) / (large - small) as f64).max(0.0);
    c.alloc_s = (ts - small as f64 * c.map_s_per_byte).max(0.0);
    let src = vec![0x5au8; large];
    let mut b = dev
        .create_buffer(large as u64, BufferIntent::Weight, DomainId(0))
        .map_err(|e| e.to_string())?;
    let mut copies = Vec::new();
    let mut syncs = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        b.as_mut_slice()[..large].copy_from_slice(&src);
        copies.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        b.sync_to_device().map_err(|e| e.to_string())?;
        syncs.push(t0.elapsed().as_secs_f64());
    }
    c.memcpy_bw = large as f64 / median(copies);
    c.sync_s_per_byte = median(syncs) / large as f64;
    drop(b);
    c.host_read_bw = host_read_bw();
    Ok(c)
}

impl Calibration {
    /// The report's lines; `board`: measured on an NPU (else on the stand-in, not a board).
    pub fn lines(&self, board: bool) -> Vec<String> {
        let gb = |x: f64| x / 1e9;
        let mut v = vec![
            format!("call_s {:.1} µs (a tiny int8 matmul, M 1 K 64 N 64)", self.call_s * 1e6),
            format!(
                "npu_read_bw {:.2} GB/s (M 1 K 4096 N 4096: weight bytes over time − call_s); M = 1: {}",
                gb(self.npu_read_bw),
                self.m1
                    .iter()
                    .map(|(k, n, b, t)| format!("K {k} N {n} {:.0} µs ({:.2} GB/s)", t * 1e6, gb(*b as f64 / t)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "npu_int8_ops {:.3} TOPS (M 128 K 2048 N 2048)",
                self.npu_int8_ops / 1e12
            ),
            format!(
                "alloc_s {:.1} µs, map_s_per_byte 1 / {:.1} GB/s (DMA buffers of 1 and 64 MiB)",
                self.alloc_s * 1e6,
                gb(1.0 / self.map_s_per_byte.max(1e-30))
            ),
            format!(
                "memcpy_bw {:.2} GB/s (one thread, 64 MiB into a DMA buffer); sync_s_per_byte 1 / {:.1} GB/s",
                gb(self.memcpy_bw),
                gb(1.0 / self.sync_s_per_byte.max(1e-30))
            ),
            format!(
                "host read {:.2} GB/s (every thread, 256 MiB): a lower bound on ddr_bw",
                gb(self.host_read_bw)
            ),
        ];
        v.push(if board {
            "these are this board's figures: put them in a board file's \"overrides\" \
             (docs/board-model.md, \"What a board run must confirm first\") and project with \
             --project FILE.json"
                .to_owned()
        } else {
            "the stand-in runs on the CPU emulator: these test the measurement, they are NOT a \
             board's figures and must not go into a board file"
                .to_owned()
        });
        v
    }
}
