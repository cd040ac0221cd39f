//! Verbs that run a model end to end: `run`, `perplexity`, `plan`, `bench stream`.
//!
//! The stack, top to bottom: the executor's [`Session`] asks a [`Linear`] for every matmul;
//! [`NpuLinear`] hands it to the residency layer's [`DeviceMatmul`], which leases the weight from
//! the budgeted [`WeightCache`] (filled from the `.orkpack`, or packed from the GGUF) and submits
//! the task to the [`Device`].

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ork_device::{Device, EmuConfig};
use ork_exec::{
    generate, ChatMessage, ChatTemplate, ExecError, GenerateOptions, Linear, Model, Sampler,
    SamplerOptions, Session, TextStream, Tokenizer,
};
use ork_gguf::GgufFile;
use ork_pack::PackDtype;
use ork_residency::{
    device_bytes, execution_order, plan::domain_map, CacheConfig, CacheStats, DeviceMatmul, Mode,
    Plan, PlanInput, Trace, WeightCache, WeightSource,
};
use ork_store::{ConvertOptions, ConvertReport};
use serde::Serialize;

use crate::cli::{DeviceArg, ModelOpts, PerplexityArgs, PlanArgs, RunArgs};

/// Default weight-cache budget per domain (MiB).
const DEFAULT_BUDGET_MB: u64 = 3072;

/// The executor's matmul interface served by the device through the weight cache.
struct NpuLinear(DeviceMatmul);

impl Linear for NpuLinear {
    fn matmul(&self, weight: &str, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.0
            .matmul(weight, x, m, y)
            .map_err(|e| ExecError::Backend {
                weight: weight.to_owned(),
                source: Box::new(e),
            })
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The budget in bytes per domain: `--budget-mb`, else `ORK_WCACHE_BUDGET_MB`, else 3072.
fn budget_bytes(flag: Option<u64>) -> Result<u64> {
    let mb = match flag {
        Some(mb) => mb,
        None => match std::env::var("ORK_WCACHE_BUDGET_MB") {
            Ok(v) => {
                crate::cli::parse_env_mib("ORK_WCACHE_BUDGET_MB", &v).map_err(anyhow::Error::msg)?
            }
            Err(_) => DEFAULT_BUDGET_MB,
        },
    };
    if !(1..=crate::cli::MAX_MIB).contains(&mb) {
        bail!("the weight budget must be 1..={} MiB", crate::cli::MAX_MIB);
    }
    Ok(mb << 20)
}

fn open_device(arg: DeviceArg, domains: u32) -> Result<Arc<dyn Device>> {
    let options = ork_device::OpenOptions::new().domains(domains.max(1));
    ork_device::open(arg.into(), &options).context("opening the device")
}

/// Everything a model run needs, built once.
struct Stack {
    plan: Plan,
    cache: Arc<WeightCache>,
    convert: Option<ConvertReport>,
    pack_path: Option<PathBuf>,
    cores: u32,
    activations: ork_device::ActPrecision,
}

fn pack_path(opts: &ModelOpts) -> Option<PathBuf> {
    if opts.no_pack {
        return None;
    }
    opts.pack
        .clone()
        .or_else(|| std::env::var_os("ORK_PERSIST").map(PathBuf::from))
        .or_else(|| Some(opts.model.with_extension("orkpack")))
}

fn plan_for(
    gguf: &GgufFile,
    dtype: PackDtype,
    budget: u64,
    window: u64,
    domains: u32,
    slots: usize,
) -> Result<Plan> {
    let mut weights = Vec::new();
    for name in execution_order(gguf) {
        let t = gguf.tensor(&name).expect("listed by the model");
        let (k, n) =
            ork_store::matmul_dims(t).with_context(|| format!("{}", gguf.path().display()))?;
        weights.push((name, device_bytes(&ork_pack::TiledLayout::new(dtype, k, n))));
    }
    Ok(ork_residency::plan(&PlanInput {
        weights,
        budget_bytes: budget,
        window_bytes: window,
        domains,
        slots,
    }))
}

fn open_gguf(path: &Path) -> Result<Arc<GgufFile>> {
    Ok(Arc::new(GgufFile::open(path)?))
}

/// Build the stack: device, .orkpack (self-populating), plan, cache with pins.
fn build_stack(gguf: &Arc<GgufFile>, opts: &ModelOpts, quiet: bool) -> Result<Stack> {
    let gguf = Arc::clone(gguf);
    if let Some(n) = opts.threads {
        // The first call wins; later stacks in the same process share the pool.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
    let device = open_device(opts.device, opts.domains)?;
    let info = device.info();
    let budget = budget_bytes(opts.budget_mb)?;
    let dtype = PackDtype::from(opts.dtype);
    let slots = info.cores as usize + 1;
    let plan = plan_for(&gguf, dtype, budget, info.window_bytes, info.domains, slots)?;
    if !plan.runnable {
        bail!(
            "{}: a weight budget of {} MiB cannot hold weight '{}' ({:.1} MiB); the minimum budget is {} MiB",
            opts.model.display(),
            budget >> 20,
            plan.largest.0,
            plan.largest.1 as f64 / (1 << 20) as f64,
            plan.min_budget_bytes.div_ceil(1 << 20)
        );
    }
    let pack_path = pack_path(opts);
    let (source, convert) = match &pack_path {
        Some(path) => {
            let mut copts = ConvertOptions::new(dtype);
            copts.verify = !opts.no_verify;
            copts.evict_src = env_flag("ORK_EVICT_SRC");
            copts.threads = opts.threads;
            // Shows only while tensors are (re)packed or checked, on a terminal.
            let bar = crate::progress::ConvertBar::new(&gguf, quiet)?;
            let progress = |p: &ork_store::Progress<'_>| bar.tensor_done(p);
            copts.progress = Some(&progress);
            let result = ork_store::ensure(&gguf, path, &copts);
            bar.finish();
            match result {
                Ok((pack, report)) => {
                    // Say why an existing file was rewritten (stale, corrupt, other dtype …).
                    if let Some(why) = report.rebuild.as_ref().filter(|_| report.rewritten) {
                        if *why != ork_store::RebuildReason::Missing {
                            eprintln!("[ork] rebuilt {}: {why}", path.display());
                        }
                    }
                    (
                        WeightSource::Pack {
                            pack,
                            model: Some(Arc::clone(&gguf)),
                            verify: !opts.no_verify,
                        },
                        Some(report),
                    )
                }
                // The pack cannot be written (read-only directory, full disk): run from memory.
                Err(e) if e.is_write_failure() => {
                    eprintln!(
                        "[ork] warning: cannot write the weight cache ({e}); running without it (as --no-pack)"
                    );
                    (
                        WeightSource::Gguf {
                            model: Arc::clone(&gguf),
                            dtype,
                        },
                        None,
                    )
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("preparing the weight cache {}", path.display())))
                }
            }
        }
        None => (
            WeightSource::Gguf {
                model: Arc::clone(&gguf),
                dtype,
            },
            None,
        ),
    };
    let config = CacheConfig {
        domains: info.domains,
        ..CacheConfig::new(budget)
    };
    let cache =
        WeightCache::new(Arc::clone(&device), source, config)?.with_placement(domain_map(&plan));
    for p in plan.pinned() {
        cache.pin(&p.name)?;
    }
    Ok(Stack {
        plan,
        cache: Arc::new(cache),
        convert,
        pack_path,
        cores: info.cores,
        activations: opts.activations.into(),
    })
}

impl Stack {
    /// The matmul backend, with or without a prefetch thread, optionally traced.
    fn linear(&self, prefetch: bool, trace: Option<&Arc<Trace>>) -> NpuLinear {
        let schedule = (prefetch && self.plan.mode == Mode::Streamed).then(|| {
            (
                self.plan
                    .placement
                    .iter()
                    .map(|p| p.name.clone())
                    .collect::<Vec<_>>(),
                self.cores as usize + 1,
            )
        });
        self.cache.set_trace(trace.cloned());
        let mut dm =
            DeviceMatmul::new(Arc::clone(&self.cache), schedule).with_activations(self.activations);
        if let Some(t) = trace {
            dm = dm.with_trace(Arc::clone(t));
        }
        NpuLinear(dm)
    }
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
    prefill_tokens: usize,
    prefill_tok_s: f64,
    decode_tokens: usize,
    decode_tok_s: f64,
    ttft_seconds: f64,
    total_seconds: f64,
}

impl RunStats {
    fn new(
        stack: &Stack,
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
        let at_convert = stack.convert.as_ref().map_or(0, |r| r.packed as u64);
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
            budget_bytes: stack.cache.budget(),
            mode: stack.plan.mode,
            activations: stack.activations.name(),
            prefill_tokens: prefill.0,
            prefill_tok_s: rate(prefill.0, prefill.1),
            decode_tokens: decode.0,
            decode_tok_s: rate(decode.0, decode.1),
            ttft_seconds: ttft.as_secs_f64(),
            total_seconds: total.as_secs_f64(),
        }
    }

    fn line(&self) -> String {
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
    let gguf = open_gguf(&args.model.model)?;
    let model = Model::load(&gguf).with_context(|| format!("{}", args.model.model.display()))?;
    let tokenizer =
        Tokenizer::from_gguf(&gguf).with_context(|| format!("{}", args.model.model.display()))?;
    let prompt = if args.chat {
        let template = ChatTemplate::from_gguf(&gguf, &tokenizer)?.with_context(|| {
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
    let context = model.config().context_length;
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
    if let Some(path) = &args.model.trace {
        // Find out now, not after the generation, whether the trace can be written.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("{}: cannot write the trace", path.display()))?;
    }
    let stack = build_stack(&gguf, &args.model, args.json)?;
    let trace = args.model.trace.as_ref().map(|_| Arc::new(Trace::new()));
    let linear = stack.linear(!args.model.no_prefetch, trace.as_ref());
    let mut session = Session::new(&model, &linear);
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
    let gen = generate(&mut session, &prompt, &options, &mut sampler, |tok| {
        ttft.get_or_insert_with(|| started.elapsed());
        let piece = stream.push(tok)?;
        if !args.json {
            let mut lock = stdout.lock();
            let _ = lock.write_all(piece.as_bytes());
            let _ = lock.flush();
        }
        out.push_str(&piece);
        Ok(())
    })
    .with_context(|| format!("running {}", args.model.model.display()))?;
    let tail = stream.finish();
    out.push_str(&tail);
    let ttft = ttft.unwrap_or_else(|| started.elapsed());
    let stats = RunStats::new(
        &stack,
        &stack.cache.stats(),
        (gen.prompt_tokens, gen.prefill_time),
        (gen.decode_steps, gen.decode_time),
        ttft,
        started.elapsed(),
    );
    if let (Some(path), Some(t)) = (&args.model.trace, &trace) {
        drop(linear);
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
        }
        let o = Out {
            text: &out,
            tokens: &gen.tokens,
            pack: stack.pack_path.as_ref().map(|p| p.display().to_string()),
            stats: &stats,
        };
        println!("{}", serde_json::to_string(&o)?);
    } else {
        print!("{tail}");
        println!();
        eprintln!("{}", stats.line());
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
    let gguf = open_gguf(&args.model.model)?;
    let model = Model::load(&gguf)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let stack = build_stack(&gguf, &args.model, args.json)?;
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
    let linear = stack.linear(!args.model.no_prefetch, None);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
    let t0 = Instant::now();
    let report = ork_exec::perplexity(&model, &linear, &tokens, args.ctx, bos)
        .with_context(|| format!("perplexity of {}", args.file.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let cache = stack.cache.stats();
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

/// `ork plan`.
pub fn plan(args: &PlanArgs) -> Result<ExitCode> {
    let gguf = open_gguf(&args.model)?;
    let budget = budget_bytes(args.budget_mb)?;
    let slots = EmuConfig::default().cores as usize + 1;
    let p = plan_for(
        &gguf,
        args.dtype.into(),
        budget,
        args.window_mb << 20,
        args.domains,
        slots,
    )?;
    let per_prefill_tok = p.streamed_bytes_per_prefill_token(args.prefill_tokens);
    if args.json {
        let mut v = serde_json::to_value(&p)?;
        v["budget_bytes"] = budget.into();
        v["prefill_tokens"] = args.prefill_tokens.into();
        v["streamed_bytes_per_prefill_token"] = per_prefill_tok.into();
        v["streamed_bytes_per_decode_token"] = p.streamed_bytes_per_pass.into();
        v["decode_bandwidth_bound"] = p.decode_bandwidth_bound().into();
        println!("{}", serde_json::to_string(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "model {}: {} matmul weights, {:.1} MiB packed ({}), largest '{}' {:.1} MiB",
        args.model.display(),
        p.placement.len(),
        mib(p.model_bytes),
        ork_pack::PackDtype::from(args.dtype).name(),
        p.largest.0,
        mib(p.largest.1)
    );
    println!(
        "budget {:.0} MiB per domain, window {} MiB, {} domain(s) available",
        mib(budget),
        args.window_mb,
        args.domains
    );
    if !p.runnable {
        println!(
            "NOT RUNNABLE: the budget must be at least {} MiB (the largest weight)",
            p.min_budget_bytes.div_ceil(1 << 20)
        );
        return Ok(ExitCode::SUCCESS);
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
    println!("domain switches per token: {}", p.switches_per_pass);
    println!(
        "weights streamed: prefill {:.1} MiB per pass = {:.3} MiB/token at {} tokens; decode {:.1} MiB/token",
        mib(p.streamed_bytes_per_pass),
        mib(per_prefill_tok as u64),
        args.prefill_tokens,
        mib(p.streamed_bytes_per_pass)
    );
    if p.decode_bandwidth_bound() {
        println!("decode is BANDWIDTH-BOUND: every token copies {:.1} MiB of weights; raise the budget to {:.0} MiB to keep it resident",
            mib(p.streamed_bytes_per_pass), mib(p.model_bytes).ceil());
    } else {
        println!("decode keeps every weight resident");
    }
    Ok(ExitCode::SUCCESS)
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
    let gguf = open_gguf(&opts.model)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let model = Model::load(&gguf)?;
    let prompt = bench_prompt(&tokenizer, tokens)?;
    let dtype = PackDtype::from(opts.dtype);
    let full = plan_for(&gguf, dtype, u64::MAX / 4, u64::MAX / 4, 1, 4)?.model_bytes;
    let streamed_budget = match opts.budget_mb {
        Some(mb) => mb << 20,
        None => (full / 4).max(plan_for(&gguf, dtype, 1, 1, 1, 4)?.min_budget_bytes + (8 << 20)),
    };
    let resident_budget = full + (64 << 20);
    // Make sure the .orkpack exists before timing anything.
    let mut base = opts.clone();
    base.budget_mb = Some(resident_budget >> 20);
    drop(build_stack(&gguf, &base, json)?);

    let configs = [
        ("resident", resident_budget, true),
        ("streamed", streamed_budget, true),
        ("streamed, no prefetch", streamed_budget, false),
    ];
    // One stack per configuration, then interleaved rounds (a noisy machine hits them alike);
    // each configuration's figure is the median of its rounds, after one warm-up pass each.
    let mut runs = Vec::new();
    for (label, budget, prefetch) in configs {
        let mut o = opts.clone();
        o.budget_mb = Some(budget.div_ceil(1 << 20));
        let stack = build_stack(&gguf, &o, true)?;
        let trace = Arc::new(Trace::new());
        let trace_t0 = Instant::now();
        let linear = stack.linear(prefetch, Some(&trace));
        let mut session = Session::with_context(&model, &linear, tokens + 1)?;
        session.prefill(&prompt)?;
        runs.push(StreamRun {
            label,
            budget,
            prefetch,
            stack,
            trace,
            trace_t0,
            linear,
            seconds: Vec::new(),
            last_start_us: 0.0,
        });
    }
    for _ in 0..rounds.max(1) {
        for run in runs.iter_mut() {
            let mut session = Session::with_context(&model, &run.linear, tokens + 1)?;
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
            stack,
            trace,
            seconds: secs,
            last_start_us: last_start,
            ..
        } = run;
        let mut sorted = secs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let stats = stack.cache.stats();
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
    if let Some(path) = plot {
        crate::plot::stream_svg(path, &results, trace_of_streamed.as_deref().unwrap_or(&[]))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": full,
                "results": results, "streamed_over_resident": ratio,
                "no_prefetch_over_resident": ratio_off})
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
    }
    Ok(ExitCode::SUCCESS)
}

/// One configuration of `ork bench stream` and its timed rounds.
struct StreamRun {
    label: &'static str,
    budget: u64,
    prefetch: bool,
    stack: Stack,
    trace: Arc<Trace>,
    trace_t0: Instant,
    linear: NpuLinear,
    seconds: Vec<f64>,
    last_start_us: f64,
}

/// `tokens` tokens of varied English text (repeated as needed), BOS first if the model adds one.
fn bench_prompt(tokenizer: &Tokenizer, tokens: usize) -> Result<Vec<u32>> {
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
