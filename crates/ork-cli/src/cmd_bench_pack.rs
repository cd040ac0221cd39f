//! `ork bench pack`: prints the report of `ork_runtime::bench::pack::bench_pack`; runs the
//! convert child processes it asks for.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ork_runtime::bench::pack::{
    bench_pack as run_bench, ConvertRequest, EvictRun, PackBenchFrontEnd, PackBenchReport,
};

use crate::cmd_pack::{print_json, ConvertJson, MIB};

/// Run this binary's `convert --json` as `r` asks and parse its report.
fn convert_child(r: &ConvertRequest<'_>) -> Result<EvictRun> {
    let exe = std::env::current_exe().context("locating the ork binary")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("convert")
        .arg(r.model)
        .arg("-o")
        .arg(r.out)
        .args(["--json", "--threads", &r.threads.to_string()])
        .env_remove("ORK_EVICT_SRC");
    if r.evict_src {
        cmd.arg("--evict-src");
    }
    let o = cmd
        .output()
        .with_context(|| format!("running {} convert", exe.display()))?;
    if !o.status.success() {
        bail!(
            "{} convert {} failed ({}): {}",
            exe.display(),
            r.model.display(),
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
    let note = |s: &str| {
        if !json {
            eprintln!("bench pack: {s}");
        }
    };
    let convert = |r: &ConvertRequest<'_>| convert_child(r).map_err(Into::into);
    let front = PackBenchFrontEnd {
        note: &note,
        convert: &convert,
    };
    let out = run_bench(model_path, threads, &front)?;
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

fn print_bench_pack(b: &PackBenchReport) {
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
