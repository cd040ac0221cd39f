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
use ork_runtime::Engine;
use serde::Serialize;

use crate::cli::{DraftArg, ModelOpts, SpecArgs};
use crate::open_model::{engine_config, open_engine, open_manifest};
use ork_runtime::bench::stream::packed_model_bytes;

/// The speculative options `args` ask for (`None` without `--draft`), checked before anything is
/// opened.
pub fn options(args: &SpecArgs) -> Result<Option<SpeculativeOptions>> {
    if args.draft.is_none() {
        return Ok(None);
    }
    let o = SpeculativeOptions {
        draft_max: args.draft_max,
        adaptive: !args.draft_fixed,
        tree_nodes: args.draft_tree,
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
    /// Tokens per drafted tree (`--draft-tree`; none: a chain).
    draft_tree: Option<usize>,
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
            draft_tree: options.tree_nodes,
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
            " | draft {}{} (max {}): drafted {} accepted {} ({:.0} %) | {} verifier passes, {:.2} tok/pass",
            self.draft,
            self.draft_tree.map_or_else(String::new, |n| format!(", trees of {n}")),
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
    /// Tokens per tree of the `lookup-tree` draft.
    pub draft_tree: usize,
    /// Which drafts to run (`lookup`, `lookup-tree`, `self`, `model`).
    pub drafts: Vec<String>,
    pub draft_model: Option<PathBuf>,
    pub budgets_mb: Vec<u64>,
}

/// The bench's prompts, as a user would give them (through the model's chat template when it
/// has one): a chat question, a summary of a given text, and a rewrite of given code.
const PROMPTS: [(&str, &str); 3] = [
    (
        "chat",
        "I have an exam on computer memory next week. Explain what a page fault is and how an \
         operating system handles one, in a few short paragraphs.",
    ),
    (
        "summarise",
        "Summarise the following text in three sentences.\n\nThe history of computing is a \
         story of machines that outgrew their memory. Early computers stored programs on punched \
         cards and paper tape, and engineers learned to page data in and out of a small fast \
         store. Virtual memory let a program use more memory than the machine had, by keeping \
         the most recently used pages close at hand and fetching the others from disk when they \
         were needed. Caches followed the same idea inside the processor: a small, fast memory \
         holds the data used most often, and a larger, slower one holds the rest. Today large \
         language models face the same problem: their weights do not fit the accelerator's \
         memory, so the weights are streamed in while the computation runs.",
    ),
    (
        "code",
        "Rewrite this Python function with type hints and a docstring, keeping its \
         behaviour:\n\ndef average(values):\n    total = 0\n    count = 0\n    for value in \
         values:\n        total = total + value\n        count = count + 1\n    if count == \
         0:\n        return 0\n    return total / count\n",
    ),
];

/// A draft of the bench: a kind, verified as a chain or (`tree`) as trees.
#[derive(Clone)]
struct BenchDraft {
    kind: DraftArg,
    tree: Option<usize>,
}

/// One configuration: a budget and a draft kind, on an engine of its own.
struct Config {
    /// The budget of the configuration's row (the plain run it is compared with has it too).
    requested: u64,
    /// The budget opened with (a draft model's bytes on top of `requested` when they do not fit).
    budget: u64,
    draft_bytes: u64,
    resident: bool,
    kind: Option<BenchDraft>,
    engine: Option<Engine>,
    refused: Option<String>,
    seconds: Vec<f64>,
    tokens: Vec<Vec<u32>>,
    drafted: usize,
    accepted: usize,
    passes: usize,
    generated: usize,
    /// Per prompt: (generated tokens, verifier passes).
    per_prompt: Vec<(usize, usize)>,
    moved: u64,
    /// MoE models: (block forwards, experts run) during the timed rounds.
    moe: (u64, u64),
    /// The board clock's recording of the last round (docs/board-model.md).
    rec: Option<std::sync::Arc<ork_board::Recorder>>,
}

/// One greedy generation of `n` tokens; (tokens, seconds after the prefill, the speculative
/// counters if any).
fn generate_once(
    engine: &Engine,
    kind: Option<&BenchDraft>,
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
            let mut draft = make_draft(engine, &kind.kind, 0.0, 0, 0.0)?;
            let g = generate_speculative(
                &mut session,
                draft.as_mut(),
                prompt,
                &options,
                &SpeculativeOptions {
                    draft_max,
                    adaptive: true,
                    tree_nodes: kind.tree,
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
    crate::open_model::refuse_cpu(opts, "bench spec")?;
    let manifest = open_manifest(&opts.model)?;
    let dtype = PackDtype::from(opts.dtype);
    let full = packed_model_bytes(&manifest, dtype)?;
    let budgets: Vec<u64> = if b.budgets_mb.is_empty() {
        [1, 2, 3]
            .iter()
            .map(|q| (full * q / 4).div_ceil(1 << 20) << 20)
            .collect()
    } else {
        b.budgets_mb.iter().map(|mb| mb << 20).collect()
    };
    let resident_budget = (full + (64 << 20)).div_ceil(1 << 20) << 20;
    let (prompts, n_layer) = bench_prompts(opts, resident_budget)?;
    let tmp = tempfile::tempdir()?;
    let draft_path = match &b.draft_model {
        Some(p) => p.clone(),
        None => first_blocks_draft(opts, n_layer, tmp.path())?,
    };
    let kinds = bench_drafts(b, &draft_path);
    let mut configs = Vec::new();
    for (budget, resident) in budgets
        .iter()
        .map(|&x| (x, false))
        .chain([(resident_budget, true)])
    {
        for kind in &kinds {
            configs.push(open_config(opts, b, budget, resident, kind, &prompts[0])?);
        }
    }
    // Interleaved rounds: a noisy machine hits every configuration alike.
    for _ in 0..b.rounds {
        for c in configs.iter_mut() {
            timed_round(c, &prompts, b)?;
        }
    }
    let per_round = (b.tokens * prompts.len()) as f64;
    let projected = crate::cmd_spec_project::project(&configs_view(&configs), per_round)?;
    let rows = result_rows(&configs, per_round, &projected);
    let crossovers = crossovers(&rows);
    let union = expert_union(&configs, &prompts[0])?;
    if json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": full,
                "tokens": b.tokens, "prompts": PROMPTS.iter().map(|p| p.0).collect::<Vec<_>>(),
                "draft_max": b.draft_max, "draft_tree": b.draft_tree,
                "rounds": b.rounds, "results": rows, "crossover": crossovers,
                "projected_board": ork_runtime::bench::project::BENCH_BOARD,
                "moe_expert_union": union})
        );
        return Ok(ExitCode::SUCCESS);
    }
    print_rows(&rows);
    print_union(&union);
    for (draft, c) in &crossovers {
        println!("crossover, {draft}: {}", c.as_str().unwrap_or(""));
    }
    projected.print(&rows);
    println!(
        "prompts ({}, through the chat template): {}",
        b.tokens,
        PROMPTS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// Open the engine once (so the .orkpack exists before anything is timed) and tokenize the
/// bench's prompts through the model's chat template; (prompts, the model's block count).
fn bench_prompts(opts: &ModelOpts, resident_budget: u64) -> Result<(Vec<Vec<u32>>, usize)> {
    let mut base = engine_config(opts, false)?;
    base.budget_bytes = Some(resident_budget);
    let first = open_engine(base, true)?;
    let template = first.chat_template()?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|(_, p)| -> Result<Vec<u32>> {
            Ok(match &template {
                Some(t) => {
                    let text = t.render(&[ork_exec::ChatMessage::new("user", p)], true)?;
                    first.tokenizer().encode(&text, false, true)?
                }
                None => first.tokenizer().encode(p, true, false)?,
            })
        })
        .collect::<Result<_>>()?;
    Ok((prompts, first.model().config().n_layer))
}

/// The default draft model: the model's first eighth of blocks, written to `dir`.
fn first_blocks_draft(opts: &ModelOpts, n_layer: usize, dir: &std::path::Path) -> Result<PathBuf> {
    let blocks = (n_layer / 8).max(1);
    let src = ork_gguf::GgufFile::open(&opts.model)?;
    let arch = src
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
        .context("the model has no general.architecture")?
        .to_owned();
    let keep = |name: &str| ork_manifest::block_of(name).is_none_or(|i| i < blocks);
    let path = dir.join(format!("draft-{blocks}-blocks.gguf"));
    ork_gguf::writer::GgufBuilder::from_file(
        &src,
        keep,
        &[(
            &format!("{arch}.block_count"),
            ork_gguf::MetaValue::U32(blocks as u32),
        )],
    )
    .write(&path)?;
    Ok(path)
}

/// The drafts of the bench: none (plain decoding) first, then each `--drafts` entry.
fn bench_drafts(b: &SpecBench, draft_path: &std::path::Path) -> Vec<Option<BenchDraft>> {
    let mut kinds = vec![None];
    for d in &b.drafts {
        let (kind, tree) = match d.as_str() {
            "lookup" => (DraftArg::Lookup, None),
            "lookup-tree" => (DraftArg::Lookup, Some(b.draft_tree)),
            "self" => (DraftArg::SelfLayers(None), None),
            _ => (DraftArg::Model(draft_path.to_path_buf()), None),
        };
        kinds.push(Some(BenchDraft { kind, tree }));
    }
    kinds
}

/// One configuration's engine, warmed up (first use of every weight, and of the draft's), its
/// board-clock recording started; a configuration whose engine does not open is kept, refused.
fn open_config(
    opts: &ModelOpts,
    b: &SpecBench,
    budget: u64,
    resident: bool,
    kind: &Option<BenchDraft>,
    warm_prompt: &[u32],
) -> Result<Config> {
    let mut config = engine_config(opts, false)?;
    config.draft = kind.as_ref().and_then(|k| k.kind.engine_source());
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
        per_prompt: vec![(0, 0); PROMPTS.len()],
        moved: 0,
        moe: (0, 0),
        rec: None,
    };
    match open_engine(config.clone(), true) {
        Ok(e) => c.engine = Some(e),
        Err(e) => match e.downcast_ref::<ork_runtime::RuntimeError>() {
            // A draft model does not fit beside a quarter of the model: give the model the
            // same share as the others, the draft's bytes on top.
            Some(ork_runtime::RuntimeError::DraftTooLarge { draft_mib, .. })
                if matches!(
                    kind,
                    Some(BenchDraft {
                        kind: DraftArg::Model(_),
                        ..
                    })
                ) =>
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
        generate_once(e, c.kind.as_ref(), warm_prompt, 4, b.draft_max)?;
        c.rec = ork_runtime::bench::project::record_bench(e);
    }
    Ok(c)
}

/// One timed round of configuration `c` (nothing for a refused one): every prompt generated,
/// the counters added; the board clock records this round only.
fn timed_round(c: &mut Config, prompts: &[Vec<u32>], b: &SpecBench) -> Result<()> {
    let Some(e) = &c.engine else { return Ok(()) };
    if let Some(r) = &c.rec {
        r.clear();
    }
    let mut secs = 0.0;
    let mut tokens = Vec::new();
    let moved0 = bytes_moved(e);
    let moe0 = e.model().moe_stats().unwrap_or_default();
    for (i, p) in prompts.iter().enumerate() {
        let (t, s, st) = generate_once(e, c.kind.as_ref(), p, b.tokens, b.draft_max)?;
        secs += s;
        c.generated += t.len();
        let passes = match st {
            Some(st) => {
                c.drafted += st.drafted;
                c.accepted += st.accepted;
                st.passes
            }
            None => t.len().saturating_sub(1),
        };
        c.passes += passes;
        c.per_prompt[i].0 += t.len();
        c.per_prompt[i].1 += passes;
        tokens.push(t);
    }
    c.moved += bytes_moved(e) - moved0;
    if let Some(m) = e.model().moe_stats() {
        c.moe.0 += m.forwards - moe0.forwards;
        c.moe.1 += m.experts_run - moe0.experts_run;
    }
    c.seconds.push(secs);
    c.tokens = tokens;
    Ok(())
}

/// Each configuration's row: its speed against the plain run of the same budget, its draft
/// counters, and its projection.
fn result_rows(
    configs: &[Config],
    per_round: f64,
    projected: &crate::cmd_spec_project::Projected,
) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for c in configs {
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
        let label = c.kind.as_ref().map_or("none".to_owned(), |k| match k.tree {
            Some(n) => format!("{}-tree:{n}", k.kind.label()),
            None => k.kind.label(),
        });
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
            "tokens_per_pass_by_prompt": PROMPTS.iter().zip(&c.per_prompt).map(|((name, _), &(g, p))| {
                (name.to_string(), serde_json::json!(if p > 0 { g as f64 / p as f64 } else { 0.0 }))
            }).collect::<serde_json::Map<String, serde_json::Value>>(),
            "streamed_bytes_per_token": c.moved as f64 / c.generated.max(1) as f64,
            "experts_per_block_pass": (c.moe.0 > 0).then(|| c.moe.1 as f64 / c.moe.0 as f64),
            "greedy_identical": plain.is_some_and(|p| p.tokens == c.tokens),
            "projected": projected.json(rows.len()),
        }));
    }
    rows
}

/// The text table of the rows.
fn print_rows(rows: &[serde_json::Value]) {
    let mib = |x: u64| x as f64 / (1 << 20) as f64;
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
    for r in rows {
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
}

/// MoE models: the verify batch's expert union, pass time and bytes.
fn print_union(union: &serde_json::Value) {
    if let Some(u) = union.as_array() {
        println!("MoE verify batch (M = k + 1 tokens): experts per block (union), streamed pass time and MiB copied");
        for r in u {
            println!(
                "  M {:>2}: {:>5.2} experts/block, {:>7.1} ms/pass ({:.2}x M = 1), {:>7.1} MiB/pass",
                r["m"].as_u64().unwrap_or(0),
                r["experts_per_block"].as_f64().unwrap_or(f64::NAN),
                r["pass_ms"].as_f64().unwrap_or(f64::NAN),
                r["pass_time_vs_m1"].as_f64().unwrap_or(f64::NAN),
                r["mib_per_pass"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
}

/// What the board clock's projection needs of each configuration.
fn configs_view(configs: &[Config]) -> Vec<crate::cmd_spec_project::Measured<'_>> {
    configs
        .iter()
        .map(|c| crate::cmd_spec_project::Measured {
            engine: c.engine.as_ref(),
            rec: c.rec.as_deref(),
            requested: c.requested,
            resident: c.resident,
            plain: c.kind.is_none(),
            separate_draft: matches!(
                c.kind,
                Some(BenchDraft {
                    kind: DraftArg::Model(_),
                    ..
                })
            ),
        })
        .collect()
}

/// MoE models: for verify batches of M = 1, 2, 3, 5, 9, 17 tokens (the prompt's plain greedy
/// continuation after the prompt), the experts a block runs per pass (the union of the batch's
/// rows' experts) and, on the lowest streamed budget's plain engine, the pass time and the weight
/// bytes copied (median of 3). `null` for a dense model.
fn expert_union(configs: &[Config], prompt: &[u32]) -> Result<serde_json::Value> {
    let Some(c) = configs
        .iter()
        .find(|c| c.kind.is_none() && c.engine.is_some())
    else {
        return Ok(serde_json::Value::Null);
    };
    let Some(e) = &c.engine else {
        return Ok(serde_json::Value::Null);
    };
    if e.model().moe_stats().is_none() {
        return Ok(serde_json::Value::Null);
    }
    let continuation = c.tokens.first().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut m1_ms = f64::NAN;
    for m in [1usize, 2, 3, 5, 9, 17] {
        if continuation.len() < m {
            break;
        }
        let mut times = Vec::new();
        let mut moved = Vec::new();
        let mut experts = (0, 0);
        for _ in 0..3 {
            let mut s = e.session();
            s.prefill(prompt)?;
            let s0 = e.model().moe_stats().unwrap_or_default();
            let b0 = bytes_moved(e);
            let t0 = Instant::now();
            s.forward_all(&continuation[..m])?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            moved.push(bytes_moved(e) - b0);
            let s1 = e.model().moe_stats().unwrap_or_default();
            experts.0 += s1.forwards - s0.forwards;
            experts.1 += s1.experts_run - s0.experts_run;
        }
        times.sort_by(f64::total_cmp);
        moved.sort_unstable();
        let ms = times[1];
        if m == 1 {
            m1_ms = ms;
        }
        out.push(serde_json::json!({
            "m": m,
            "experts_per_block": experts.1 as f64 / experts.0.max(1) as f64,
            "pass_ms": ms,
            "pass_time_vs_m1": ms / m1_ms,
            "mib_per_pass": moved[1] as f64 / (1 << 20) as f64,
            "budget_bytes": c.budget,
        }));
    }
    Ok(serde_json::Value::Array(out))
}

/// Per draft, the budget where drafting stops paying: the speed-ups against plain decoding at
/// each budget, the crossing of 1.0× interpolated linearly between the two budgets around it.
fn crossovers(rows: &[serde_json::Value]) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    let mut drafts: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["draft"].as_str())
        .filter(|d| *d != "none")
        .collect();
    drafts.dedup();
    for d in drafts {
        let mut points: Vec<(f64, f64, bool)> = rows
            .iter()
            .filter(|r| r["draft"] == d && r["refused"].is_null())
            .map(|r| {
                (
                    r["requested_budget_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
                    r["speedup"].as_f64().unwrap_or(f64::NAN),
                    r["resident"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let pays = |s: f64| s >= 1.0;
        let text = match points.iter().position(|p| !pays(p.1)) {
            None => "pays at every budget measured, resident included".to_owned(),
            Some(0) => "does not pay at any budget measured".to_owned(),
            Some(i) => {
                let (a, b) = (points[i - 1], points[i]);
                let at = a.0 + (b.0 - a.0) * (a.1 - 1.0) / (a.1 - b.1);
                format!(
                    "pays up to ~{at:.0} MiB ({:.2}× at {:.0} MiB, {:.2}× at {:.0} MiB{})",
                    a.1,
                    a.0,
                    b.1,
                    b.0,
                    if b.2 { ", resident" } else { "" }
                )
            }
        };
        out.insert(d.to_owned(), serde_json::Value::String(text));
    }
    out
}
