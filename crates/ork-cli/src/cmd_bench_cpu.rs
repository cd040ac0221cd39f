//! `ork bench cpu`: prints the report of `ork_runtime::bench::bench_cpu`.

use std::process::ExitCode;

use anyhow::Result;
use ork_runtime::bench::{bench_cpu as run_bench, CpuBenchOptions};

/// `ork bench cpu`: prefill and decode tok/s of the CPU engine, as JSON or a few lines.
pub fn bench_cpu(options: &CpuBenchOptions, json: bool) -> Result<ExitCode> {
    let r = run_bench(options)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let spread = |xs: &[f64]| {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(0.0, f64::max);
        format!("{lo:.1}–{hi:.1}")
    };
    println!(
        "{}: CPU engine, {} threads on cpus {}, weights {}",
        r.model.display(),
        r.threads,
        r.cpus,
        r.weight_types
    );
    println!(
        "prefill {} tokens: best {:.1} tok/s, median {:.1} ({})",
        r.prompt_tokens,
        r.prefill_best,
        r.prefill_median,
        spread(&r.prefill_tok_s)
    );
    println!(
        "decode  {} tokens: best {:.1} tok/s, median {:.1} ({})",
        r.gen_tokens,
        r.decode_best,
        r.decode_median,
        spread(&r.decode_tok_s)
    );
    if let Some((before, after)) = r.load_average {
        println!("load average {before:.2} before, {after:.2} after (the machine's other work)");
    }
    Ok(ExitCode::SUCCESS)
}
