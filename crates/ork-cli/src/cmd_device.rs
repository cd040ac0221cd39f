//! `ork probe dma|stream|persist` and `ork bench gemm`: the board probes ported onto the
//! [`Device`] interface, and the emulated matmul against this machine's rooflines.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ork_device::bench::{bench_gemm as run_gemm_bench, BenchOptions};
use ork_device::{
    probe_dma, probe_stream, BufferIntent, Device, DeviceError, DmaProbeMode, DomainId, EmuDevice,
};
use ork_pack::PackDtype;
use ork_store::{fingerprint_bytes, Orkpack, OrkpackWriter, SourceInfo};
use serde::Serialize;

use crate::cli::{DeviceArg, DmaMode, ProbeArgs, ProbeCommand};

const MIB: u64 = 1 << 20;

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Open the backend `which` names for the probes, which only allocate buffers (`auto`: rknpu
/// where it opens, else the emulator; `ork_device::open` documents the policy).
fn open_device(which: DeviceArg) -> Result<Arc<dyn Device>> {
    let options = ork_device::OpenOptions::new().compute(false);
    let kind = which.device_kind().context(
        "the probes allocate device buffers, and --device cpu has none: use auto, emu, rknpu or rknn",
    )?;
    ork_device::open(kind, &options).context("opening the device")
}

/// `ork probe …`.
pub fn probe(args: &ProbeArgs) -> Result<ExitCode> {
    let dev = open_device(args.device)?;
    match args.which {
        ProbeCommand::Dma { mb, mode, domains } => dma(dev.as_ref(), mb, mode, domains, args.json),
        ProbeCommand::Stream { total_gb, mb } => stream(dev.as_ref(), total_gb, mb, args.json),
        ProbeCommand::Persist { mb } => persist(dev.as_ref(), mb, args.json),
    }
}

// ---------------------------------------------------------------------------------------------
// probe dma

#[derive(Serialize)]
struct DmaJson {
    device: String,
    mb: u64,
    mode: &'static str,
    domains: u32,
    count: u64,
    bytes: u64,
    gb: f64,
    per_domain: Vec<u64>,
    failed_at_index: Option<u64>,
    /// `window_full` is the driver's errno 14 (EFAULT) from MEM_CREATE.
    error_kind: Option<&'static str>,
    error: Option<String>,
}

fn dma(dev: &dyn Device, mb: u64, mode: DmaMode, domains: u32, json: bool) -> Result<ExitCode> {
    let lib_mode = match mode {
        DmaMode::Create => DmaProbeMode::Create,
        DmaMode::CreateMmap => DmaProbeMode::CreateMmap,
    };
    let r = probe_dma(dev, mb, lib_mode, domains)
        .with_context(|| format!("DMA probe ({mb} MiB buffers, {domains} domain(s))"))?;
    let out = DmaJson {
        device: dev.info().name,
        mb,
        mode: match mode {
            DmaMode::Create => "create",
            DmaMode::CreateMmap => "create-mmap",
        },
        domains,
        count: r.count_ok,
        bytes: r.bytes_ok,
        gb: r.bytes_ok as f64 / 1e9,
        per_domain: r.per_domain,
        failed_at_index: r.failed_at_index,
        error_kind: r.error.as_ref().map(|e| match e {
            DeviceError::WindowFull { .. } => "window_full",
            _ => "other",
        }),
        error: r.error.as_ref().map(ToString::to_string),
    };
    if json {
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "DMA probe on {}: {} MiB buffers, mode {}, {} domain(s)",
        out.device, out.mb, out.mode, out.domains
    );
    println!(
        "  created    {} buffers, {:.2} GB ({} bytes)",
        out.count, out.gb, out.bytes
    );
    println!("  per domain {:?}", out.per_domain);
    match (&out.failed_at_index, &out.error) {
        (Some(i), Some(e)) => println!("  failed at  #{i}: {e}"),
        _ => println!("  no failure"),
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// probe stream

#[derive(Serialize)]
struct StreamJson {
    device: String,
    total_gb: f64,
    mb: u64,
    buffers: u64,
    bytes_cycled: u64,
    gb_cycled: f64,
    max_resident_bytes: u64,
    leaked_bytes: u64,
    seconds: f64,
    gb_per_s: f64,
}

fn stream(dev: &dyn Device, total_gb: f64, mb: u64, json: bool) -> Result<ExitCode> {
    if !(total_gb.is_finite() && total_gb > 0.0 && total_gb <= 1e6) {
        bail!("--total-gb {total_gb}: must be a positive number of GB (at most 1e6)");
    }
    let window = dev.info().window_bytes;
    if mb.saturating_mul(MIB) > window {
        bail!(
            "--mb {mb}: a buffer larger than the device window ({} MiB) cannot be mapped",
            window / MIB
        );
    }
    // GB = 10^9 bytes, cycled in MiB-sized buffers: at least the requested total.
    let total_mib = (total_gb * 1e9 / MIB as f64).ceil() as u64;
    let t = Instant::now();
    let r = probe_stream(dev, total_mib, mb)
        .with_context(|| format!("stream probe ({mb} MiB weights, {total_gb} GB)"))?;
    let seconds = t.elapsed().as_secs_f64();
    let out = StreamJson {
        device: dev.info().name,
        total_gb,
        mb,
        buffers: r.buffers,
        bytes_cycled: r.bytes_cycled,
        gb_cycled: r.bytes_cycled as f64 / 1e9,
        max_resident_bytes: r.max_resident,
        leaked_bytes: r.leaked,
        seconds,
        gb_per_s: r.bytes_cycled as f64 / 1e9 / seconds.max(1e-9),
    };
    if json {
        print_json(&out)?;
    } else {
        println!("stream probe on {}: {} MiB weights", out.device, out.mb);
        println!(
            "  cycled       {} buffers, {:.2} GB through the window in {:.2} s ({:.2} GB/s)",
            out.buffers, out.gb_cycled, out.seconds, out.gb_per_s
        );
        println!(
            "  max resident {:.1} MiB",
            out.max_resident_bytes as f64 / MIB as f64
        );
        println!(
            "  leaked       {} bytes{}",
            out.leaked_bytes,
            if out.leaked_bytes == 0 {
                " (resident returned to its start)"
            } else {
                " (LEAK)"
            }
        );
    }
    Ok(if out.leaked_bytes == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

// ---------------------------------------------------------------------------------------------
// probe persist

#[derive(Serialize)]
struct PersistJson {
    device: String,
    k: usize,
    n: usize,
    dtype: &'static str,
    blob_bytes: usize,
    file: PathBuf,
    pack_seconds: f64,
    /// Creating the fresh device buffer (not part of the load).
    create_seconds: f64,
    load_seconds: f64,
    ratio: f64,
    identical: bool,
}

/// Shape of a synthetic weight of about `mb` MiB of int8: K = 4096, N rounded up to 32.
fn persist_shape(mb: u64) -> Result<(usize, usize)> {
    if mb == 0 || mb > 4096 {
        bail!("--mb {mb}: weight size must be 1..=4096 MiB");
    }
    let k = 4096usize;
    let n = ((mb * MIB) as usize / k).next_multiple_of(32);
    Ok((k, n))
}

/// A deterministic pseudo-random K×N weight whose rows are computed on demand (each row from
/// its own xorshift seed, so any split into row ranges gives the same values).
struct SyntheticRows {
    k: usize,
    n: usize,
}

impl SyntheticRows {
    const SEED: u64 = 0x2545_F491_4F6C_DD1D;
}

impl ork_pack::RowSource for SyntheticRows {
    fn k(&self) -> usize {
        self.k
    }
    fn n(&self) -> usize {
        self.n
    }
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), ork_pack::PackError> {
        for (i, row) in out.chunks_mut(self.k).enumerate() {
            let mut seed = Self::SEED ^ ((first + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for v in row {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *v = (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            }
        }
        Ok(())
    }
}

fn persist(dev: &dyn Device, mb: u64, json: bool) -> Result<ExitCode> {
    let (k, n) = persist_shape(mb)?;
    // Rows are generated as the pack kernel asks for them: no f32 copy of the whole weight
    // (that alone was 4× --mb of RAM).
    let rows = SyntheticRows { k, n };
    // Pack: best of 3 (the host is shared).
    let mut pack_seconds = f64::INFINITY;
    let mut packed = None;
    for _ in 0..3 {
        let t = Instant::now();
        let pw = ork_pack::pack(&rows, PackDtype::I8).context("packing the synthetic weight")?;
        pack_seconds = pack_seconds.min(t.elapsed().as_secs_f64());
        packed = Some(pw);
    }
    let pw = packed.expect("packed at least once");

    let dir = tempfile::Builder::new()
        .prefix("ork-probe-persist.")
        .tempdir()
        .context("creating a temp directory")?;
    let file = dir.path().join("persist.orkpack");
    let name = "probe.persist.weight";
    let source = SourceInfo {
        fingerprint: fingerprint_bytes(
            0,
            &[k as u64, n as u64],
            &SyntheticRows::SEED.to_le_bytes(),
        ),
        ggml_type: 0,
    };
    let mut w = OrkpackWriter::create(&file)?;
    w.add(name, &pw, source)?;
    w.finish()?;
    let pack = Orkpack::open(&file)?;
    let e = pack
        .entry(name)
        .with_context(|| format!("{}: entry '{name}' missing", file.display()))?;

    // Reload into a fresh device buffer each time: best of 3. Creating the buffer is timed
    // apart; the load includes the first-touch faults of the fresh buffer, the verified copy,
    // the sync and reading the scales.
    let (mut create_seconds, mut load_seconds) = (f64::INFINITY, f64::INFINITY);
    let mut last = None;
    for _ in 0..3 {
        let t = Instant::now();
        let mut buf = dev
            .create_buffer(e.blob_range().1, BufferIntent::Weight, DomainId(0))
            .context("creating the device buffer")?;
        create_seconds = create_seconds.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        pack.load_into(e, buf.as_mut_slice(), true)?;
        buf.sync_to_device()
            .context("syncing the weight to the device")?;
        let scales = pack.scales(e)?;
        load_seconds = load_seconds.min(t.elapsed().as_secs_f64());
        last = Some((buf, scales));
    }
    let (buf, scales) = last.expect("loaded at least once");
    let identical = buf.as_slice() == pw.data.as_slice()
        && scales.len() == pw.scales.len()
        && scales
            .iter()
            .zip(&pw.scales)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    let out = PersistJson {
        device: dev.info().name,
        k,
        n,
        dtype: PackDtype::I8.name(),
        blob_bytes: pw.data.len(),
        file: file.clone(),
        pack_seconds,
        create_seconds,
        load_seconds,
        ratio: pack_seconds / load_seconds,
        identical,
    };
    if json {
        print_json(&out)?;
    } else {
        print_persist(&out);
    }
    Ok(if identical {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `ork probe persist`'s text report.
fn print_persist(out: &PersistJson) {
    println!(
        "persist probe on {}: {}x{} {} weight, {:.1} MiB blob",
        out.device,
        out.k,
        out.n,
        out.dtype,
        out.blob_bytes as f64 / MIB as f64
    );
    println!(
        "  pack        {:>8.2} ms (random f32 -> int8 tiles)",
        out.pack_seconds * 1e3
    );
    println!(
        "  reload      {:>8.2} ms (verified copy from the page-cached .orkpack into a fresh \
         device buffer, first-touch faults included)",
        out.load_seconds * 1e3
    );
    println!(
        "  buffer      {:>8.2} ms to create the device buffer (not in the reload time)",
        out.create_seconds * 1e3
    );
    println!("  ratio       {:>8.1}x", out.ratio);
    println!(
        "  bytes       {}",
        if out.identical { "identical" } else { "DIFFER" }
    );
}

// ---------------------------------------------------------------------------------------------
// bench gemm

/// Goal: prefill at least this fraction of the compute roofline.
const GOAL_PREFILL: f64 = 0.5;
/// Goal: decode at least this fraction of the bandwidth roofline.
const GOAL_DECODE: f64 = 0.7;

#[derive(Serialize)]
struct GemmCaseJson {
    /// ISA of the kernel that computed the case.
    kernel: &'static str,
    m: usize,
    k: usize,
    n: usize,
    ms: f64,
    gops: f64,
    weight_gb_s: f64,
    compute_ratio: f64,
    bandwidth_ratio: f64,
}

#[derive(Serialize)]
struct DecodePassJson {
    kernel: &'static str,
    matmuls: usize,
    weight_mb: f64,
    ms: f64,
    weight_gb_s: f64,
    bandwidth_ratio: f64,
}

#[derive(Serialize)]
struct GemmJson {
    device: String,
    isa: &'static str,
    threads: usize,
    /// ISA of the compute roofline: the best int8 instruction this CPU has.
    peak_isa: &'static str,
    peak_gops: f64,
    bandwidth_gb_s: f64,
    cases: Vec<GemmCaseJson>,
    /// M = 1 through a whole SmolLM2-sized model of distinct weights, as one decode step.
    decode_pass: Option<DecodePassJson>,
    /// Mean of `compute_ratio` over the prefill cases (M > 1).
    prefill_compute_ratio: f64,
    /// `bandwidth_ratio` of the decode pass (the per-shape M = 1 cases reread a cache-resident
    /// weight, so they do not measure memory bandwidth).
    decode_bandwidth_ratio: f64,
    prefill_meets_goal: bool,
    decode_meets_goal: bool,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// `ork bench gemm [--json]`: emulated int8 matmul on SmolLM2's shapes, prefill (M = 128, 512)
/// and decode (M = 1), against the compute and bandwidth rooflines measured in the same run.
pub fn bench_gemm(json: bool) -> Result<ExitCode> {
    // The emulator's kernel on whole shapes, the lm head (N = 49152) included: the chip's N limit
    // is lifted here (a model run computes the head as 12 chunks of 4096; docs/chip.md).
    let dev = EmuDevice::with_config(ork_device::EmuConfig {
        enforce_limits: false,
        ..ork_device::EmuConfig::default()
    })
    .context("emulator")?;
    if !json {
        eprintln!(
            "bench gemm: measuring rooflines, {} SmolLM2 shapes x M = 1, 128, 512 and a decode pass",
            ork_device::bench::SMOLLM2_SHAPES.len()
        );
    }
    let r = run_gemm_bench(&dev, &BenchOptions::default()).context("GEMM benchmark")?;
    let cases: Vec<GemmCaseJson> = r
        .cases
        .iter()
        .map(|c| GemmCaseJson {
            kernel: c.kernel,
            m: c.m,
            k: c.k,
            n: c.n,
            ms: c.seconds * 1e3,
            gops: c.gops,
            weight_gb_s: c.weight_gbs,
            compute_ratio: c.compute_ratio,
            bandwidth_ratio: c.bandwidth_ratio,
        })
        .collect();
    let prefill = mean(cases.iter().filter(|c| c.m > 1).map(|c| c.compute_ratio));
    let decode_pass = r.decode.as_ref().map(|d| DecodePassJson {
        kernel: d.kernel,
        matmuls: d.matmuls,
        weight_mb: d.weight_bytes as f64 / 1e6,
        ms: d.seconds * 1e3,
        weight_gb_s: d.weight_gbs,
        bandwidth_ratio: d.bandwidth_ratio,
    });
    let decode = decode_pass.as_ref().map_or(0.0, |d| d.bandwidth_ratio);
    let out = GemmJson {
        device: dev.info().name,
        isa: r.isa,
        threads: r.threads,
        peak_isa: r.peak_isa,
        peak_gops: r.peak_gops,
        bandwidth_gb_s: r.bandwidth_gbs,
        cases,
        decode_pass,
        prefill_compute_ratio: prefill,
        decode_bandwidth_ratio: decode,
        prefill_meets_goal: prefill >= GOAL_PREFILL,
        decode_meets_goal: decode >= GOAL_DECODE,
    };
    if json {
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    print_gemm(&out);
    Ok(ExitCode::SUCCESS)
}

/// `ork bench gemm`'s text report.
fn print_gemm(out: &GemmJson) {
    println!("ork bench gemm: {} ({} threads)", out.device, out.threads);
    println!(
        "  rooflines (same run): compute {:.1} GOP/s int8 ({}, the best this CPU has), \
         bandwidth {:.2} GB/s",
        out.peak_gops, out.peak_isa, out.bandwidth_gb_s
    );
    println!();
    println!(
        "  {:>11} {:>4} {:>5} {:>6} {:>9} {:>8} {:>10} {:>9} {:>10}",
        "kernel", "M", "K", "N", "ms", "GOP/s", "wt GB/s", "compute", "bandwidth"
    );
    for c in &out.cases {
        println!(
            "  {:>11} {:>4} {:>5} {:>6} {:>9.3} {:>8.1} {:>10.2} {:>8.0}% {:>9.0}%",
            c.kernel,
            c.m,
            c.k,
            c.n,
            c.ms,
            c.gops,
            c.weight_gb_s,
            c.compute_ratio * 100.0,
            c.bandwidth_ratio * 100.0
        );
    }
    println!();
    println!(
        "  prefill (M=128, 512): mean {:.0}% of the compute roofline (goal >= 50%: {})",
        out.prefill_compute_ratio * 100.0,
        if out.prefill_meets_goal { "yes" } else { "NO" }
    );
    if let Some(d) = &out.decode_pass {
        println!(
            "  decode  (M=1, {} matmuls over {:.0} MB of distinct weights, {}): {:.2} ms per pass, \
             {:.2} GB/s = {:.0}% of the bandwidth roofline (goal >= 70%: {})",
            d.matmuls,
            d.weight_mb,
            d.kernel,
            d.ms,
            d.weight_gb_s,
            d.bandwidth_ratio * 100.0,
            if out.decode_meets_goal { "yes" } else { "NO" }
        );
        println!(
            "  (the M=1 rows above reread one cache-resident weight: their bandwidth ratio is not \
             a DRAM figure)"
        );
    }
}

/// `ork doctor`: the report (text or JSON); exit 0 if every check that could run passed, 1 if
/// one failed.
pub fn doctor(args: &crate::cli::DoctorArgs) -> Result<ExitCode> {
    use ork_runtime::doctor::{doctor, DoctorOptions, Target};
    let report = doctor(&DoctorOptions {
        model: args.model.clone(),
        soc: args.soc.into(),
    });
    if args.json {
        let checks: Vec<serde_json::Value> = report
            .checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "status": c.status.name().to_ascii_lowercase(),
                    "detail": c.detail,
                })
            })
            .collect();
        let target = match report.target {
            Target::None => "none",
            Target::Npu => "npu",
            Target::StandIn => "stand-in",
        };
        print_json(&serde_json::json!({
            "passed": report.passed(),
            "target": target,
            "checks": checks,
            // The board clock's parameters as measured (docs/board-model.md); on the stand-in
            // they are the emulator's, not a board's.
            "calibration": report.calibration.as_ref().map(|c| serde_json::json!({
                "measured_on": target, "board_figures": report.target == Target::Npu,
                "parameters": c})),
        }))?;
    } else {
        print!("{}", report.render());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
