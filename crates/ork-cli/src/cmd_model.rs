//! Verbs that run a model end to end: `run`, `perplexity`, `plan`, `bench stream`. Argument
//! parsing and output only: the model runs through [`ork_runtime::Engine`].

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ork_exec::{
    generate, ChatMessage, GenerateOptions, Sampler, SamplerOptions, TextStream, Tokenizer,
};
use ork_manifest::Manifest;
use ork_pack::PackDtype;
use ork_residency::{CacheStats, Mode, Trace};
use ork_runtime::{budget_bytes, default_slots, plan_weights, Engine, EngineConfig, PackChoice};
use serde::Serialize;

use crate::cli::{ModelOpts, PerplexityArgs, PlanArgs, RunArgs};

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The engine configuration the command line asks for.
pub(crate) fn engine_config(opts: &ModelOpts, trace: bool) -> EngineConfig {
    let mut config = EngineConfig {
        model: opts.model.clone(),
        pack: match (&opts.pack, opts.no_pack) {
            (_, true) => PackChoice::None,
            (Some(p), false) => PackChoice::Path(p.clone()),
            (None, false) => PackChoice::Default,
        },
        budget_bytes: opts.budget_mb.map(|mb| mb << 20),
        device: opts.device.into(),
        domains: opts.domains,
        dtype: opts.dtype.into(),
        activations: opts.activations.into(),
        group: ork_pack::ScaleGroup::PerChannel,
        soc: opts.soc.into(),
        threads: opts.threads,
        prefetch: !opts.no_prefetch,
        trace,
        verify: !opts.no_verify,
        evict_src: env_flag("ORK_EVICT_SRC"),
        draft: None,
        expert_speculation: (!opts.no_speculate).then_some(1),
        smooth: opts.calib.as_ref().map(|calib| ork_runtime::Smoothing {
            alpha: opts.smooth,
            calib: calib.clone(),
            targets: opts.smooth_targets,
        }),
        kv_cache: opts.kv_cache.into(),
    };
    if let Some(q) = opts.quant {
        config.set_quant(q);
    }
    config
}

/// Open the engine, drawing the conversion bar unless `quiet`; say on stderr why an existing
/// `.orkpack` was rebuilt, or that it could not be written and the run goes on from memory.
pub(crate) fn open_engine(config: EngineConfig, quiet: bool) -> Result<Engine> {
    open_loaded(Engine::load(config)?, quiet)
}

/// [`open_engine`] for a model already loaded (and checked by the caller).
fn open_loaded(loaded: ork_runtime::LoadedModel, quiet: bool) -> Result<Engine> {
    let bar = crate::progress::ConvertBar::hidden_until_started(quiet);
    let engine = loaded.open(Some(&bar))?;
    if let (Some(report), Some(path)) = (engine.convert_report(), engine.pack_path()) {
        // Say why an existing file was rewritten (stale, corrupt, other dtype …).
        if let Some(why) = report.rebuild.as_ref().filter(|_| report.rewritten) {
            if *why != ork_store::RebuildReason::Missing {
                eprintln!("[ork] rebuilt {}: {why}", path.display());
            }
        }
    }
    if let Some(e) = engine.pack_unwritable() {
        eprintln!(
            "[ork] warning: cannot write the weight cache ({e}); running without it (as --no-pack)"
        );
    }
    Ok(engine)
}

/// The figures of one run, printed as the stats line or inside `--json`.
#[derive(Serialize)]
struct RunStats {
    loaded: u64,
    packed: u64,
    packed_at_convert: u64,
    evictions: u64,
    wall_hits: u64,
    hits: u64,
    prefetched: u64,
    buffers_reused: u64,
    waits: u64,
    stall_seconds: f64,
    peak_resident_bytes: u64,
    budget_bytes: u64,
    mode: Mode,
    activations: &'static str,
    /// The chip the run kept to, and the matmul type every weight used on it.
    soc: &'static str,
    matmul_type: String,
    /// Compute threads the run used (`--threads`, or one per core).
    threads: usize,
    /// What the KV cache stored (`--kv-cache`), and its bytes at the end of the run.
    kv_cache: &'static str,
    kv_cache_bytes: usize,
    prefill_tokens: usize,
    prefill_tok_s: f64,
    decode_tokens: usize,
    decode_tok_s: f64,
    ttft_seconds: f64,
    total_seconds: f64,
    /// Weight bytes copied into device buffers during generation, per generated token.
    streamed_bytes_per_token: f64,
    /// Speculative decoding's counters (`--draft`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    speculative: Option<crate::cmd_spec::SpecReport>,
    /// Weight bytes copied into the device during the run (loads and packs).
    bytes_streamed: u64,
    /// MoE models only: expert cache hits, speculative prefetch predictions and recall.
    #[serde(skip_serializing_if = "Option::is_none")]
    experts: Option<ork_runtime::ExpertStats>,
}

impl RunStats {
    fn new(
        engine: &Engine,
        cache: &CacheStats,
        prefill: (usize, Duration),
        decode: (usize, Duration),
        ttft: Duration,
        total: Duration,
    ) -> RunStats {
        let rate = |n: usize, d: Duration| {
            if d.is_zero() {
                0.0
            } else {
                n as f64 / d.as_secs_f64()
            }
        };
        let at_convert = engine.convert_report().map_or(0, |r| r.packed as u64);
        RunStats {
            loaded: cache.loads,
            packed: cache.packs + at_convert,
            packed_at_convert: at_convert,
            evictions: cache.evictions,
            wall_hits: cache.wall_hits,
            hits: cache.hits,
            prefetched: cache.prefetched,
            buffers_reused: cache.buffers_reused,
            waits: cache.waits,
            stall_seconds: cache.stall_seconds,
            peak_resident_bytes: cache.peak_resident,
            budget_bytes: engine.cache().budget(),
            mode: engine.plan().mode,
            activations: engine.activations().name(),
            soc: engine.config().soc.name(),
            matmul_type: format!(
                "{}x{}",
                ork_device::ElemType::of_activations(engine.activations()).name(),
                ork_device::ElemType::of_weight(engine.config().dtype).name()
            ),
            threads: engine.threads(),
            kv_cache: match engine.config().kv_cache {
                ork_runtime::KvType::F16 => "f16",
                ork_runtime::KvType::F32 => "f32",
            },
            kv_cache_bytes: 0,
            prefill_tokens: prefill.0,
            prefill_tok_s: rate(prefill.0, prefill.1),
            decode_tokens: decode.0,
            decode_tok_s: rate(decode.0, decode.1),
            ttft_seconds: ttft.as_secs_f64(),
            total_seconds: total.as_secs_f64(),
            streamed_bytes_per_token: 0.0,
            speculative: None,
            bytes_streamed: cache.bytes_moved,
            experts: engine.expert_stats(),
        }
    }

    fn line(&self) -> String {
        let mut line = self.base_line();
        if let Some(s) = &self.speculative {
            line.push_str(&s.line());
        }
        line.push_str(&format!(
            " | {:.1} MiB streamed/token",
            self.streamed_bytes_per_token / (1 << 20) as f64
        ));
        line
    }

    fn base_line(&self) -> String {
        format!(
            "[ork] loaded {} | packed {} | evictions {} | wall hits {} | peak resident {:.1} MiB (budget {:.0} MiB, {}) | \
             prefill {} tok {:.1} tok/s | decode {} tok {:.1} tok/s | ttft {:.3} s",
            self.loaded,
            self.packed,
            self.evictions,
            self.wall_hits,
            self.peak_resident_bytes as f64 / (1 << 20) as f64,
            self.budget_bytes as f64 / (1 << 20) as f64,
            match self.mode {
                Mode::Resident => "resident",
                Mode::Streamed => "streamed",
            },
            self.prefill_tokens,
            self.prefill_tok_s,
            self.decode_tokens,
            self.decode_tok_s,
            self.ttft_seconds
        )
    }
}

fn read_prompt(args: &RunArgs) -> Result<String> {
    match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}: the prompt is not valid UTF-8 (invalid byte at offset {})",
                    f.display(),
                    e.utf8_error().valid_up_to()
                )
            })
        }
        (None, None) => bail!("give --prompt TEXT or --prompt-file FILE"),
    }
}

/// `ork run`.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let text = read_prompt(args)?;
    if text.is_empty() {
        bail!("the prompt is empty: give some text with --prompt or --prompt-file");
    }
    if let Some(path) = &args.model.trace {
        // Find out now, not after the generation, whether the trace can be written.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("{}: cannot write the trace", path.display()))?;
    }
    // The prompt is checked against the context before the device is opened or the .orkpack
    // converted (minutes on a large model).
    let spec_options = crate::cmd_spec::options(&args.speculative)?;
    let mut config = engine_config(&args.model, args.model.trace.is_some());
    config.draft = args
        .speculative
        .draft
        .as_ref()
        .and_then(crate::cli::DraftArg::engine_source);
    let soc = ork_device::Soc::from(args.model.soc).to_string();
    let board = crate::cmd_project::board(args.project.project.as_deref(), &soc)?;
    let loaded = Engine::load(config)?;
    let tokenizer = Arc::clone(loaded.tokenizer());
    let prompt = if args.chat {
        let template = loaded.chat_template()?.with_context(|| {
            format!(
                "{}: --chat, but the model has no chat template",
                args.model.model.display()
            )
        })?;
        let rendered = template.render(&[ChatMessage::new("user", &text)], true)?;
        tokenizer.encode(&rendered, false, true)?
    } else {
        tokenizer.encode(&text, true, false)?
    };
    let context = loaded.model().config().context_length;
    if prompt
        .len()
        .checked_add(args.n_predict)
        .is_none_or(|n| n > context)
    {
        bail!(
            "the prompt has {} tokens and -n asks for {} more, but the context of {} is {context} tokens",
            prompt.len(),
            args.n_predict,
            args.model.model.display()
        );
    }
    let engine = open_loaded(loaded, args.json)?;
    let recorder = crate::cmd_project::record(&engine, &board);
    let mut session = engine.session();
    let mut sampler = Sampler::new(SamplerOptions {
        temperature: args.temp,
        seed: args.seed,
        ..SamplerOptions::default()
    })?;
    let options = GenerateOptions {
        max_tokens: args.n_predict,
        stop_tokens: tokenizer.end_of_generation().to_vec(),
    };
    let mut stream = TextStream::new(&tokenizer, false);
    let mut out = String::new();
    let mut ttft: Option<Duration> = None;
    let stdout = std::io::stdout();
    let mut on_token = |tok| {
        ttft.get_or_insert_with(|| started.elapsed());
        let piece = stream.push(tok)?;
        if !args.json {
            let mut lock = stdout.lock();
            let _ = lock.write_all(piece.as_bytes());
            let _ = lock.flush();
        }
        out.push_str(&piece);
        Ok(())
    };
    let moved_before = crate::cmd_spec::bytes_moved(&engine);
    let (gen, spec) = match (&args.speculative.draft, spec_options) {
        (Some(kind), Some(spec_options)) => {
            let mut draft = crate::cmd_spec::make_draft(
                &engine,
                kind,
                args.temp,
                args.seed,
                args.speculative.draft_p_min,
            )?;
            let g = ork_exec::generate_speculative(
                &mut session,
                draft.as_mut(),
                &prompt,
                &options,
                &spec_options,
                &mut sampler,
                &mut ork_exec::StandardAcceptance,
                &mut on_token,
            )
            .with_context(|| format!("running {}", args.model.model.display()))?;
            let report = crate::cmd_spec::SpecReport::new(&engine, kind, &spec_options, &g);
            (g.generation, Some(report))
        }
        _ => (
            generate(&mut session, &prompt, &options, &mut sampler, &mut on_token)
                .with_context(|| format!("running {}", args.model.model.display()))?,
            None,
        ),
    };
    let moved = crate::cmd_spec::bytes_moved(&engine) - moved_before;
    let tail = stream.finish();
    out.push_str(&tail);
    let ttft = ttft.unwrap_or_else(|| started.elapsed());
    let mut stats = RunStats::new(
        &engine,
        &engine.cache_stats(),
        (gen.prompt_tokens, gen.prefill_time),
        (gen.decode_steps, gen.decode_time),
        ttft,
        started.elapsed(),
    );
    stats.streamed_bytes_per_token = moved as f64 / gen.tokens.len().max(1) as f64;
    stats.kv_cache_bytes = session.kv_bytes();
    stats.speculative = spec;
    let projected = crate::cmd_project::project_run(
        &engine,
        board.as_ref(),
        recorder.as_ref(),
        gen.prompt_tokens,
        // Tokens the passes produced: a stop token ends the text but took its decode pass.
        gen.tokens.len().max(gen.decode_steps + 1),
    )?;
    let pack = engine.pack_path().map(|p| p.display().to_string());
    drop(session);
    if let (Some(path), Some(t)) = (&args.model.trace, engine.close()) {
        t.write(path)
            .with_context(|| format!("writing the trace {}", path.display()))?;
    }
    if args.json {
        #[derive(Serialize)]
        struct Out<'a> {
            text: &'a str,
            tokens: &'a [u32],
            pack: Option<String>,
            #[serde(flatten)]
            stats: &'a RunStats,
            #[serde(skip_serializing_if = "Option::is_none")]
            projected: Option<ork_board::Projection>,
        }
        let o = Out {
            text: &out,
            tokens: &gen.tokens,
            pack,
            stats: &stats,
            projected,
        };
        println!("{}", serde_json::to_string(&o)?);
    } else {
        print!("{tail}");
        println!();
        eprintln!("{}", stats.line());
        if let Some(p) = &projected {
            eprintln!("{}", p.line());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ork perplexity`.
pub fn perplexity(args: &PerplexityArgs) -> Result<ExitCode> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not valid UTF-8 (offset {})",
            args.file.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    let engine = open_engine(engine_config(&args.model, false), args.json)?;
    let tokenizer = engine.tokenizer();
    let mut tokens = tokenizer.encode(&text, true, false)?;
    if let Some(chunks) = args.chunks {
        // Bounded by the parsers (2^24 each): no overflow.
        let want = chunks.saturating_mul(args.ctx);
        if tokens.len() < want {
            bail!(
                "{}: --chunks {chunks} needs {want} tokens of text at --ctx {}, it has {}",
                args.file.display(),
                args.ctx,
                tokens.len()
            );
        }
        tokens.truncate(want);
    }
    let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
    let t0 = Instant::now();
    let report = ork_exec::perplexity(
        engine.model(),
        &engine.shared_linear(),
        &tokens,
        args.ctx,
        bos,
        engine.config().kv_cache,
    )
    .with_context(|| format!("perplexity of {}", args.file.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let cache = engine.cache_stats();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "ppl": report.ppl, "ppl_error": report.ppl_error, "mean_nll": report.mean_nll,
                "ctx": report.n_ctx, "chunks": report.chunks, "scored_tokens": report.scored,
                "seconds": secs, "tok_s": (report.chunks * report.n_ctx) as f64 / secs,
                "loaded": cache.loads, "packed": cache.packs, "evictions": cache.evictions,
                "wall_hits": cache.wall_hits, "peak_resident_bytes": cache.peak_resident,
            })
        );
    } else {
        for (i, p) in report.running.iter().enumerate() {
            print!("[{}]{:.4} ", i + 1, p);
        }
        println!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}  ({} chunks of {} tokens, {} scored, {:.1} s)",
            report.ppl, report.ppl_error, report.chunks, report.n_ctx, report.scored, secs
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `ork plan` says about the chip: type pair, scale groups, splits.
#[derive(serde::Serialize)]
struct ChipPlan {
    soc: &'static str,
    quant: String,
    a: &'static str,
    b: &'static str,
    grouped: usize,
    per_channel: usize,
    split: Vec<SplitPlan>,
}

/// One weight the chip takes in parts.
#[derive(serde::Serialize)]
struct SplitPlan {
    name: String,
    k: usize,
    n: usize,
    parts: usize,
    n_chunks: usize,
    k_segments: usize,
    max_k: usize,
    max_n: usize,
}

fn chip_plan(config: &EngineConfig, manifest: &ork_manifest::Manifest) -> Result<ChipPlan> {
    use ork_device::ElemType;
    let (mut grouped, mut per_channel, mut split) = (0, 0, Vec::new());
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice)?;
        let (dtype, group) = ork_store::weight_quant(&w.key, config.dtype, config.group);
        let group = ork_store::effective_group(group, dtype, k);
        match group {
            ork_pack::ScaleGroup::PerChannel => per_channel += 1,
            ork_pack::ScaleGroup::Group(_) | ork_pack::ScaleGroup::Affine(_) => grouped += 1,
        }
        let layout = ork_pack::TiledLayout::new(dtype, k, n);
        let parts = ork_device::split::split(&layout, group, config.soc)
            .with_context(|| format!("splitting '{}'", w.key))?;
        if parts.len() > 1 {
            let n_chunks = parts.iter().filter(|p| p.k.start == 0).count();
            split.push(SplitPlan {
                name: w.key.clone(),
                k,
                n,
                parts: parts.len(),
                n_chunks,
                k_segments: parts.len() / n_chunks,
                max_k: parts.iter().map(|p| p.k.len()).max().unwrap_or(0),
                max_n: parts.iter().map(|p| p.n.len()).max().unwrap_or(0),
            });
        }
    }
    Ok(ChipPlan {
        soc: config.soc.name(),
        quant: config.quant().map_or_else(
            || format!("{}/{}", config.dtype.name(), config.activations.name()),
            |q| q.name(),
        ),
        a: ElemType::of_activations(config.activations).name(),
        b: ElemType::of_weight(config.dtype).name(),
        grouped,
        per_channel,
        split,
    })
}

/// `ork plan`.
pub fn plan(args: &PlanArgs) -> Result<ExitCode> {
    let soc = ork_device::Soc::from(args.soc).to_string();
    let board = crate::cmd_project::board(args.project.project.as_deref(), &soc)?;
    let manifest = open_manifest(&args.model)?;
    let budget = budget_bytes(args.budget_mb.map(|mb| mb << 20))?;
    let mut config = EngineConfig::new(&args.model);
    config.soc = args.soc.into();
    config.dtype = args.dtype.into();
    if let Some(q) = args.quant {
        config.set_quant(q);
    }
    ork_runtime::check_chip(&config, &manifest)?;
    let chip = chip_plan(&config, &manifest)?;
    let window = args.window_mb << 20;
    let p = plan_weights(
        &manifest,
        config.dtype,
        config.group,
        budget,
        window,
        args.domains,
        default_slots(),
    )?;
    let projected = match (&board, p.runnable) {
        (Some(b), true) => Some(crate::cmd_project::project_plan(
            &args.model,
            &manifest,
            &p,
            b,
            &args.project,
            (config.dtype, config.group, config.soc),
            (default_slots(), budget),
        )?),
        _ => None,
    };
    let per_prefill_tok = p.streamed_bytes_per_prefill_token(args.prefill_tokens);
    if args.json {
        let mut v = serde_json::to_value(&p)?;
        v["budget_bytes"] = budget.into();
        v["prefill_tokens"] = args.prefill_tokens.into();
        v["streamed_bytes_per_prefill_token"] = per_prefill_tok.into();
        v["streamed_bytes_per_decode_token"] = p.streamed_bytes_per_pass.into();
        v["decode_bandwidth_bound"] = p.decode_bandwidth_bound().into();
        if manifest.n_expert() > 0 {
            let f = manifest.expert_used_fraction();
            v["experts"] = manifest.n_expert().into();
            v["experts_used"] = manifest.n_expert_used().into();
            v["active_bytes_per_token"] = p.active_bytes_per_token(f).into();
            v["expected_streamed_bytes_per_token"] = p.expected_streamed_bytes_per_token(f).into();
        }
        v["chip"] = serde_json::to_value(&chip)?;
        if let Some(pr) = &projected {
            v["projected"] = serde_json::to_value(pr)?;
        }
        println!("{}", serde_json::to_string(&v)?);
        return Ok(if p.runnable {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "model {}: {} matmul weights, {:.1} MiB packed ({}), largest '{}' {:.1} MiB",
        args.model.display(),
        p.placement.len(),
        mib(p.model_bytes),
        config.dtype.name(),
        p.largest.0,
        mib(p.largest.1)
    );
    println!(
        "chip {}: {} (activations {} x weights {}), {} grouped, {} per channel",
        chip.soc, chip.quant, chip.a, chip.b, chip.grouped, chip.per_channel
    );
    if chip.split.is_empty() {
        println!("every weight fits the chip's K/N limits whole");
    }
    for s in &chip.split {
        println!(
            "  split '{}' (K {} x N {}): {} part(s), {} N-chunk(s) x {} K-segment(s), largest part K {} x N {}",
            s.name, s.k, s.n, s.parts, s.n_chunks, s.k_segments, s.max_k, s.max_n
        );
    }
    println!(
        "budget {:.0} MiB per domain, window {} MiB, {} domain(s) available",
        mib(budget),
        args.window_mb,
        args.domains
    );
    if let Some(pr) = &projected {
        println!("{}", pr.line());
    }
    if !p.runnable {
        // Name the limit that is short: the budget, the window, or both.
        let need = p.min_budget_bytes;
        let mut short = Vec::new();
        if budget < need {
            short.push(format!("the budget ({:.0} MiB)", mib(budget)));
        }
        if window < need {
            short.push(format!("the window ({} MiB)", args.window_mb));
        }
        println!(
            "NOT RUNNABLE: {} must hold the largest weight, '{}' ({} MiB)",
            short.join(" and "),
            p.largest.0,
            need.div_ceil(1 << 20)
        );
        return Ok(ExitCode::from(1));
    }
    match p.mode {
        Mode::Resident => {
            println!(
                "placement: RESIDENT across {} domain(s) — no per-token weight traffic",
                p.domains_used
            );
            let mut by_domain: HashMap<u32, (usize, u64, String, String)> = HashMap::new();
            for w in &p.placement {
                let e = by_domain
                    .entry(w.domain)
                    .or_insert((0, 0, w.name.clone(), String::new()));
                e.0 += 1;
                e.1 += w.bytes;
                e.3 = w.name.clone();
            }
            let mut ds: Vec<_> = by_domain.into_iter().collect();
            ds.sort_by_key(|d| d.0);
            for (d, (n, b, first, last)) in ds {
                println!(
                    "  domain {d}: {n} weights, {:.1} MiB ({first} .. {last})",
                    mib(b)
                );
            }
        }
        Mode::Streamed => {
            println!(
                "placement: STREAMED through domain 0 — {:.1} MiB pinned ({} weights), {:.1} MiB streamed per forward pass",
                mib(p.resident_bytes),
                p.pinned().count(),
                mib(p.streamed_bytes_per_pass)
            );
        }
    }
    if manifest.n_expert() > 0 {
        let f = manifest.expert_used_fraction();
        println!(
            "experts: {} per block, {} used per token; expert weights {:.1} MiB ({:.1} MiB pinned); \
             active {:.1} MiB per token; expected streamed {:.1} MiB per decoded token (uniform routing)",
            manifest.n_expert(),
            manifest.n_expert_used(),
            mib(p.expert_bytes),
            mib(p.pinned_expert_bytes),
            p.active_bytes_per_token(f) / (1 << 20) as f64,
            p.expected_streamed_bytes_per_token(f) / (1 << 20) as f64,
        );
    }
    println!("domain switches per token: {}", p.switches_per_pass);
    // A MoE decode step streams only the experts its routers pick (expected, uniform routing);
    // a prefill of many tokens may need every expert (the figure is the upper bound).
    let decode_bytes = if manifest.n_expert() > 0 {
        p.expected_streamed_bytes_per_token(manifest.expert_used_fraction()) as u64
    } else {
        p.streamed_bytes_per_pass
    };
    println!(
        "weights streamed: prefill {:.1} MiB per pass = {:.3} MiB/token at {} tokens; decode {:.1} MiB/token",
        mib(p.streamed_bytes_per_pass),
        mib(per_prefill_tok as u64),
        args.prefill_tokens,
        mib(decode_bytes)
    );
    if p.decode_bandwidth_bound() {
        println!("decode is BANDWIDTH-BOUND: every token copies {:.1} MiB of weights; raise the budget to {:.0} MiB to keep it resident",
            mib(decode_bytes), mib(p.model_bytes).ceil());
    } else {
        println!("decode keeps every weight resident");
    }
    Ok(ExitCode::SUCCESS)
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
    let mut base = engine_config(opts, false);
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

/// The bytes of every weight of `manifest` packed as `dtype` with per-channel scales (the
/// benches' model size).
pub(crate) fn packed_model_bytes(manifest: &Manifest, dtype: PackDtype) -> Result<u64> {
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

/// `ork bench stream`: prefill tok/s streamed (the given budget, default 25 % of the model) vs
/// fully resident vs streamed without prefetch, in the same run.
pub fn bench_stream(
    opts: &ModelOpts,
    tokens: usize,
    rounds: usize,
    plot: Option<&Path>,
    json: bool,
) -> Result<ExitCode> {
    let BenchSetup {
        full,
        streamed_budget,
        resident_budget,
        prompt,
        ..
    } = bench_setup(opts, tokens, json)?;

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
        let mut config = engine_config(opts, true);
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
        crate::plot::stream_svg(path, &results, trace_of_streamed.as_deref().unwrap_or(&[]))
            .with_context(|| format!("writing {}", path.display()))?;
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
        let mut config = engine_config(opts, false);
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

/// The weight manifest of the GGUF at `path`.
pub(crate) fn open_manifest(path: &Path) -> Result<Manifest> {
    let gguf = ork_gguf::GgufFile::open(path)?;
    Ok(Manifest::from_gguf(&gguf)?)
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
