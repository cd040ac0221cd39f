//! `ork bench stream` and `ork bench stream --decode`: prefill and decode tok/s streamed against
//! resident (and without prefetch, and for MoE models with and without expert speculation), in
//! the same run.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use ork_exec::Tokenizer;
use ork_pack::PackDtype;
use ork_residency::Trace;
use ork_runtime::{plan_weights, Engine};

use crate::cli::ModelOpts;
use crate::open_model::{engine_config, open_engine, open_manifest, packed_model_bytes};

/// What `ork bench stream` and its `--decode` mode share.
struct BenchSetup {
    /// The packed model's bytes.
    full: u64,
    /// `--budget-mb`, or a quarter of the model (at least the smallest budget that runs).
    streamed_budget: u64,
    /// Above the model: everything resident.
    resident_budget: u64,
    /// The bench prompt, `tokens` long.
    prompt: Vec<u32>,
    /// Whether the model has experts.
    moe: bool,
}

/// The budgets and prompt of a stream bench; opens the engine once, resident, so the
/// `.orkpack` exists before anything is timed.
fn bench_setup(opts: &ModelOpts, tokens: usize, json: bool) -> Result<BenchSetup> {
    let manifest = open_manifest(&opts.model)?;
    let dtype = PackDtype::from(opts.dtype);
    let full = packed_model_bytes(&manifest, dtype)?;
    let streamed_budget = match opts.budget_mb {
        Some(mb) => mb << 20,
        None => (full / 4).max(
            plan_weights(
                &manifest,
                dtype,
                ork_pack::ScaleGroup::PerChannel,
                1,
                1,
                1,
                4,
            )?
            .min_budget_bytes
                + (8 << 20),
        ),
    };
    let resident_budget = full + (64 << 20);
    let mut base = engine_config(opts, false)?;
    base.budget_bytes = Some((resident_budget >> 20) << 20);
    let first = open_engine(base, json)?;
    let prompt = bench_prompt(first.tokenizer(), tokens)?;
    Ok(BenchSetup {
        full,
        streamed_budget,
        resident_budget,
        prompt,
        moe: manifest.n_expert() > 0,
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
    let BenchSetup {
        full,
        streamed_budget,
        resident_budget,
        prompt,
        ..
    } = bench_setup(opts, tokens, json)?;
    if let Some(path) = plot {
        // Refused now, not after the rounds (docs/cli.md: the rule for every file ork writes).
        ork_io::output::check_output(path, &[opts.model.as_path()]).context("--plot")?;
    }

    let configs = [
        ("resident", resident_budget, true),
        ("streamed", streamed_budget, true),
        ("streamed, no prefetch", streamed_budget, false),
    ];
    // One stack per configuration, then interleaved rounds (a noisy machine hits them alike);
    // each configuration's figure is the median of its rounds, after one warm-up pass each.
    let mut runs = Vec::new();
    let mut recorders = Vec::new();
    for (label, budget, prefetch) in configs {
        let mut config = engine_config(opts, true)?;
        config.budget_bytes = Some(budget.div_ceil(1 << 20) << 20);
        config.prefetch = prefetch;
        let engine = open_engine(config, true)?;
        recorders.push(crate::cmd_project::record_bench(&engine));
        let trace = Arc::clone(engine.trace().context("the engine records a trace")?);
        let trace_t0 = Instant::now();
        let mut session = engine.session_with_context(tokens + 1)?;
        session.prefill(&prompt)?;
        drop(session);
        runs.push(StreamRun {
            label,
            budget,
            prefetch,
            engine,
            trace,
            trace_t0,
            seconds: Vec::new(),
            last_start_us: 0.0,
        });
    }
    for round in 0..rounds.max(1) {
        for (run, rec) in runs.iter_mut().zip(&recorders) {
            // The board clock replays the last round.
            if let (Some(rec), true) = (rec, round + 1 == rounds.max(1)) {
                rec.clear();
            }
            let mut session = run.engine.session_with_context(tokens + 1)?;
            let t0 = Instant::now();
            session.prefill(&prompt)?;
            run.seconds.push(t0.elapsed().as_secs_f64());
            // Timeline of the last round only: microseconds since the trace began.
            run.last_start_us = t0.saturating_duration_since(run.trace_t0).as_secs_f64() * 1e6;
        }
    }
    let mut results = Vec::new();
    let mut trace_of_streamed = None;
    for run in &runs {
        let StreamRun {
            label,
            budget,
            prefetch,
            engine,
            trace,
            seconds: secs,
            last_start_us: last_start,
            ..
        } = run;
        let mut sorted = secs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let stats = engine.cache_stats();
        if *label == "streamed" {
            trace_of_streamed = Some(
                trace
                    .events()
                    .into_iter()
                    .filter(|e| e.ts >= *last_start)
                    .collect::<Vec<_>>(),
            );
        }
        results.push(serde_json::json!({
            "config": label, "budget_bytes": budget, "prefetch": prefetch,
            "prefill_tokens": tokens, "seconds": median, "tok_s": tokens as f64 / median,
            "round_tok_s": secs.iter().map(|s| tokens as f64 / s).collect::<Vec<_>>(),
            "loads": stats.loads, "evictions": stats.evictions, "wall_hits": stats.wall_hits,
            "waits": stats.waits, "stall_seconds": stats.stall_seconds,
            "peak_resident_bytes": stats.peak_resident,
        }));
    }
    let tok_s = |i: usize| results[i]["tok_s"].as_f64().unwrap_or(0.0);
    let ratio = tok_s(1) / tok_s(0);
    let ratio_off = tok_s(2) / tok_s(0);
    let mut projected = Vec::new();
    for (run, rec) in runs.iter().zip(&recorders) {
        if let Some(rec) = rec {
            projected.push(crate::cmd_project::bench_prefill_tok_s(
                &run.engine,
                rec,
                tokens,
            )?);
        }
    }
    let projected_ratios =
        (projected.len() == 3).then(|| (projected[1] / projected[0], projected[2] / projected[0]));
    if let Some(path) = plot {
        crate::plot::stream_svg(
            path,
            &[opts.model.as_path()],
            &results,
            trace_of_streamed.as_deref().unwrap_or(&[]),
        )
        .with_context(|| format!("--plot: writing {}", path.display()))?;
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": full,
                "results": results, "streamed_over_resident": ratio,
                "no_prefetch_over_resident": ratio_off,
                "projected": projected_ratios.map(|(a, b)| serde_json::json!({
                    "label": "projected", "board": crate::cmd_project::BENCH_BOARD,
                    "model_version": ork_board::MODEL_VERSION, "prefill_tok_s": projected,
                    "streamed_over_resident": a, "no_prefetch_over_resident": b}))})
        );
    } else {
        for r in &results {
            println!(
                "{:<24} budget {:>7.1} MiB  prefill {:>4} tok  {:>8.1} tok/s  loads {:>5}  waits {:>4} ({:.3} s stalled)",
                r["config"].as_str().unwrap_or(""),
                r["budget_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64,
                tokens,
                r["tok_s"].as_f64().unwrap_or(0.0),
                r["loads"],
                r["waits"],
                r["stall_seconds"].as_f64().unwrap_or(0.0),
            );
        }
        println!("streamed / resident = {ratio:.3}   (no prefetch: {ratio_off:.3})");
        if let Some((a, b)) = projected_ratios {
            println!(
                "projected on {} (board model {}): streamed / resident = {a:.3}   (no prefetch: {b:.3})",
                crate::cmd_project::BENCH_BOARD,
                ork_board::MODEL_VERSION
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), `None` where there is none.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// One configuration of `ork bench stream --decode` and its timed rounds.
struct DecodeRun {
    label: &'static str,
    budget: u64,
    engine: Engine,
    /// Decode seconds per timed round.
    seconds: Vec<f64>,
    /// Cache counters summed over the timed decode steps.
    stall_seconds: f64,
    waits: u64,
    bytes: u64,
    evictions: u64,
    /// Expert matmuls and hits, predictions, used and predicted-used experts over the timed
    /// decode steps.
    expert_matmuls: u64,
    expert_hits: u64,
    predictions: u64,
    used: u64,
    predicted_used: u64,
    /// The greedy tokens of the last round.
    tokens: Vec<u32>,
}

/// `ork bench stream --decode N`: decode tok/s, compute stall, waits, bytes streamed per token
/// and (MoE) expert hit rate and recall, counted over the decode steps only, for the model
/// resident, streamed with speculative expert prefetch, streamed with experts announced only
/// after their router (MoE models) and streamed without prefetch; each engine warmed by one
/// untimed round, then interleaved timed rounds.
pub fn bench_decode(
    opts: &ModelOpts,
    prompt_tokens: usize,
    decode: usize,
    rounds: usize,
    json: bool,
) -> Result<ExitCode> {
    crate::open_model::refuse_cpu(opts, "bench stream --decode")?;
    let load_before = load_average();
    let BenchSetup {
        full,
        streamed_budget,
        resident_budget,
        prompt,
        moe,
    } = bench_setup(opts, prompt_tokens, json)?;

    // (label, budget, prefetch, expert speculation)
    let mut configs = vec![("resident", resident_budget, true, Some(1))];
    configs.push(("streamed", streamed_budget, true, Some(1)));
    if moe {
        // How many experts beyond the router's k to predict: the default k + 1 against k and
        // k + 2 (more recall, more bytes).
        configs.push(("streamed, speculation k", streamed_budget, true, Some(0)));
        configs.push(("streamed, speculation k+2", streamed_budget, true, Some(2)));
        configs.push(("streamed, no speculation", streamed_budget, true, None));
    }
    configs.push(("streamed, no prefetch", streamed_budget, false, None));
    let context = prompt.len() + decode + 1;
    let mut runs = Vec::new();
    for (label, budget, prefetch, speculation) in configs {
        let mut config = engine_config(opts, false)?;
        config.budget_bytes = Some(budget.div_ceil(1 << 20) << 20);
        config.prefetch = prefetch;
        config.expert_speculation = if opts.no_speculate { None } else { speculation };
        let engine = open_engine(config, true)?;
        let mut run = DecodeRun {
            label,
            budget,
            engine,
            seconds: Vec::new(),
            stall_seconds: 0.0,
            waits: 0,
            bytes: 0,
            evictions: 0,
            expert_matmuls: 0,
            expert_hits: 0,
            predictions: 0,
            used: 0,
            predicted_used: 0,
            tokens: Vec::new(),
        };
        // Warm-up: the weights the decode uses are loaded once (resident) or the cache reaches
        // its steady state (streamed) before anything is timed.
        decode_round(&mut run, &prompt, decode, context, false)?;
        runs.push(run);
    }
    for _ in 0..rounds.max(1) {
        for run in runs.iter_mut() {
            decode_round(run, &prompt, decode, context, true)?;
        }
    }
    let load_after = load_average();
    let n_rounds = rounds.max(1) as f64;
    let steps = n_rounds * decode as f64;
    let mut results = Vec::new();
    for run in &runs {
        let mut sorted = run.seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        results.push(serde_json::json!({
            "config": run.label, "budget_bytes": run.budget,
            "decode_tokens": decode, "seconds": median, "tok_s": decode as f64 / median,
            "round_tok_s": run.seconds.iter().map(|s| decode as f64 / s).collect::<Vec<_>>(),
            "stall_seconds_per_round": run.stall_seconds / n_rounds,
            "stall_ms_per_token": run.stall_seconds * 1e3 / steps,
            "waits_per_token": run.waits as f64 / steps,
            "mib_per_token": run.bytes as f64 / steps / (1 << 20) as f64,
            "evictions_per_token": run.evictions as f64 / steps,
            "expert_hit_rate": ratio(run.expert_hits, run.expert_matmuls),
            "predictions_per_token": moe.then(|| run.predictions as f64 / steps),
            "recall": ratio(run.predicted_used, run.used),
            "same_tokens_as_resident": run.tokens == runs[0].tokens,
        }));
    }
    let stall = |label: &str| {
        results
            .iter()
            .find(|r| r["config"] == label)
            .and_then(|r| r["stall_seconds_per_round"].as_f64())
    };
    let cut = |against: &str| match (stall("streamed"), stall(against)) {
        (Some(s), Some(o)) if o > 0.0 && moe => Some(1.0 - s / o),
        _ => None,
    };
    // The measure: speculative prefetch against loading every expert on demand; and
    // against prefetching each block's experts only once its router has run.
    let stall_cut = cut("streamed, no prefetch");
    let stall_cut_router = cut("streamed, no speculation");
    let tok_s = |i: usize| results[i]["tok_s"].as_f64().unwrap_or(0.0);
    let ratio = tok_s(1) / tok_s(0);
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": full,
                "prompt_tokens": prompt.len(), "decode_tokens": decode, "rounds": rounds,
                "results": results, "streamed_over_resident": ratio,
                "speculation_stall_cut": stall_cut,
                "speculation_stall_cut_vs_router": stall_cut_router,
                "load_average_before": load_before, "load_average_after": load_after})
        );
    } else {
        let opt = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.2}"));
        for r in &results {
            println!(
                "{:<26} budget {:>7.1} MiB  decode {:>4} tok  {:>7.1} tok/s  stall {:>6.2} ms/tok  waits {:>5.1}/tok  {:>6.1} MiB/tok  expert hits {}  recall {}{}",
                r["config"].as_str().unwrap_or(""),
                r["budget_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64,
                decode,
                r["tok_s"].as_f64().unwrap_or(0.0),
                r["stall_ms_per_token"].as_f64().unwrap_or(0.0),
                r["waits_per_token"].as_f64().unwrap_or(0.0),
                r["mib_per_token"].as_f64().unwrap_or(0.0),
                opt(&r["expert_hit_rate"]),
                opt(&r["recall"]),
                if r["same_tokens_as_resident"] == true { "" } else { "  TOKENS DIFFER" },
            );
        }
        println!("streamed / resident = {ratio:.3}");
        if let (Some(cut), Some(router)) = (stall_cut, stall_cut_router) {
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
            fmt(load_before),
            fmt(load_after)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One round of [`bench_decode`]: a fresh session prefills `prompt`, then decodes `decode`
/// tokens greedily; with `timed`, the decode's time and counters are added to `run`.
fn decode_round(
    run: &mut DecodeRun,
    prompt: &[u32],
    decode: usize,
    context: usize,
    timed: bool,
) -> Result<()> {
    let engine = &run.engine;
    let mut session = engine.session_with_context(context)?;
    let mut logits = session.prefill(prompt)?;
    let (cache0, experts0) = (engine.cache_stats(), engine.expert_stats());
    let moe0 = engine.model().moe_stats();
    let mut tokens = Vec::with_capacity(decode);
    let t0 = Instant::now();
    for _ in 0..decode {
        let next = ork_exec::ops::argmax(&logits).context("the logits are empty")? as u32;
        tokens.push(next);
        logits = session.decode(next)?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    if !timed {
        return Ok(());
    }
    let (cache1, experts1) = (engine.cache_stats(), engine.expert_stats());
    let moe1 = engine.model().moe_stats();
    run.seconds.push(seconds);
    run.stall_seconds += cache1.stall_seconds - cache0.stall_seconds;
    run.waits += cache1.waits - cache0.waits;
    run.bytes += cache1.bytes_moved - cache0.bytes_moved;
    run.evictions += cache1.evictions - cache0.evictions;
    if let (Some(a), Some(b)) = (experts0, experts1) {
        run.expert_matmuls += b.expert_matmuls - a.expert_matmuls;
        run.expert_hits += b.expert_hits - a.expert_hits;
    }
    if let (Some(a), Some(b)) = (moe0, moe1) {
        run.predictions += b.predictions - a.predictions;
        run.used += b.used - a.used;
        run.predicted_used += b.predicted_used - a.predicted_used;
    }
    run.tokens = tokens;
    Ok(())
}

/// One configuration of `ork bench stream` and its timed rounds.
struct StreamRun {
    label: &'static str,
    budget: u64,
    prefetch: bool,
    engine: Engine,
    trace: Arc<Trace>,
    trace_t0: Instant,
    seconds: Vec<f64>,
    last_start_us: f64,
}

/// `tokens` tokens of varied English text (repeated as needed), BOS first if the model adds one.
pub(crate) fn bench_prompt(tokenizer: &Tokenizer, tokens: usize) -> Result<Vec<u32>> {
    const TEXT: &str = "The history of computing is a story of machines that outgrew their memory. \
        Engineers learned to page data in and out, to overlap transfers with computation, and to \
        keep the most useful pieces close at hand. Every generation of hardware repeats the lesson: \
        bandwidth is precious, latency hides behind parallel work, and a good schedule matters \
        more than a fast kernel. ";
    let mut out = tokenizer.encode("", true, false)?;
    let body = tokenizer.encode(TEXT, false, false)?;
    while out.len() < tokens {
        out.extend_from_slice(&body);
    }
    out.truncate(tokens);
    Ok(out)
}
