//! Speculative decoding in the CLI: the draft of `ork run --draft …`, its report, and
//! `ork bench spec` (`docs/speculative.md`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use ork_exec::{
    generate, generate_speculative, Draft, GenerateOptions, LookupDraft, ModelDraft, Sampler,
    SamplerOptions, SpeculativeGeneration, SpeculativeOptions, StandardAcceptance,
};
use ork_pack::PackDtype;
use ork_runtime::{plan_weights, Engine};
use serde::Serialize;

use crate::cli::{DraftArg, ModelOpts, SpecArgs};
use crate::cmd_model::{engine_config, open_engine, open_manifest};

/// The speculative options `args` ask for (`None` without `--draft`), checked before anything is
/// opened.
pub fn options(args: &SpecArgs) -> Result<Option<SpeculativeOptions>> {
    if args.draft.is_none() {
        return Ok(None);
    }
    let o = SpeculativeOptions {
        draft_max: args.draft_max,
        adaptive: !args.draft_fixed,
    };
    o.check()?;
    Ok(Some(o))
}

/// Seed of a draft model's own random stream, derived from the run's.
fn draft_seed(seed: u64) -> u64 {
    seed ^ 0x9e37_79b9_7f4a_7c15
}

/// The draft `kind` over `engine` (whose config must have asked for its device part).
pub fn make_draft(
    engine: &Engine,
    kind: &DraftArg,
    temperature: f32,
    seed: u64,
    p_min: f32,
) -> Result<Box<dyn Draft>> {
    Ok(match kind {
        DraftArg::Lookup => Box::new(LookupDraft::default()),
        DraftArg::SelfLayers(_) | DraftArg::Model(_) => {
            let d = engine
                .draft()
                .context("the engine was opened without the draft")?;
            let sampler = Sampler::new(SamplerOptions {
                temperature,
                seed: draft_seed(seed),
                ..SamplerOptions::default()
            })?;
            Box::new(ModelDraft::new(d.session(), sampler, p_min))
        }
    })
}

/// Weight bytes copied into device buffers so far by the engine's caches (the model's and a draft
/// model's).
pub fn bytes_moved(engine: &Engine) -> u64 {
    engine.cache_stats().bytes_moved
        + engine
            .draft()
            .and_then(|d| d.cache())
            .map_or(0, |c| c.stats().bytes_moved)
}

/// Speculative decoding's figures in `ork run`'s stats line and `--json`.
#[derive(Serialize)]
pub struct SpecReport {
    draft: String,
    /// Device bytes the draft keeps resident (out of the budget).
    draft_bytes: u64,
    draft_max: usize,
    drafted: usize,
    accepted: usize,
    acceptance_rate: f64,
    verifier_passes: usize,
    tokens_per_pass: f64,
}

impl SpecReport {
    /// The report of `g`, drafted by `kind` on `engine`.
    pub fn new(
        engine: &Engine,
        kind: &DraftArg,
        options: &SpeculativeOptions,
        g: &SpeculativeGeneration,
    ) -> SpecReport {
        SpecReport {
            draft: engine
                .draft()
                .map_or_else(|| kind.label(), |d| d.label().to_owned()),
            draft_bytes: engine.draft().map_or(0, |d| d.bytes()),
            draft_max: options.draft_max,
            drafted: g.stats.drafted,
            accepted: g.stats.accepted,
            acceptance_rate: g.stats.acceptance_rate(),
            verifier_passes: g.stats.passes,
            tokens_per_pass: g.tokens_per_pass(),
        }
    }

    /// The stats line's part.
    pub fn line(&self) -> String {
        format!(
            " | draft {} (max {}): drafted {} accepted {} ({:.0} %) | {} verifier passes, {:.2} tok/pass",
            self.draft,
            self.draft_max,
            self.drafted,
            self.accepted,
            self.acceptance_rate * 100.0,
            self.verifier_passes,
            self.tokens_per_pass
        )
    }
}

/// `ork bench spec` settings.
pub struct SpecBench {
    pub tokens: usize,
    pub rounds: usize,
    pub draft_max: usize,
    pub draft_model: Option<PathBuf>,
    pub budgets_mb: Vec<u64>,
}

/// The bench's prompts: prose, and code (which repeats itself, as code does).
const PROMPTS: [&str; 2] = [
    "The history of computing is a story of machines that outgrew their memory. Engineers \
     learned to page data in and out, to overlap transfers with computation, and to keep the \
     most useful pieces close at hand.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n\
     def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n",
];

/// One configuration: a budget and a draft kind, on an engine of its own.
struct Config {
    /// The budget of the configuration's row (the plain run it is compared with has it too).
    requested: u64,
    /// The budget opened with (a draft model's bytes on top of `requested` when they do not fit).
    budget: u64,
    draft_bytes: u64,
    resident: bool,
    kind: Option<DraftArg>,
    engine: Option<Engine>,
    refused: Option<String>,
    seconds: Vec<f64>,
    tokens: Vec<Vec<u32>>,
    drafted: usize,
    accepted: usize,
    passes: usize,
    generated: usize,
    moved: u64,
}

/// One greedy generation of `n` tokens; (tokens, seconds after the prefill, the speculative
/// counters if any).
fn generate_once(
    engine: &Engine,
    kind: Option<&DraftArg>,
    prompt: &[u32],
    n: usize,
    draft_max: usize,
) -> Result<(Vec<u32>, f64, Option<ork_exec::SpeculativeStats>)> {
    let options = GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
    };
    let mut session = engine.session();
    let t0 = Instant::now();
    Ok(match kind {
        None => {
            let g = generate(
                &mut session,
                prompt,
                &options,
                &mut Sampler::greedy(),
                |_| Ok(()),
            )?;
            let secs = t0.elapsed().as_secs_f64() - g.prefill_time.as_secs_f64();
            (g.tokens, secs, None)
        }
        Some(kind) => {
            let mut draft = make_draft(engine, kind, 0.0, 0, 0.0)?;
            let g = generate_speculative(
                &mut session,
                draft.as_mut(),
                prompt,
                &options,
                &SpeculativeOptions {
                    draft_max,
                    adaptive: true,
                },
                &mut Sampler::greedy(),
                &mut StandardAcceptance,
                |_| Ok(()),
            )?;
            let secs = t0.elapsed().as_secs_f64() - g.generation.prefill_time.as_secs_f64();
            (g.generation.tokens, secs, Some(g.stats))
        }
    })
}

/// `ork bench spec`.
pub fn bench_spec(opts: &ModelOpts, b: &SpecBench, json: bool) -> Result<ExitCode> {
    let manifest = open_manifest(&opts.model)?;
    let dtype = PackDtype::from(opts.dtype);
    let full = plan_weights(&manifest, dtype, u64::MAX / 4, u64::MAX / 4, 1, 4)?.model_bytes;
    let mib = |x: u64| x as f64 / (1 << 20) as f64;
    let budgets: Vec<u64> = if b.budgets_mb.is_empty() {
        [1, 2, 3]
            .iter()
            .map(|q| (full * q / 4).div_ceil(1 << 20) << 20)
            .collect()
    } else {
        b.budgets_mb.iter().map(|mb| mb << 20).collect()
    };
    let resident_budget = (full + (64 << 20)).div_ceil(1 << 20) << 20;

    // The .orkpack first, and the prompts.
    let mut base = engine_config(opts, false);
    base.budget_bytes = Some(resident_budget);
    let first = open_engine(base, true)?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| first.tokenizer().encode(p, true, false))
        .collect::<Result<_, _>>()?;
    let n_layer = first.model().config().n_layer;
    drop(first);

    // The draft model: given, or the model's first eighth of blocks.
    let tmp = tempfile::tempdir()?;
    let draft_path = match &b.draft_model {
        Some(p) => p.clone(),
        None => {
            let blocks = (n_layer / 8).max(1);
            let src = ork_gguf::GgufFile::open(&opts.model)?;
            let arch = src
                .metadata("general.architecture")
                .and_then(|v| v.as_str())
                .context("the model has no general.architecture")?
                .to_owned();
            let keep = |name: &str| match name.strip_prefix("blk.") {
                Some(rest) => rest
                    .split('.')
                    .next()
                    .and_then(|i| i.parse::<usize>().ok())
                    .is_some_and(|i| i < blocks),
                None => true,
            };
            let path = tmp.path().join(format!("draft-{blocks}-blocks.gguf"));
            ork_gguf::writer::GgufBuilder::from_file(
                &src,
                keep,
                &[(
                    &format!("{arch}.block_count"),
                    ork_gguf::MetaValue::U32(blocks as u32),
                )],
            )
            .write(&path)?;
            path
        }
    };
    let kinds = [
        None,
        Some(DraftArg::Lookup),
        Some(DraftArg::SelfLayers(None)),
        Some(DraftArg::Model(draft_path)),
    ];

    let mut configs = Vec::new();
    for (budget, resident) in budgets
        .iter()
        .map(|&x| (x, false))
        .chain([(resident_budget, true)])
    {
        for kind in &kinds {
            let mut config = engine_config(opts, false);
            config.draft = kind.as_ref().and_then(DraftArg::engine_source);
            config.budget_bytes = Some(budget);
            let mut c = Config {
                requested: budget,
                budget,
                draft_bytes: 0,
                resident,
                kind: kind.clone(),
                engine: None,
                refused: None,
                seconds: Vec::new(),
                tokens: Vec::new(),
                drafted: 0,
                accepted: 0,
                passes: 0,
                generated: 0,
                moved: 0,
            };
            match open_engine(config.clone(), true) {
                Ok(e) => c.engine = Some(e),
                Err(e) => match e.downcast_ref::<ork_runtime::RuntimeError>() {
                    // A draft model does not fit beside a quarter of the model: give the model
                    // the same share as the others, the draft's bytes on top.
                    Some(ork_runtime::RuntimeError::DraftTooLarge { draft_mib, .. })
                        if matches!(kind, Some(DraftArg::Model(_))) =>
                    {
                        let extra = ((draft_mib * (1 << 20) as f64) as u64).div_ceil(1 << 20) << 20;
                        config.budget_bytes = Some(budget + extra);
                        c.budget = budget + extra;
                        match open_engine(config, true) {
                            Ok(e) => c.engine = Some(e),
                            Err(e) => c.refused = Some(format!("{e:#}")),
                        }
                    }
                    _ => c.refused = Some(format!("{e:#}")),
                },
            }
            if let Some(e) = &c.engine {
                c.draft_bytes = e.draft().map_or(0, |d| d.bytes());
                // Warm-up: first use of every weight (and of the draft's).
                generate_once(e, c.kind.as_ref(), &prompts[0], 4, b.draft_max)?;
            }
            configs.push(c);
        }
    }
    // Interleaved rounds: a noisy machine hits every configuration alike.
    for _ in 0..b.rounds {
        for c in configs.iter_mut() {
            let Some(e) = &c.engine else { continue };
            let mut secs = 0.0;
            let mut tokens = Vec::new();
            let moved0 = bytes_moved(e);
            for p in &prompts {
                let (t, s, st) = generate_once(e, c.kind.as_ref(), p, b.tokens, b.draft_max)?;
                secs += s;
                c.generated += t.len();
                tokens.push(t);
                if let Some(st) = st {
                    c.drafted += st.drafted;
                    c.accepted += st.accepted;
                    c.passes += st.passes;
                } else {
                    c.passes += b.tokens - 1;
                }
            }
            c.moved += bytes_moved(e) - moved0;
            c.seconds.push(secs);
            c.tokens = tokens;
        }
    }

    let per_round = (b.tokens * prompts.len()) as f64;
    let mut rows = Vec::new();
    for c in &configs {
        let plain = configs
            .iter()
            .find(|p| p.kind.is_none() && p.requested == c.requested && p.resident == c.resident);
        let median = |s: &[f64]| {
            let mut v = s.to_vec();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let tok_s = per_round / median(&c.seconds);
        let plain_tok_s = plain.map_or(f64::NAN, |p| per_round / median(&p.seconds));
        let label = c.kind.as_ref().map_or("none".to_owned(), DraftArg::label);
        rows.push(serde_json::json!({
            "draft": label,
            "draft_name": c.engine.as_ref().and_then(|e| e.draft()).map(|d| d.label().to_owned()),
            "resident": c.resident,
            "budget_bytes": c.budget,
            "requested_budget_bytes": c.requested,
            "draft_bytes": c.draft_bytes,
            "refused": c.refused,
            "tok_s": tok_s,
            "round_tok_s": c.seconds.iter().map(|s| per_round / s).collect::<Vec<_>>(),
            "speedup": tok_s / plain_tok_s,
            "acceptance_rate": if c.drafted > 0 { c.accepted as f64 / c.drafted as f64 } else { 0.0 },
            "tokens_per_pass": if c.passes > 0 { c.generated as f64 / c.passes as f64 } else { 0.0 },
            "streamed_bytes_per_token": c.moved as f64 / c.generated.max(1) as f64,
            "greedy_identical": plain.is_some_and(|p| p.tokens == c.tokens),
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": full,
                "tokens": b.tokens, "prompts": PROMPTS.len(), "draft_max": b.draft_max,
                "rounds": b.rounds, "results": rows})
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<10} {:>9} {:>9} {:<22} {:>8} {:>8} {:>7} {:>8} {:>10} {:>9}",
        "mode",
        "budget",
        "draft MiB",
        "draft",
        "tok/s",
        "speedup",
        "accept",
        "tok/pass",
        "MiB/token",
        "identical"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let mode = if r["resident"].as_bool().unwrap_or(false) {
            "resident"
        } else {
            "streamed"
        };
        let draft = r["draft_name"].as_str().map_or_else(
            || r["draft"].as_str().unwrap_or("").to_owned(),
            |n| {
                if r["draft"] == "self" {
                    n.to_owned()
                } else {
                    r["draft"].as_str().unwrap_or("").to_owned()
                }
            },
        );
        if let Some(why) = r["refused"].as_str() {
            println!(
                "{mode:<10} {:>7.0}Mi {:>9} {draft:<22} refused: {why}",
                mib(r["budget_bytes"].as_u64().unwrap_or(0)),
                ""
            );
            continue;
        }
        println!(
            "{mode:<10} {:>7.0}Mi {:>9.1} {draft:<22} {:>8.1} {:>7.2}x {:>6.0}% {:>8.2} {:>10.1} {:>9}",
            mib(r["budget_bytes"].as_u64().unwrap_or(0)),
            mib(r["draft_bytes"].as_u64().unwrap_or(0)),
            f("tok_s"),
            f("speedup"),
            f("acceptance_rate") * 100.0,
            f("tokens_per_pass"),
            f("streamed_bytes_per_token") / (1 << 20) as f64,
            if r["greedy_identical"].as_bool().unwrap_or(false) {
                "yes"
            } else {
                "NO"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
