//! `ork bench stream` and `ork bench stream --decode`: prints the reports of
//! `ork_runtime::bench::stream` (prefill and decode tok/s streamed against resident, in the same
//! run), and draws `--plot`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ork_runtime::bench::project::BENCH_BOARD;
use ork_runtime::bench::stream::{self, StreamBenchOptions};

use crate::cli::ModelOpts;
use crate::open_model::{bench_front, engine_config};

/// The library's options for `opts` (its budget, if any, is the streamed configurations').
fn options(opts: &ModelOpts, tokens: usize, rounds: usize) -> Result<StreamBenchOptions> {
    Ok(StreamBenchOptions {
        base: engine_config(opts, false)?,
        budget_bytes: opts.budget_mb.map(|mb| mb << 20),
        tokens,
        rounds,
    })
}

/// `ork bench stream`: prefill tok/s streamed (the given budget, default 25 % of the model) vs
/// fully resident vs streamed without prefetch, in the same run.
pub fn bench_stream(
    opts: &ModelOpts,
    tokens: usize,
    rounds: usize,
    plot: Option<&Path>,
    json: bool,
) -> Result<ExitCode> {
    crate::open_model::refuse_cpu(opts, "bench stream")?;
    let options = options(opts, tokens, rounds)?;
    if let Some(path) = plot {
        // Refused now, not after the rounds (docs/cli.md: the rule for every file ork writes).
        ork_io::output::check_output(path, &[opts.model.as_path()]).context("--plot")?;
    }
    let r = stream::bench_stream(&options, &bench_front(), json)?;
    let results: Vec<serde_json::Value> = r
        .results
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    if let Some(path) = plot {
        crate::plot::stream_svg(path, &[opts.model.as_path()], &results, &r.streamed_trace)
            .with_context(|| format!("--plot: writing {}", path.display()))?;
    }
    let (ratio, ratio_off) = (r.streamed_over_resident, r.no_prefetch_over_resident);
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": r.model_bytes,
                "results": results, "streamed_over_resident": ratio,
                "no_prefetch_over_resident": ratio_off,
                "projected": r.projected.as_ref().map(|p| serde_json::json!({
                    "label": "projected", "board": BENCH_BOARD,
                    "model_version": ork_board::MODEL_VERSION, "prefill_tok_s": p.prefill_tok_s,
                    "streamed_over_resident": p.streamed_over_resident,
                    "no_prefetch_over_resident": p.no_prefetch_over_resident}))})
        );
        return Ok(ExitCode::SUCCESS);
    }
    for r in &r.results {
        println!(
            "{:<24} budget {:>7.1} MiB  prefill {:>4} tok  {:>8.1} tok/s  loads {}  waits {} ({:.3} s stalled)",
            r.config,
            r.budget_bytes as f64 / (1 << 20) as f64,
            tokens,
            r.tok_s,
            r.loads,
            r.waits,
            r.stall_seconds,
        );
    }
    println!("streamed / resident = {ratio:.3}   (no prefetch: {ratio_off:.3})");
    if let Some(p) = &r.projected {
        println!(
            "projected on {} (board model {}): streamed / resident = {:.3}   (no prefetch: {:.3})",
            BENCH_BOARD,
            ork_board::MODEL_VERSION,
            p.streamed_over_resident,
            p.no_prefetch_over_resident
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ork bench stream --decode N`: decode tok/s, compute stall, waits, bytes streamed per token
/// and (MoE) expert hit rate and recall of each configuration of
/// `ork_runtime::bench::stream::bench_decode`.
pub fn bench_decode(
    opts: &ModelOpts,
    prompt_tokens: usize,
    decode: usize,
    rounds: usize,
    json: bool,
) -> Result<ExitCode> {
    crate::open_model::refuse_cpu(opts, "bench stream --decode")?;
    let options = options(opts, prompt_tokens, rounds)?;
    let r = stream::bench_decode(&options, decode, &bench_front(), json)?;
    if json {
        let results = serde_json::to_value(&r.results)?;
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": r.model_bytes,
                "prompt_tokens": r.prompt_tokens, "decode_tokens": decode, "rounds": rounds,
                "results": results, "streamed_over_resident": r.streamed_over_resident,
                "speculation_stall_cut": r.speculation_stall_cut,
                "speculation_stall_cut_vs_router": r.speculation_stall_cut_vs_router,
                "load_average_before": r.load_average_before,
                "load_average_after": r.load_average_after})
        );
        return Ok(ExitCode::SUCCESS);
    }
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.2}"));
    for r in &r.results {
        println!(
            "{:<26} budget {:>7.1} MiB  decode {:>4} tok  {:>7.1} tok/s  stall {:>6.2} ms/tok  waits {:>5.1}/tok  {:>6.1} MiB/tok  expert hits {}  recall {}{}",
            r.config,
            r.budget_bytes as f64 / (1 << 20) as f64,
            decode,
            r.tok_s,
            r.stall_ms_per_token,
            r.waits_per_token,
            r.mib_per_token,
            opt(r.expert_hit_rate),
            opt(r.recall),
            if r.same_tokens_as_resident { "" } else { "  TOKENS DIFFER" },
        );
    }
    println!("streamed / resident = {:.3}", r.streamed_over_resident);
    if let (Some(cut), Some(router)) = (r.speculation_stall_cut, r.speculation_stall_cut_vs_router)
    {
        println!(
            "stall cut by speculative expert prefetch: {:.1} % against on-demand loading, {:.1} % against router-only prefetch",
            cut * 100.0,
            router * 100.0
        );
    }
    let fmt = |l: Option<[f64; 3]>| {
        l.map_or("-".to_owned(), |l| {
            format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
        })
    };
    println!(
        "load average before {}, after {}",
        fmt(r.load_average_before),
        fmt(r.load_average_after)
    );
    Ok(ExitCode::SUCCESS)
}
