//! `ork bench stream` and its `--decode` mode: prefill and decode tok/s of a model streamed
//! through a weight budget against the same model resident (and without prefetch, and for MoE
//! models with and without expert speculation), measured in the same run with interleaved
//! rounds, and each configuration projected on the board clock.

use std::sync::Arc;
use std::time::Instant;

use ork_exec::Tokenizer;
use ork_pack::PackDtype;
use ork_residency::{Trace, TraceEvent};
use serde::Serialize;

use super::project::{bench_prefill_tok_s, record_bench};
use super::{upper_median, BenchError, EngineFrontEnd};
use crate::{plan_weights, Engine, EngineConfig};

/// What a stream benchmark runs: the engine configuration its configurations start from (each
/// sets its own budget, prefetch, speculation and trace) and the streamed budget.
#[derive(Clone, Debug)]
pub struct StreamBenchOptions {
    /// The model and every engine option the configurations share.
    pub base: EngineConfig,
    /// The streamed configurations' budget; `None`: a quarter of the model (at least the
    /// smallest budget that runs).
    pub budget_bytes: Option<u64>,
    /// Prompt tokens.
    pub tokens: usize,
    /// Timed rounds (at least 1), interleaved across configurations.
    pub rounds: usize,
}

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

/// The bytes of every weight of `manifest` packed as `dtype` with per-channel scales (the
/// benches' model size).
///
/// # Errors
/// The manifest cannot be planned (a weight the packer refuses).
pub fn packed_model_bytes(
    manifest: &ork_manifest::Manifest,
    dtype: PackDtype,
) -> Result<u64, crate::RuntimeError> {
    Ok(plan_weights(
        manifest,
        dtype,
        ork_pack::ScaleGroup::PerChannel,
        u64::MAX / 4,
        u64::MAX / 4,
        1,
        4,
    )?
    .model_bytes)
}

/// The budgets and prompt of a stream bench; opens the engine once, resident, so the
/// `.orkpack` exists before anything is timed (`quiet`: without the conversion bar).
fn bench_setup(
    options: &StreamBenchOptions,
    front: &EngineFrontEnd<'_>,
    quiet: bool,
) -> Result<BenchSetup, BenchError> {
    let gguf = ork_gguf::GgufFile::open(&options.base.model)?;
    let manifest = ork_manifest::Manifest::from_gguf(&gguf).map_err(crate::RuntimeError::from)?;
    let dtype = options.base.dtype;
    let full = packed_model_bytes(&manifest, dtype)?;
    let streamed_budget = match options.budget_bytes {
        Some(b) => b,
        None => {
            let group = ork_pack::ScaleGroup::PerChannel;
            let least = plan_weights(&manifest, dtype, group, 1, 1, 1, 4)?.min_budget_bytes;
            (full / 4).max(least + (8 << 20))
        }
    };
    let resident_budget = full + (64 << 20);
    let mut base = options.base.clone();
    base.trace = false;
    base.budget_bytes = Some((resident_budget >> 20) << 20);
    let first = front.open(base, quiet)?;
    let prompt = bench_prompt(first.tokenizer(), options.tokens)?;
    Ok(BenchSetup {
        full,
        streamed_budget,
        resident_budget,
        prompt,
        moe: manifest.n_expert() > 0,
    })
}

/// `tokens` tokens of varied English text (repeated as needed), BOS first if the model adds one.
///
/// # Errors
/// The tokenizer fails.
pub fn bench_prompt(tokenizer: &Tokenizer, tokens: usize) -> Result<Vec<u32>, BenchError> {
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

/// One configuration's prefill figures (the median of its rounds) and cache counters.
#[derive(Clone, Debug, Serialize)]
pub struct PrefillResult {
    /// `resident`, `streamed` or `streamed, no prefetch`.
    pub config: &'static str,
    /// Its weight budget.
    pub budget_bytes: u64,
    /// Whether the prefetcher ran.
    pub prefetch: bool,
    /// Prompt tokens.
    pub prefill_tokens: usize,
    /// The median round's seconds.
    pub seconds: f64,
    /// Tokens per second of the median round.
    pub tok_s: f64,
    /// Tokens per second of each round.
    pub round_tok_s: Vec<f64>,
    /// Cache counters over the whole run.
    pub loads: u64,
    /// Evictions.
    pub evictions: u64,
    /// Window-full retries.
    pub wall_hits: u64,
    /// Compute waits for a load.
    pub waits: u64,
    /// Compute stalled on loads.
    pub stall_seconds: f64,
    /// Peak resident bytes.
    pub peak_resident_bytes: u64,
}

/// The prefill configurations projected on the bench board.
#[derive(Clone, Debug)]
pub struct ProjectedPrefill {
    /// Projected prefill tok/s of each configuration.
    pub prefill_tok_s: Vec<f64>,
    /// Streamed / resident.
    pub streamed_over_resident: f64,
    /// No prefetch / resident.
    pub no_prefetch_over_resident: f64,
}

/// The report of `ork bench stream`.
#[derive(Clone, Debug)]
pub struct StreamBenchReport {
    /// The packed model's bytes.
    pub model_bytes: u64,
    /// Resident, streamed, streamed without prefetch.
    pub results: Vec<PrefillResult>,
    /// Streamed / resident tok/s.
    pub streamed_over_resident: f64,
    /// No prefetch / resident tok/s.
    pub no_prefetch_over_resident: f64,
    /// On the bench board, when every configuration recorded its device work.
    pub projected: Option<ProjectedPrefill>,
    /// The streamed configuration's trace of its last round (for a plot).
    pub streamed_trace: Vec<TraceEvent>,
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
    rec: Option<Arc<ork_board::Recorder>>,
}

/// Prefill tok/s streamed (the given budget, default 25 % of the model) vs fully resident vs
/// streamed without prefetch, in the same run: one engine per configuration warmed by one
/// untimed prefill, then interleaved rounds (a noisy machine hits them alike); each
/// configuration's figure is the median of its rounds.
///
/// # Errors
/// The model does not open or plan, an engine does not open, or a prefill fails.
pub fn bench_stream(
    options: &StreamBenchOptions,
    front: &EngineFrontEnd<'_>,
    quiet: bool,
) -> Result<StreamBenchReport, BenchError> {
    let setup = bench_setup(options, front, quiet)?;
    let configs = [
        ("resident", setup.resident_budget, true),
        ("streamed", setup.streamed_budget, true),
        ("streamed, no prefetch", setup.streamed_budget, false),
    ];
    let tokens = options.tokens;
    let mut runs = Vec::new();
    for (label, budget, prefetch) in configs {
        let mut config = options.base.clone();
        config.trace = true;
        config.budget_bytes = Some(budget.div_ceil(1 << 20) << 20);
        config.prefetch = prefetch;
        let engine = front.open(config, true)?;
        let rec = record_bench(&engine);
        let trace = Arc::clone(engine.trace().ok_or_else(|| BenchError::Model {
            what: "the engine records no trace".into(),
        })?);
        let trace_t0 = Instant::now();
        let mut session = engine.session_with_context(tokens + 1)?;
        session.prefill(&setup.prompt)?;
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
            rec,
        });
    }
    prefill_rounds(&mut runs, &setup.prompt, tokens, options.rounds)?;
    stream_report(&runs, setup.full, tokens)
}

/// The timed rounds, interleaved across configurations. The board clock replays the last round;
/// the plot's timeline is the last round's too.
fn prefill_rounds(
    runs: &mut [StreamRun],
    prompt: &[u32],
    tokens: usize,
    rounds: usize,
) -> Result<(), BenchError> {
    let rounds = rounds.max(1);
    for round in 0..rounds {
        for run in runs.iter_mut() {
            if let (Some(rec), true) = (&run.rec, round + 1 == rounds) {
                rec.clear();
            }
            let mut session = run.engine.session_with_context(tokens + 1)?;
            let t0 = Instant::now();
            session.prefill(prompt)?;
            run.seconds.push(t0.elapsed().as_secs_f64());
            // Microseconds since the trace began.
            run.last_start_us = t0.saturating_duration_since(run.trace_t0).as_secs_f64() * 1e6;
        }
    }
    Ok(())
}

/// Each configuration's figures, the ratios against resident, and the projection.
fn stream_report(
    runs: &[StreamRun],
    full: u64,
    tokens: usize,
) -> Result<StreamBenchReport, BenchError> {
    let mut results = Vec::new();
    let mut streamed_trace = Vec::new();
    for run in runs {
        let median = upper_median(&run.seconds);
        let stats = run.engine.cache_stats();
        if run.label == "streamed" {
            streamed_trace = run
                .trace
                .events()
                .into_iter()
                .filter(|e| e.ts >= run.last_start_us)
                .collect();
        }
        results.push(PrefillResult {
            config: run.label,
            budget_bytes: run.budget,
            prefetch: run.prefetch,
            prefill_tokens: tokens,
            seconds: median,
            tok_s: tokens as f64 / median,
            round_tok_s: run.seconds.iter().map(|s| tokens as f64 / s).collect(),
            loads: stats.loads,
            evictions: stats.evictions,
            wall_hits: stats.wall_hits,
            waits: stats.waits,
            stall_seconds: stats.stall_seconds,
            peak_resident_bytes: stats.peak_resident,
        });
    }
    let mut projected = Vec::new();
    for run in runs {
        if let Some(rec) = &run.rec {
            projected.push(bench_prefill_tok_s(&run.engine, rec, tokens)?);
        }
    }
    let projected = (projected.len() == 3).then(|| ProjectedPrefill {
        streamed_over_resident: projected[1] / projected[0],
        no_prefetch_over_resident: projected[2] / projected[0],
        prefill_tok_s: projected,
    });
    Ok(StreamBenchReport {
        model_bytes: full,
        streamed_over_resident: results[1].tok_s / results[0].tok_s,
        no_prefetch_over_resident: results[2].tok_s / results[0].tok_s,
        results,
        projected,
        streamed_trace,
    })
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), `None` where there is none.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// One configuration's decode figures, counted over the timed decode steps only.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    /// The configuration.
    pub config: &'static str,
    /// Its weight budget.
    pub budget_bytes: u64,
    /// Tokens decoded per round.
    pub decode_tokens: usize,
    /// The median round's decode seconds.
    pub seconds: f64,
    /// Decode tok/s of the median round.
    pub tok_s: f64,
    /// Decode tok/s of each round.
    pub round_tok_s: Vec<f64>,
    /// Compute stalled on loads, per round.
    pub stall_seconds_per_round: f64,
    /// Stall per decoded token, ms.
    pub stall_ms_per_token: f64,
    /// Waits per decoded token.
    pub waits_per_token: f64,
    /// MiB streamed per decoded token.
    pub mib_per_token: f64,
    /// Evictions per decoded token.
    pub evictions_per_token: f64,
    /// Expert matmuls that found their weight resident (MoE).
    pub expert_hit_rate: Option<f64>,
    /// Experts predicted per decoded token (MoE).
    pub predictions_per_token: Option<f64>,
    /// Used experts that were predicted (MoE, with speculation).
    pub recall: Option<f64>,
    /// The greedy tokens of the last round equal the resident configuration's.
    pub same_tokens_as_resident: bool,
}

/// The report of `ork bench stream --decode`.
#[derive(Clone, Debug)]
pub struct DecodeBenchReport {
    /// The packed model's bytes.
    pub model_bytes: u64,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens decoded per round.
    pub decode_tokens: usize,
    /// Timed rounds as asked.
    pub rounds: usize,
    /// Each configuration, resident first.
    pub results: Vec<DecodeResult>,
    /// Streamed / resident decode tok/s.
    pub streamed_over_resident: f64,
    /// MoE: the stall speculative prefetch cuts against loading every expert on demand.
    pub speculation_stall_cut: Option<f64>,
    /// MoE: the same against prefetching each block's experts once its router has run.
    pub speculation_stall_cut_vs_router: Option<f64>,
    /// Load averages before and after the rounds.
    pub load_average_before: Option<[f64; 3]>,
    /// After.
    pub load_average_after: Option<[f64; 3]>,
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

impl DecodeRun {
    fn new(label: &'static str, budget: u64, engine: Engine) -> DecodeRun {
        DecodeRun {
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
        }
    }
}

/// Decode tok/s, compute stall, waits, bytes streamed per token and (MoE) expert hit rate and
/// recall, counted over the decode steps only, for the model resident, streamed with
/// speculative expert prefetch (MoE: k, k + 1 and k + 2 experts beyond the router's), streamed
/// with experts announced only after their router (MoE) and streamed without prefetch; each
/// engine warmed by one untimed round, then interleaved timed rounds of `decode` tokens after
/// the prompt.
///
/// # Errors
/// The model does not open or plan, an engine does not open, or a step fails.
pub fn bench_decode(
    options: &StreamBenchOptions,
    decode: usize,
    front: &EngineFrontEnd<'_>,
    quiet: bool,
) -> Result<DecodeBenchReport, BenchError> {
    let load_before = load_average();
    let setup = bench_setup(options, front, quiet)?;
    let (streamed, moe) = (setup.streamed_budget, setup.moe);
    // (label, budget, prefetch, expert speculation)
    let mut configs = vec![("resident", setup.resident_budget, true, Some(1))];
    configs.push(("streamed", streamed, true, Some(1)));
    if moe {
        // How many experts beyond the router's k to predict: the default k + 1 against k and
        // k + 2 (more recall, more bytes).
        configs.push(("streamed, speculation k", streamed, true, Some(0)));
        configs.push(("streamed, speculation k+2", streamed, true, Some(2)));
        configs.push(("streamed, no speculation", streamed, true, None));
    }
    configs.push(("streamed, no prefetch", streamed, false, None));
    let prompt = &setup.prompt;
    let context = prompt.len() + decode + 1;
    let speculate = options.base.expert_speculation.is_some();
    let mut runs = Vec::new();
    for (label, budget, prefetch, speculation) in configs {
        let mut config = options.base.clone();
        config.trace = false;
        config.budget_bytes = Some(budget.div_ceil(1 << 20) << 20);
        config.prefetch = prefetch;
        config.expert_speculation = if speculate { speculation } else { None };
        let mut run = DecodeRun::new(label, budget, front.open(config, true)?);
        // Warm-up: the weights the decode uses are loaded once (resident) or the cache reaches
        // its steady state (streamed) before anything is timed.
        decode_round(&mut run, prompt, decode, context, false)?;
        runs.push(run);
    }
    for _ in 0..options.rounds.max(1) {
        for run in runs.iter_mut() {
            decode_round(run, prompt, decode, context, true)?;
        }
    }
    let load_after = load_average();
    let mut report = decode_report(&runs, options.rounds, decode, moe);
    report.model_bytes = setup.full;
    report.prompt_tokens = prompt.len();
    report.load_average_before = load_before;
    report.load_average_after = load_after;
    Ok(report)
}

/// Each configuration's figures per decoded token, and the stall cuts of speculation (MoE).
fn decode_report(runs: &[DecodeRun], rounds: usize, decode: usize, moe: bool) -> DecodeBenchReport {
    let n_rounds = rounds.max(1) as f64;
    let steps = n_rounds * decode as f64;
    let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    let results: Vec<DecodeResult> = runs
        .iter()
        .map(|run| {
            let median = upper_median(&run.seconds);
            DecodeResult {
                config: run.label,
                budget_bytes: run.budget,
                decode_tokens: decode,
                seconds: median,
                tok_s: decode as f64 / median,
                round_tok_s: run.seconds.iter().map(|s| decode as f64 / s).collect(),
                stall_seconds_per_round: run.stall_seconds / n_rounds,
                stall_ms_per_token: run.stall_seconds * 1e3 / steps,
                waits_per_token: run.waits as f64 / steps,
                mib_per_token: run.bytes as f64 / steps / (1 << 20) as f64,
                evictions_per_token: run.evictions as f64 / steps,
                expert_hit_rate: ratio(run.expert_hits, run.expert_matmuls),
                predictions_per_token: moe.then(|| run.predictions as f64 / steps),
                recall: ratio(run.predicted_used, run.used),
                same_tokens_as_resident: run.tokens == runs[0].tokens,
            }
        })
        .collect();
    let stall = |label: &str| {
        results
            .iter()
            .find(|r| r.config == label)
            .map(|r| r.stall_seconds_per_round)
            .filter(|s| s.is_finite())
    };
    let cut = |against: &str| match (stall("streamed"), stall(against)) {
        (Some(s), Some(o)) if o > 0.0 && moe => Some(1.0 - s / o),
        _ => None,
    };
    DecodeBenchReport {
        model_bytes: 0,
        prompt_tokens: 0,
        decode_tokens: decode,
        rounds,
        streamed_over_resident: results[1].tok_s / results[0].tok_s,
        // The measure: speculative prefetch against loading every expert on demand;
        // and against prefetching each block's experts only once its router has run.
        speculation_stall_cut: cut("streamed, no prefetch"),
        speculation_stall_cut_vs_router: cut("streamed, no speculation"),
        results,
        load_average_before: None,
        load_average_after: None,
    }
}

/// One round of [`bench_decode`]: a fresh session prefills `prompt`, then decodes `decode`
/// tokens greedily; with `timed`, the decode's time and counters are added to `run`.
fn decode_round(
    run: &mut DecodeRun,
    prompt: &[u32],
    decode: usize,
    context: usize,
    timed: bool,
) -> Result<(), BenchError> {
    let engine = &run.engine;
    let mut session = engine.session_with_context(context)?;
    let mut logits = session.prefill(prompt)?;
    let (cache0, experts0) = (engine.cache_stats(), engine.expert_stats());
    let moe0 = engine.model().moe_stats();
    let mut tokens = Vec::with_capacity(decode);
    let t0 = Instant::now();
    for _ in 0..decode {
        let next = ork_exec::ops::argmax(&logits).ok_or_else(|| BenchError::Model {
            what: "the logits are empty".into(),
        })? as u32;
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
