//! `ork bench pack`: pack, verified load, reload and convert-RSS figures against their goals, each
//! ratio measured in the same run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ork_gguf::{GgmlType, GgufFile, TensorInfo};
use ork_pack::{GgufRows, PackDtype, PackedWeight, RowSource};
use ork_store::{fingerprint, matmul_weights, Orkpack, OrkpackWriter, SourceInfo};
use serde::Serialize;

use crate::cmd_pack::{print_json, ConvertJson, MIB};

/// Goal of the pack benchmark: int8 output per core, bytes per second.
const GOAL_OUT_PER_CORE: f64 = 1e9;
/// Goal: verified load at least this fraction of memcpy.
const GOAL_LOAD_RATIO: f64 = 0.8;
/// Goal: reload at least this many times faster than packing.
const GOAL_RELOAD_RATIO: f64 = 20.0;
/// Slack of the eviction goal above `largest tensor × threads`.
const EVICT_SLACK: u64 = 64 << 20;

#[derive(Serialize)]
struct PackCase {
    source: String,
    ggml_type: String,
    k: usize,
    n: usize,
    threads: usize,
    iters: usize,
    src_bytes: u64,
    out_bytes: usize,
    best_seconds: f64,
    src_mb_s_per_thread: f64,
    out_gb_s_per_thread: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct LoadCase {
    tensor: String,
    bytes: u64,
    memcpy_gb_s: f64,
    load_verified_gb_s: f64,
    load_unverified_gb_s: f64,
    hash_gb_s: f64,
    ratio: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct ReloadCase {
    tensor: String,
    blob_bytes: usize,
    pack_seconds: f64,
    /// Verified load into a freshly allocated buffer (its page faults included) plus scales.
    reload_seconds: f64,
    /// Verified load into a reused, already faulted-in buffer plus scales.
    reload_warm_seconds: f64,
    /// `pack_seconds / reload_seconds` (the goal's figure).
    ratio: f64,
    /// `pack_seconds / reload_warm_seconds`.
    ratio_warm: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct EvictRun {
    evict_src: bool,
    seconds: f64,
    baseline_rss_bytes: u64,
    peak_rss_bytes: u64,
    peak_above_baseline_bytes: u64,
    baseline_rss_anon_bytes: u64,
    peak_rss_anon_bytes: u64,
}

#[derive(Serialize)]
struct EvictCase {
    threads: usize,
    largest_tensor: String,
    largest_tensor_bytes: u64,
    bound_bytes: u64,
    without: EvictRun,
    with: EvictRun,
    peak_ratio: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct BenchPackJson {
    model: PathBuf,
    threads: usize,
    pack: Vec<PackCase>,
    load: Vec<LoadCase>,
    reload_vs_pack: Vec<ReloadCase>,
    evict: EvictCase,
}

/// Deterministic xorshift64 for synthetic data.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random but valid Q4_K blocks for a `k × n` tensor: finite positive f16 `d` / `dmin` in
/// [2^-8, 2^-4), random 6-bit scales/mins and 4-bit quants.
fn synth_q4_k(k: usize, n: usize, rng: &mut XorShift) -> Vec<u8> {
    const BLOCK: usize = 2 + 2 + 12 + 128;
    let blocks = k / 256 * n;
    let mut out = Vec::with_capacity(blocks * BLOCK);
    for _ in 0..blocks {
        for _ in 0..2 {
            // Exponent field 7..=10 (2^-8 .. 2^-5 ·1.x), random mantissa: always finite.
            let bits = ((7 + rng.next() % 4) << 10 | (rng.next() & 0x3ff)) as u16;
            out.extend_from_slice(&bits.to_le_bytes());
        }
        out.extend((0..140).map(|_| rng.next() as u8));
    }
    out
}

/// Random finite f16 values of either sign with magnitudes in [2^-10, 2).
fn synth_f16(k: usize, n: usize, rng: &mut XorShift) -> Vec<u8> {
    let mut out = Vec::with_capacity(k * n * 2);
    for _ in 0..k * n {
        let r = rng.next();
        let bits = ((r & 1) << 15 | (5 + (r >> 1) % 11) << 10 | (r >> 8) & 0x3ff) as u16;
        out.extend_from_slice(&bits.to_le_bytes());
    }
    out
}

/// Time packing `src` to int8: one calibration run, then enough iterations for ~0.3 s.
fn pack_case(
    label: String,
    ty: GgmlType,
    src: &dyn RowSource,
    src_bytes: u64,
    threads: usize,
) -> Result<PackCase> {
    let probe = ork_pack::bench_pack(src, PackDtype::I8, threads, 1)
        .with_context(|| format!("packing {label}"))?;
    let iters = ((0.3 / probe.best_seconds.max(1e-6)).ceil() as usize).clamp(3, 500);
    let r = ork_pack::bench_pack(src, PackDtype::I8, threads, iters)
        .with_context(|| format!("packing {label}"))?;
    let per_thread = r.out_bytes_per_sec_per_thread();
    Ok(PackCase {
        source: label,
        ggml_type: ty.to_string(),
        k: r.k,
        n: r.n,
        threads: r.threads,
        iters: r.iters,
        src_bytes,
        out_bytes: r.out_bytes,
        best_seconds: r.best_seconds,
        src_mb_s_per_thread: src_bytes as f64 / r.best_seconds / r.threads as f64 / 1e6,
        out_gb_s_per_thread: per_thread / 1e9,
        meets_goal: per_thread >= GOAL_OUT_PER_CORE,
    })
}

/// Best of `reps` timings of `f`.
fn best_of<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(v);
    }
    Ok((best, last.expect("at least one repetition")))
}

/// Run this binary's `convert --json` on `model` and parse its report.
fn convert_child(model: &Path, out: &Path, threads: usize, evict: bool) -> Result<EvictRun> {
    let exe = std::env::current_exe().context("locating the ork binary")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("convert")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(["--json", "--threads", &threads.to_string()])
        .env_remove("ORK_EVICT_SRC");
    if evict {
        cmd.arg("--evict-src");
    }
    let o = cmd
        .output()
        .with_context(|| format!("running {} convert", exe.display()))?;
    if !o.status.success() {
        bail!(
            "{} convert {} failed ({}): {}",
            exe.display(),
            model.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let j: ConvertJson =
        serde_json::from_slice(&o.stdout).context("parsing the JSON of ork convert")?;
    Ok(EvictRun {
        evict_src: j.evict_src,
        seconds: j.seconds,
        baseline_rss_bytes: j.baseline_rss_bytes,
        peak_rss_bytes: j.peak_rss_bytes,
        peak_above_baseline_bytes: j.peak_rss_bytes.saturating_sub(j.baseline_rss_bytes),
        baseline_rss_anon_bytes: j.baseline_rss_anon_bytes,
        peak_rss_anon_bytes: j.peak_rss_anon_bytes,
    })
}

/// `ork bench pack --model MODEL.gguf [--threads N] [--json]`.
pub fn bench_pack(model_path: &Path, threads: usize, json: bool) -> Result<ExitCode> {
    let threads = threads.max(1);
    let model = GgufFile::open(model_path)?;
    let weights = matmul_weights(&model)?;
    let note = |s: &str| {
        if !json {
            eprintln!("bench pack: {s}");
        }
    };

    // (a) Pack throughput per source type.
    note("pack throughput");
    let largest_of = |ty: GgmlType| weights.iter().filter(|t| t.ty == ty).max_by_key(|t| t.size);
    let mut pack = Vec::new();
    let mut real: Vec<&TensorInfo> = Vec::new();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let t = largest_of(ty).with_context(|| {
            format!("{}: no {ty} matmul weight to measure", model_path.display())
        })?;
        let rows = GgufRows::new(&model, t).with_context(|| format!("tensor '{}'", t.name))?;
        pack.push(pack_case(
            format!("{} (model)", t.name),
            ty,
            &rows,
            t.size,
            threads,
        )?);
        real.push(t);
    }
    // Synthetic: a Llama-1B-class FFN projection (K 2048, N 8192).
    let (sk, sn) = (2048usize, 8192usize);
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for (ty, bytes) in [
        (GgmlType::Q4_K, synth_q4_k(sk, sn, &mut rng)),
        (GgmlType::F16, synth_f16(sk, sn, &mut rng)),
    ] {
        let dims = [sk as u64, sn as u64];
        let rows = GgufRows::from_blocks("synthetic", ty, &dims, &bytes)?;
        pack.push(pack_case(
            format!("synthetic {sk}x{sn}"),
            ty,
            &rows,
            bytes.len() as u64,
            threads,
        )?);
    }

    // (b) + (c): write the measured model weights to a pack, then load / reload them.
    note("load vs memcpy, reload vs pack");
    let dir = tempfile::Builder::new()
        .prefix("ork-bench-pack.")
        .tempdir()
        .context("creating a temp directory")?;
    let pack_path = dir.path().join("bench.orkpack");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the pack thread pool")?;
    let mut packed: Vec<(&TensorInfo, f64, PackedWeight)> = Vec::new();
    for &t in &real {
        let rows = GgufRows::new(&model, t).with_context(|| format!("tensor '{}'", t.name))?;
        let (secs, pw) = best_of(5, || {
            ork_pack::pack_in(&pool, &rows, PackDtype::I8)
                .with_context(|| format!("packing tensor '{}'", t.name))
        })?;
        packed.push((t, secs, pw));
    }
    {
        let mut w = OrkpackWriter::create(&pack_path)?;
        for (t, _, pw) in &packed {
            let src = SourceInfo {
                fingerprint: fingerprint(&model, t),
                ggml_type: t.ty.id(),
            };
            w.add(&t.name, pw, src)?;
        }
        w.finish()?;
    }
    let opened = Orkpack::open(&pack_path)?;
    let mut load = Vec::new();
    let mut reload = Vec::new();
    for (t, pack_secs, pw) in &packed {
        let e = opened
            .entry(&t.name)
            .with_context(|| format!("{}: entry '{}' missing", pack_path.display(), t.name))?;
        let b = ork_store::bench_load(&opened, e, 20)?;
        load.push(LoadCase {
            tensor: t.name.clone(),
            bytes: b.bytes,
            memcpy_gb_s: b.memcpy_gb_s,
            load_verified_gb_s: b.load_verified_gb_s,
            load_unverified_gb_s: b.load_unverified_gb_s,
            hash_gb_s: b.hash_gb_s,
            ratio: b.verified_ratio(),
            meets_goal: b.verified_ratio() >= GOAL_LOAD_RATIO,
        });
        let (reload_secs, got) = best_of(10, || Ok(opened.load(&t.name, true)?))?;
        if got != *pw {
            bail!(
                "{}: tensor '{}' reloaded differently from what was packed",
                pack_path.display(),
                t.name
            );
        }
        // Into a reused (already faulted-in) buffer, as a weight-cache slot would be.
        let mut slot = vec![0u8; e.blob_range().1 as usize];
        let (warm_secs, ()) = best_of(10, || {
            opened.load_into(e, &mut slot, true)?;
            opened.scales(e)?;
            Ok(())
        })?;
        let ratio = pack_secs / reload_secs;
        reload.push(ReloadCase {
            tensor: t.name.clone(),
            blob_bytes: pw.data.len(),
            pack_seconds: *pack_secs,
            reload_seconds: reload_secs,
            reload_warm_seconds: warm_secs,
            ratio,
            ratio_warm: pack_secs / warm_secs,
            meets_goal: ratio >= GOAL_RELOAD_RATIO,
        });
    }
    drop(opened);
    drop(packed);

    // (d) Peak RSS of `ork convert` with and without source eviction, in child processes.
    note("convert peak RSS with and without --evict-src (two child processes)");
    let without = convert_child(model_path, &dir.path().join("a.orkpack"), threads, false)?;
    let with = convert_child(model_path, &dir.path().join("b.orkpack"), threads, true)?;
    let (largest, largest_bytes) = weights
        .iter()
        .map(|t| {
            let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
            let l = ork_pack::TiledLayout::new(PackDtype::I8, k, n);
            let packed = (l.blob_bytes() + 4 * n) as u64;
            (t.name.clone(), packed.max(t.size))
        })
        .max_by_key(|(_, b)| *b)
        .context("the model has no matmul weights")?;
    let bound = largest_bytes * threads as u64 + EVICT_SLACK;
    let evict = EvictCase {
        threads,
        largest_tensor: largest,
        largest_tensor_bytes: largest_bytes,
        bound_bytes: bound,
        peak_ratio: with.peak_rss_bytes as f64 / without.peak_rss_bytes.max(1) as f64,
        meets_goal: with.peak_above_baseline_bytes <= bound,
        without,
        with,
    };

    let out = BenchPackJson {
        model: model_path.to_path_buf(),
        threads,
        pack,
        load,
        reload_vs_pack: reload,
        evict,
    };
    if json {
        print_json(&out)?;
    } else {
        print_bench_pack(&out);
    }
    Ok(ExitCode::SUCCESS)
}

fn goal(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "NO"
    }
}

fn print_bench_pack(b: &BenchPackJson) {
    let mib = |x: u64| x as f64 / MIB;
    println!(
        "ork bench pack: {} (threads {})",
        b.model.display(),
        b.threads
    );
    println!();
    println!("(a) pack to int8, per thread (goal >= 1 GB/s of int8 output per core)");
    println!(
        "  {:<6} {:<34} {:>6} {:>6} {:>10} {:>13} {:>12}  goal",
        "type", "tensor", "K", "N", "best ms", "src MB/s/thr", "out GB/s/thr"
    );
    for c in &b.pack {
        println!(
            "  {:<6} {:<34} {:>6} {:>6} {:>10.3} {:>13.0} {:>12.2}  {}",
            c.ggml_type,
            c.source,
            c.k,
            c.n,
            c.best_seconds * 1e3,
            c.src_mb_s_per_thread,
            c.out_gb_s_per_thread,
            goal(c.meets_goal)
        );
    }
    println!();
    println!("(b) verified load into a fresh page-aligned buffer vs memcpy (goal >= 0.8)");
    println!(
        "  {:<24} {:>9} {:>11} {:>11} {:>11} {:>9} {:>6}  goal",
        "tensor", "MiB", "memcpy GB/s", "load GB/s", "no-verify", "hash GB/s", "ratio"
    );
    for c in &b.load {
        println!(
            "  {:<24} {:>9.1} {:>11.2} {:>11.2} {:>11.2} {:>9.2} {:>6.2}  {}",
            c.tensor,
            mib(c.bytes),
            c.memcpy_gb_s,
            c.load_verified_gb_s,
            c.load_unverified_gb_s,
            c.hash_gb_s,
            c.ratio,
            goal(c.meets_goal)
        );
    }
    println!();
    println!("(c) verified reload vs pack of the same weight (goal >= 20x; fresh buffer)");
    println!(
        "  {:<24} {:>9} {:>10} {:>10} {:>7} {:>13} {:>10}  goal",
        "tensor", "MiB", "pack ms", "reload ms", "ratio", "reused-buf ms", "ratio"
    );
    for c in &b.reload_vs_pack {
        println!(
            "  {:<24} {:>9.1} {:>10.2} {:>10.2} {:>6.1}x {:>13.2} {:>9.1}x  {}",
            c.tensor,
            mib(c.blob_bytes as u64),
            c.pack_seconds * 1e3,
            c.reload_seconds * 1e3,
            c.ratio,
            c.reload_warm_seconds * 1e3,
            c.ratio_warm,
            goal(c.meets_goal)
        );
    }
    let e = &b.evict;
    println!();
    println!(
        "(d) ork convert peak RSS, threads {} (goal: with --evict-src, peak above baseline <= \
         largest tensor x threads + 64 MiB = {:.1} MiB; largest: {} {:.1} MiB)",
        e.threads,
        mib(e.bound_bytes),
        e.largest_tensor,
        mib(e.largest_tensor_bytes)
    );
    println!(
        "  {:<14} {:>8} {:>13} {:>13} {:>15} {:>14}",
        "", "seconds", "baseline MiB", "peak MiB", "above base MiB", "anon peak MiB"
    );
    for r in [&e.without, &e.with] {
        println!(
            "  {:<14} {:>8.2} {:>13.1} {:>13.1} {:>15.1} {:>14.1}",
            if r.evict_src {
                "--evict-src"
            } else {
                "no eviction"
            },
            r.seconds,
            mib(r.baseline_rss_bytes),
            mib(r.peak_rss_bytes),
            mib(r.peak_above_baseline_bytes),
            mib(r.peak_rss_anon_bytes)
        );
    }
    println!(
        "  peak with / without: {:.2}; goal met: {}",
        e.peak_ratio,
        goal(e.meets_goal)
    );
}
