//! Verbs that run a model end to end: `run`, `perplexity`, `plan` (`bench stream` is in
//! `cmd_bench_stream.rs`). Argument parsing and output only: the model runs through
//! [`ork_runtime::Engine`].

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ork_exec::{generate, ChatMessage, GenerateOptions, Sampler, SamplerOptions, TextStream};
use ork_residency::{CacheStats, Mode};
use ork_runtime::{budget_bytes, Engine, EngineConfig};
use serde::Serialize;

use crate::cli::{PerplexityArgs, PlanArgs, RunArgs};
use crate::open_model::{engine_config, open_engine, open_loaded};

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
    /// Resident or streamed; `null` for the CPU engine (no weight cache).
    mode: Option<Mode>,
    /// What computed the matmuls: the device's name, or `cpu`.
    device: String,
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
    /// The process's memory at the end of the run (`/proc/self/status`): anonymous memory
    /// (KV cache, activations, tables, and any weights copied) apart from file pages (the
    /// GGUF's map).
    rss_anon_bytes: u64,
    rss_file_bytes: u64,
    /// The CPU engine on a MoE model: expert matmuls, router skew, readahead and pinning
    /// (`ork_cpu::ExpertReadStats`), with the speculative prediction's count and recall.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_experts: Option<CpuExperts>,
    /// The CPU engine only: the cores its workers run on.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<String>,
    /// The engine of each phase (`--prefill-device`, `--decode-device`).
    engines: ork_runtime::PhaseEngines,
    /// Where the device's packed weights came from and why (`null` for the CPU engine alone).
    npu_weights: Option<ork_runtime::NpuWeightSource>,
    /// Which weights the device holds, and how many its plan places (`null` for the CPU
    /// engine alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_weights: Option<(ork_runtime::DeviceWeights, usize)>,
}

/// The CPU engine's expert figures on a MoE model (see [`RunStats::cpu_experts`]).
#[derive(Serialize)]
struct CpuExperts {
    #[serde(flatten)]
    reads: ork_cpu::ExpertReadStats,
    /// Experts predicted ahead for the next block (speculative readahead).
    predictions: u64,
    /// Predicted ∩ used / used over the decode steps that had a prediction.
    recall: Option<f64>,
}

impl CpuExperts {
    fn of(engine: &Engine, linear: &ork_cpu::GgufLinear) -> Option<CpuExperts> {
        let moe = engine.model().moe_stats()?;
        Some(CpuExperts {
            reads: linear.expert_stats(),
            predictions: moe.predictions,
            recall: moe.recall(),
        })
    }

    fn line(&self) -> String {
        let r = &self.reads;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        let mut line = format!(
            "\n[ork] experts: {} matmuls | router skew {} | recall {} ({} predicted) | \
             readahead {} ({:.1} MiB, {} hints dropped) | pinned {:.1} of {:.1} MiB, {} matmuls on pinned",
            r.expert_matmuls,
            opt(r.router_skew),
            opt(self.recall),
            self.predictions,
            if r.readahead { "on" } else { "off" },
            mib(r.readahead_bytes),
            r.readahead_dropped,
            mib(r.pinned_bytes),
            mib(r.pin_budget_bytes),
            r.pinned_matmuls,
        );
        if let Some(e) = &r.pin_error {
            line.push_str(&format!("\n[ork] warning: hot experts not pinned: {e}"));
        }
        line
    }
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
        let mem = crate::rss::snapshot();
        // The CPU engine alone: its activations and weight types are the run's.
        let cpu = engine.cpu_linear().filter(|_| engine.device().is_none());
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
            budget_bytes: engine.cache().map_or(0, |c| c.budget()),
            mode: engine.plan().map(|p| p.mode),
            device: engine.compute_name(),
            activations: match cpu {
                Some(_) => "q8 (per weight type, as ggml's CPU backend)",
                None => engine.activations().name(),
            },
            soc: engine.config().soc.name(),
            matmul_type: match cpu {
                Some(l) => l
                    .type_counts()
                    .iter()
                    .map(|t| t.ty.name())
                    .collect::<Vec<_>>()
                    .join(","),
                None => format!(
                    "{}x{}",
                    ork_device::ElemType::of_activations(engine.activations()).name(),
                    ork_device::ElemType::of_weight(engine.config().dtype).name()
                ),
            },
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
            rss_anon_bytes: mem.rss_anon_bytes,
            rss_file_bytes: mem.rss_file_bytes,
            cpus: engine
                .cpu_linear()
                .map(|l| ork_cpu::topology::format_cpu_list(&l.pool().choice().cores)),
            cpu_experts: engine.cpu_linear().and_then(|l| CpuExperts::of(engine, l)),
            engines: engine.engines(),
            npu_weights: engine.npu_weight_source().cloned(),
            device_weights: engine
                .plan()
                .map(|p| (engine.config().device_weights, p.placement.len())),
        }
    }

    fn line(&self) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let Some(mode) = self.mode else {
            // The CPU engine: no cache, nothing streamed.
            return format!(
                "[ork] cpu: {} threads on cpus {} | weights {} read in place | \
                 prefill {} tok {:.1} tok/s | decode {} tok {:.1} tok/s | ttft {:.3} s | \
                 KV {:.1} MiB | RssAnon {:.1} MiB RssFile {:.1} MiB",
                self.threads,
                self.cpus.as_deref().unwrap_or("?"),
                self.matmul_type,
                self.prefill_tokens,
                self.prefill_tok_s,
                self.decode_tokens,
                self.decode_tok_s,
                self.ttft_seconds,
                mib(self.kv_cache_bytes as u64),
                mib(self.rss_anon_bytes),
                mib(self.rss_file_bytes),
            ) + &self
                .cpu_experts
                .as_ref()
                .map(CpuExperts::line)
                .unwrap_or_default();
        };
        let mut line = self.base_line(mode);
        if self.engines.per_phase() {
            line.push_str(&format!(" | {}", self.device));
        }
        if let Some(s) = &self.speculative {
            line.push_str(&s.line());
        }
        line.push_str(&format!(
            " | {:.1} MiB streamed/token",
            self.streamed_bytes_per_token / (1 << 20) as f64
        ));
        // A phase on the CPU engine (a mixed pairing, a split): its experts' reads and pins.
        if let Some(e) = &self.cpu_experts {
            line.push_str(&e.line());
        }
        line
    }

    fn base_line(&self, mode: Mode) -> String {
        format!(
            "[ork] loaded {} | packed {} | evictions {} | wall hits {} | peak resident {:.1} MiB (budget {:.0} MiB, {}) | \
             prefill {} tok {:.1} tok/s | decode {} tok {:.1} tok/s | ttft {:.3} s",
            self.loaded,
            self.packed,
            self.evictions,
            self.wall_hits,
            self.peak_resident_bytes as f64 / (1 << 20) as f64,
            self.budget_bytes as f64 / (1 << 20) as f64,
            match mode {
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
        (None, Some(f)) => crate::input::read_text(f, "--prompt-file"),
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
    // The files this command reads, which no output of it may replace (docs/cli.md).
    let inputs: Vec<&std::path::Path> = std::iter::once(args.model.model.as_path())
        .chain(args.model.pack.as_deref())
        .collect();
    if let Some(path) = &args.model.trace {
        // Find out now, not after the generation, whether the trace can be written.
        ork_io::output::check_output(path, &inputs)
            .with_context(|| "--trace: cannot write the trace".to_owned())?;
    }
    // The prompt is checked against the context before the device is opened or the .orkpack
    // converted (minutes on a large model).
    let spec_options = crate::cmd_spec::options(&args.speculative)?;
    let (prefill_device, decode_device) = crate::open_model::phase_devices(&args.model);
    // A split's device work is half of its decode: the clock replays no split (`--project`
    // gives its shares instead).
    let any_cpu = [prefill_device, decode_device].contains(&crate::cli::DeviceArg::Cpu)
        && ![prefill_device, decode_device].contains(&crate::cli::DeviceArg::Split);
    if args.project.project.is_some() && any_cpu {
        bail!(
            "--project replays the run's device work on a board's NPU; a phase on --device cpu has none (docs/cpu.md; `ork plan --project BOARD` projects every pairing)"
        );
    }
    let (mut config, chosen) = crate::open_model::engine_config_auto(
        &args.model,
        args.model.trace.is_some(),
        args.project.project.is_some(),
    )?;
    config.draft = args
        .speculative
        .draft
        .as_ref()
        .and_then(ork_runtime::DraftKind::engine_source);
    let soc = ork_device::Soc::from(args.model.soc).to_string();
    let project = args.project.project.as_deref();
    let split = crate::cmd_split::resolve_for(&mut config, &args.model, project, &chosen)?;
    // The clock replays one device's work: not a split's (see `cmd_split`).
    let project = project.filter(|_| split.is_none());
    let board = crate::cmd_project::board(project, &soc)?;
    let loaded = Engine::load(config)?;
    let prompt = encode_prompt(args, &loaded, &text)?;
    let engine = open_loaded(loaded, args.json)?;
    if !args.json {
        crate::auto::say(&chosen, &engine);
        crate::open_model::say_engines(&engine);
        for l in split.lines() {
            eprintln!("[ork] {l}");
        }
    }
    let recorder = crate::cmd_project::record(&engine, &board);
    let mut session = engine.session();
    let moved_before = ork_runtime::bytes_moved(&engine);
    let g = generate_text(args, &engine, &mut session, &prompt, spec_options, started)?;
    let moved = ork_runtime::bytes_moved(&engine) - moved_before;
    let gen = &g.generation;
    let mut stats = RunStats::new(
        &engine,
        &engine.cache_stats(),
        (gen.prompt_tokens, gen.prefill_time),
        (gen.decode_steps, gen.decode_time),
        g.ttft,
        started.elapsed(),
    );
    stats.streamed_bytes_per_token = moved as f64 / gen.tokens.len().max(1) as f64;
    stats.kv_cache_bytes = session.kv_bytes();
    stats.speculative = g.spec;
    let projected = crate::cmd_project::project_run(
        &engine,
        board.as_ref(),
        recorder.as_ref(),
        gen.prompt_tokens,
        // Tokens the passes produced: a stop token ends the text but took its decode pass.
        gen.tokens.len().max(gen.decode_steps + 1),
    )?;
    let pack = engine.pack_path().map(|p| p.display().to_string());
    let (prefill_split, split) = crate::cmd_split::report(&engine, split);
    drop(session);
    if let (Some(path), Some(t)) = (&args.model.trace, engine.close()) {
        t.write(path, &inputs)
            .with_context(|| format!("writing the trace {}", path.display()))?;
    }
    let out = RunOut {
        text: &g.text,
        tokens: &gen.tokens,
        pack,
        stats: &stats,
        projected,
        engines_chosen_by: &chosen.by,
        cpu_cores: chosen.cores_by.as_deref(),
        decode_split: split,
        prefill_split,
    };
    print_run(&out, args.json, &g.tail)?;
    Ok(ExitCode::SUCCESS)
}

/// What `ork run` reports: `--json`'s object, and the text run's lines.
#[derive(Serialize)]
struct RunOut<'a> {
    text: &'a str,
    tokens: &'a [u32],
    pack: Option<String>,
    #[serde(flatten)]
    stats: &'a RunStats,
    #[serde(skip_serializing_if = "Option::is_none")]
    projected: Option<ork_board::Projection>,
    engines_chosen_by: &'a str,
    /// The CPU's cores as `--device auto` chose them (`null`: not chosen by a projection).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_cores: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_split: Option<crate::cmd_split::SplitReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill_split: Option<crate::cmd_split::SplitReport>,
}

/// Print `out`: one JSON object, or the text's unprinted `tail` on stdout and the figures on
/// stderr.
fn print_run(out: &RunOut<'_>, json: bool, tail: &str) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(out)?);
        return Ok(());
    }
    print!("{tail}");
    println!();
    eprintln!("{}", out.stats.line());
    if let Some(p) = &out.projected {
        eprintln!("{}", p.line());
    }
    for r in [&out.prefill_split, &out.decode_split]
        .into_iter()
        .flatten()
    {
        eprintln!("{}", r.line());
    }
    Ok(())
}

/// The prompt's tokens (through the chat template with `--chat`), checked against the model's
/// context with the tokens `-n` asks for.
fn encode_prompt(
    args: &RunArgs,
    loaded: &ork_runtime::LoadedModel,
    text: &str,
) -> Result<Vec<u32>> {
    let tokenizer = loaded.tokenizer();
    let prompt = if args.chat {
        let template = loaded.chat_template()?.with_context(|| {
            format!(
                "{}: --chat, but the model has no chat template",
                args.model.model.display()
            )
        })?;
        let rendered = template.render(&[ChatMessage::new("user", text)], true)?;
        tokenizer.encode(&rendered, false, true)?
    } else {
        tokenizer.encode(text, true, false)?
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
    Ok(prompt)
}

/// What `ork run` generated.
struct RunText {
    generation: ork_exec::Generation,
    spec: Option<crate::cmd_spec::SpecReport>,
    /// The whole text.
    text: String,
    /// The text the stream held back until the end (printed last).
    tail: String,
    /// Time to the first token since the command started.
    ttft: Duration,
}

/// Generate from `prompt` (speculatively with `--draft`), streaming the text to stdout unless
/// `--json`.
fn generate_text(
    args: &RunArgs,
    engine: &Engine,
    session: &mut ork_exec::Session,
    prompt: &[u32],
    spec_options: Option<ork_exec::SpeculativeOptions>,
    started: Instant,
) -> Result<RunText> {
    let tokenizer = engine.tokenizer();
    let mut sampler = Sampler::new(SamplerOptions {
        temperature: args.temp,
        seed: args.seed,
        ..SamplerOptions::default()
    })?;
    let options = GenerateOptions {
        max_tokens: args.n_predict,
        stop_tokens: tokenizer.end_of_generation().to_vec(),
    };
    let mut stream = TextStream::new(tokenizer, false);
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
    let (generation, spec) = match (&args.speculative.draft, spec_options) {
        (Some(kind), Some(spec_options)) => {
            let mut draft = crate::cmd_spec::make_draft(
                engine,
                kind,
                args.temp,
                args.seed,
                args.speculative.draft_p_min,
            )?;
            let g = ork_exec::generate_speculative(
                session,
                draft.as_mut(),
                prompt,
                &options,
                &spec_options,
                &mut sampler,
                &mut ork_exec::StandardAcceptance,
                &mut on_token,
            )
            .with_context(|| format!("running {}", args.model.model.display()))?;
            let report = crate::cmd_spec::SpecReport::new(engine, kind, &spec_options, &g);
            (g.generation, Some(report))
        }
        _ => (
            generate(session, prompt, &options, &mut sampler, &mut on_token)
                .with_context(|| format!("running {}", args.model.model.display()))?,
            None,
        ),
    };
    let tail = stream.finish();
    out.push_str(&tail);
    Ok(RunText {
        generation,
        spec,
        text: out,
        tail,
        ttft: ttft.unwrap_or_else(|| started.elapsed()),
    })
}

/// `ork perplexity`.
pub fn perplexity(args: &PerplexityArgs) -> Result<ExitCode> {
    // Perplexity runs prefill passes only: the prefill's engine computes everything.
    if args.model.decode_device.is_some() {
        bail!("perplexity runs no decode step: --decode-device does not apply (--prefill-device or --device choose its engine)");
    }
    let text = crate::input::read_text(&args.file, "--file")?;
    let mut opts = args.model.clone();
    let prefill = crate::open_model::phase_devices(&opts).0;
    opts.device = prefill;
    opts.prefill_device = None;
    let split_board = opts.board.take();
    if prefill == crate::cli::DeviceArg::Split {
        // The prefill splits with `auto`'s device; no decode step runs on it.
        opts.device = crate::cli::DeviceArg::Auto;
        opts.prefill_device = Some(prefill);
    } else if split_board.is_some() {
        bail!(
            "--board gives perplexity's --prefill-device split its shares; this run does not \
             split: name its engine with --device"
        );
    }
    let mut config = engine_config(&opts, false)?;
    opts.board = split_board;
    let split = crate::cmd_split::resolve_for(
        &mut config,
        &opts,
        None,
        &crate::auto::Chosen::given((prefill, prefill)),
    )?;
    let engine = open_engine(config, args.json)?;
    if !args.json {
        for l in split.lines() {
            eprintln!("[ork] {l}");
        }
    }
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

/// `ork plan --device cpu`: what the CPU engine would run with. The engine is opened (every
/// weight checked against its kernel, the workers started) but runs nothing.
fn plan_cpu(args: &PlanArgs) -> Result<ExitCode> {
    let mut config = EngineConfig::new(&args.model);
    config.cpu = Some(ork_cpu::CpuOptions {
        threads: args.threads,
        cpus: args.cpus.clone().map(|c| c.0),
        ..ork_cpu::CpuOptions::default()
    });
    let engine = Engine::open(config)?;
    let linear = engine.cpu_linear().context("the CPU engine did not open")?;
    let pool = linear.pool();
    let choice = pool.choice();
    let model = engine.model().config();
    let ctx = args.ctx.unwrap_or(model.context_length);
    let kv_type = engine.config().kv_cache;
    // Keys and values of every layer at every position: the most the cache holds (a
    // sliding-window layer holds less).
    let kv_bytes = (model.n_layer * (model.k_dim() + model.v_dim()))
        .saturating_mul(ctx)
        .saturating_mul(kv_type.bytes());
    let cpus = ork_cpu::topology::format_cpu_list(&choice.cores);
    let types = linear.type_counts();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if args.json {
        let v = serde_json::json!({
            "device": "cpu",
            "mapped_bytes": linear.mapped_bytes(),
            "types": types.iter().map(|t| serde_json::json!({
                "type": t.ty.name(), "weights": t.weights, "bytes": t.bytes,
            })).collect::<Vec<_>>(),
            "threads": pool.threads(),
            "cpus": cpus,
            "cores_from": choice.source.to_string(),
            "pinned": pool.pinned(),
            "ctx": ctx,
            "kv_cache": format!("{kv_type:?}").to_lowercase(),
            "kv_bytes": kv_bytes,
        });
        println!("{}", serde_json::to_string(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "model {}: CPU engine, {:.1} MiB of weights read in place from the file's map (no copy, no pack)",
        args.model.display(),
        mib(linear.mapped_bytes())
    );
    for t in &types {
        println!(
            "  {:<6} {:>5} weights {:>9.1} MiB",
            t.ty.name(),
            t.weights,
            mib(t.bytes)
        );
    }
    println!(
        "threads: {} on cpus {cpus} ({}{})",
        pool.threads(),
        choice.source,
        if pool.pinned() {
            ", pinned"
        } else {
            ", not pinned: the affinity call failed"
        }
    );
    println!(
        "KV cache: {:.1} MiB at most at a context of {ctx} ({kv_type:?}), in anonymous memory",
        mib(kv_bytes as u64)
    );
    Ok(ExitCode::SUCCESS)
}

/// `ork plan`'s engine of each phase: `--prefill-device` and `--decode-device`, each
/// defaulting to `--device` (itself `auto`).
fn plan_devices(args: &PlanArgs) -> (crate::cli::DeviceArg, crate::cli::DeviceArg) {
    let device = args.device.unwrap_or(crate::cli::DeviceArg::Auto);
    (
        args.prefill_device.unwrap_or(device),
        args.decode_device.unwrap_or(device),
    )
}

/// The board `ork plan` projects on and `--device auto` chooses for: `--project`'s (without a
/// value, the `--soc` chip), `--board`'s, else this board where an rknpu driver is found.
fn plan_board(args: &PlanArgs, soc: &str) -> Result<Option<crate::auto::AutoBoard>> {
    match args.project.project.as_deref() {
        Some(name) => {
            let name = if name.is_empty() { soc } else { name };
            crate::auto::AutoBoard::named("--project", name).map(Some)
        }
        None => crate::auto::AutoBoard::resolve(args.board.as_deref(), args.soc.into()),
    }
}

/// `ork plan`.
pub fn plan(args: &PlanArgs) -> Result<ExitCode> {
    let (device, phases) = crate::open_model::phase_plan(
        plan_devices(args),
        args.device.unwrap_or(crate::cli::DeviceArg::Auto),
    )?;
    if device.is_none() {
        return plan_cpu(args);
    }
    if args.threads.is_some() || args.cpus.is_some() || args.ctx.is_some() {
        bail!("--threads, --cpus and --ctx plan the CPU engine: they need --device cpu");
    }
    let soc = ork_device::Soc::from(args.soc).to_string();
    let auto_board = plan_board(args, &soc)?;
    let budget = budget_bytes(args.budget_mb.map(|mb| mb << 20))?;
    let mut config = EngineConfig::new(&args.model);
    config.soc = args.soc.into();
    config.dtype = args.dtype.into();
    if let Some(q) = args.quant {
        config.set_quant(q);
    }
    config.phases = phases;
    config.cpu = phases.map(|_| ork_cpu::CpuOptions::default());
    let boards = crate::cmd_split::ShareBoards {
        project: args.project.project.as_deref(),
        board: args.board.as_deref(),
        soc: args.soc.into(),
    };
    // A split the command line names: its shares now (the load checks them); one `--device
    // auto` chooses: after the choice.
    let none = crate::cmd_split::Splits::default();
    let mut split = crate::cmd_split::resolve(&mut config, args.split_rows, &boards, &none)?;
    // The validation `run` and `convert` make (model, tokenizer, manifest, every chip rule for
    // every weight): a plan never says yes to a model they refuse.
    let loaded = ork_runtime::Engine::load(config.clone())?;
    let manifest = loaded.manifest();
    let chip = chip_plan(&config, manifest)?;
    let window = args.window_mb << 20;
    let (board, cpu_board) = auto_board
        .as_ref()
        .map_or((None, None), |b| (b.npu.as_ref(), b.cpu.as_ref()));
    let (
        crate::auto::Projected {
            placement: p,
            dense,
            npu: projected,
            engines,
        },
        chosen,
    ) = crate::auto::plan_on_board(
        args,
        (auto_board.as_ref(), plan_devices(args)),
        manifest,
        &mut config,
        (budget, window),
    )?;
    if split.is_none() {
        // `--device auto` chose the split: its shares.
        split = crate::cmd_split::resolve(&mut config, args.split_rows, &boards, &chosen.splits)?;
    }
    let ram = board.map(|b| b.ram_bytes as u64);
    // A dense-only split's device holds the dense weights alone.
    let device_bytes = dense
        .as_ref()
        .filter(|_| config.device_weights == ork_runtime::DeviceWeights::Dense)
        .map_or(p.model_bytes, |d| d.model_bytes);
    let view = PlanView {
        args,
        manifest,
        chip: &chip,
        domains: args.domains.unwrap_or(p.domains_used.max(1)),
        weight_source: crate::open_model::plan_weight_source(&config, device_bytes, ram),
        per_prefill_tok: p.streamed_bytes_per_prefill_token(args.prefill_tokens),
        config: &config,
        p: &p,
        budget,
        window,
        projected: projected.as_ref(),
        chosen: &chosen,
        split: &split,
        engines: engines.as_ref(),
        cpu_board,
    };
    if args.json {
        print_plan_json(&view)?;
    } else {
        print_plan_text(&view);
    }
    Ok(if view.p.runnable {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Everything `ork plan` (device path) prints.
struct PlanView<'a> {
    args: &'a PlanArgs,
    config: &'a EngineConfig,
    manifest: &'a ork_manifest::Manifest,
    chip: &'a ChipPlan,
    p: &'a ork_residency::Plan,
    budget: u64,
    window: u64,
    /// Domains available to the placement.
    domains: u32,
    projected: Option<&'a ork_board::Projection>,
    engines: Option<&'a crate::cmd_engines::PlanEngines>,
    cpu_board: Option<&'a ork_board::cpu::CpuBoard>,
    weight_source: ork_runtime::NpuWeightSource,
    per_prefill_tok: f64,
    /// What chose the engines (`--device auto`'s projection, the command line, …).
    chosen: &'a crate::auto::Chosen,
    /// The row splits, when asked for.
    split: &'a crate::cmd_split::Splits,
}

/// `ork plan --json`: the placement with the plan's figures beside it.
fn print_plan_json(view: &PlanView<'_>) -> Result<()> {
    let (p, manifest) = (view.p, view.manifest);
    let mut v = serde_json::to_value(p)?;
    v["engines"] = serde_json::to_value(view.config.engines())?;
    v["engines_chosen_by"] = view.chosen.by.clone().into();
    v["device_weights"] = serde_json::to_value(view.config.device_weights)?;
    v["cpu_cores"] = view.chosen.cores_by.clone().into();
    v["npu_weights"] = serde_json::to_value(&view.weight_source)?;
    v["decode_split"] = serde_json::to_value(&view.split.decode)?;
    v["prefill_split"] = serde_json::to_value(&view.split.prefill)?;
    v["budget_bytes"] = view.budget.into();
    v["prefill_tokens"] = view.args.prefill_tokens.into();
    v["streamed_bytes_per_prefill_token"] = view.per_prefill_tok.into();
    v["streamed_bytes_per_decode_token"] = p.streamed_bytes_per_pass.into();
    v["decode_bandwidth_bound"] = p.decode_bandwidth_bound().into();
    if manifest.n_expert() > 0 {
        let f = manifest.expert_used_fraction();
        v["experts"] = manifest.n_expert().into();
        v["experts_used"] = manifest.n_expert_used().into();
        v["active_bytes_per_token"] = p.active_bytes_per_token(f).into();
        v["expected_streamed_bytes_per_token"] = p.expected_streamed_bytes_per_token(f).into();
    }
    v["chip"] = serde_json::to_value(view.chip)?;
    if let Some(pr) = view.projected {
        v["projected"] = serde_json::to_value(pr)?;
    }
    if let (Some(e), Some(cb)) = (view.engines, view.cpu_board) {
        crate::cmd_engines::add_json(&mut v["projected"], e, cb);
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// `ork plan`'s text: the model and chip, the limits, then the placement when it is runnable.
fn print_plan_text(view: &PlanView<'_>) {
    let (args, p, chip) = (view.args, view.p, view.chip);
    println!(
        "model {}: {} matmul weights, {:.1} MiB packed ({}), largest '{}' {:.1} MiB",
        args.model.display(),
        p.placement.len(),
        mib(p.model_bytes),
        view.config.dtype.name(),
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
        mib(view.budget),
        args.window_mb,
        view.domains
    );
    if let Some(pr) = view.projected {
        println!("{}", pr.line());
    }
    if let Some(e) = view.engines {
        println!("{}", crate::cmd_engines::line(&e.choice));
    }
    println!("{}", view.chosen.line());
    println!(
        "{}",
        crate::open_model::weight_source_line(view.config, &view.weight_source)
    );
    for l in view.split.lines() {
        println!("{l}");
    }
    if !p.runnable {
        print_not_runnable(view);
        return;
    }
    print_placement(p);
    print_traffic(view);
}

/// Name the limit that is short: the budget, the window, or both.
fn print_not_runnable(view: &PlanView<'_>) {
    let p = view.p;
    let need = p.min_budget_bytes;
    let mut short = Vec::new();
    if view.budget < need {
        short.push(format!("the budget ({:.0} MiB)", mib(view.budget)));
    }
    if view.window < need {
        short.push(format!("the window ({} MiB)", view.args.window_mb));
    }
    println!(
        "NOT RUNNABLE: {} must hold the largest weight, '{}' ({} MiB)",
        short.join(" and "),
        p.largest.0,
        need.div_ceil(1 << 20)
    );
}

/// Resident: the weights of each domain; streamed: what is pinned and what streams.
fn print_placement(p: &ork_residency::Plan) {
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
}

/// The experts, domain switches and weight bytes streamed per token.
fn print_traffic(view: &PlanView<'_>) {
    let (p, manifest) = (view.p, view.manifest);
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
        mib(view.per_prefill_tok as u64),
        view.args.prefill_tokens,
        mib(decode_bytes)
    );
    if p.decode_bandwidth_bound() {
        println!("decode is BANDWIDTH-BOUND: every token copies {:.1} MiB of weights; raise the budget to {:.0} MiB to keep it resident",
            mib(decode_bytes), mib(p.model_bytes).ceil());
    } else {
        println!("decode keeps every weight resident");
    }
}
