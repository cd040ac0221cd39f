//! Speculative decoding in the CLI: the draft of `ork run --draft …`, its report, and
//! `ork bench spec`'s printing of `ork_runtime::bench::spec`'s report (`docs/speculative.md`).

use std::process::ExitCode;

use anyhow::Result;
use ork_exec::{Draft, Sampler, SamplerOptions, SpeculativeGeneration, SpeculativeOptions};
use ork_runtime::bench::project::BENCH_BOARD;
use ork_runtime::bench::spec::{
    SpecBenchOptions, SpecBenchReport, SpecDraft, SpecProjection, SpecRow, UnionRow,
};
use ork_runtime::{DraftKind, Engine};
use serde::Serialize;

use crate::cli::{SpecArgs, SpecBenchArgs};
use crate::open_model::{bench_front, engine_config};

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

/// The draft `kind` over `engine` (whose config must have asked for its device part); a draft
/// model samples at `temperature` from a stream derived from `seed`.
pub fn make_draft(
    engine: &Engine,
    kind: &DraftKind,
    temperature: f32,
    seed: u64,
    p_min: f32,
) -> Result<Box<dyn Draft>> {
    let sampler = Sampler::new(SamplerOptions {
        temperature,
        seed: draft_seed(seed),
        ..SamplerOptions::default()
    })?;
    Ok(kind.drafter(engine, sampler, p_min)?)
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
        kind: &DraftKind,
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

/// A `--drafts` entry (clap allows only these four).
fn spec_draft(name: &str) -> SpecDraft {
    match name {
        "lookup" => SpecDraft::Lookup,
        "lookup-tree" => SpecDraft::LookupTree,
        "self" => SpecDraft::SelfLayers,
        _ => SpecDraft::Model,
    }
}

/// `ork bench spec`: runs `ork_runtime::bench::spec::bench_spec` and prints its report.
pub fn bench_spec(b: &SpecBenchArgs) -> Result<ExitCode> {
    let opts = &b.model;
    crate::open_model::refuse_cpu(opts, "bench spec")?;
    let options = SpecBenchOptions {
        base: engine_config(opts, false)?,
        tokens: b.tokens,
        rounds: b.rounds,
        draft_max: b.draft_max,
        draft_tree: b.draft_tree,
        drafts: b.drafts.iter().map(|d| spec_draft(d)).collect(),
        draft_model: b.draft_model.clone(),
        budgets_bytes: b.budgets_mb.iter().map(|mb| mb << 20).collect(),
    };
    let r = ork_runtime::bench::spec::bench_spec(&options, &bench_front())?;
    if b.json {
        println!(
            "{}",
            serde_json::json!({"model": opts.model.display().to_string(), "model_bytes": r.model_bytes,
                "tokens": b.tokens, "prompts": r.prompts,
                "draft_max": b.draft_max, "draft_tree": b.draft_tree,
                "rounds": b.rounds, "results": serde_json::to_value(&r.results)?,
                "crossover": r.crossover, "projected_board": BENCH_BOARD,
                "moe_expert_union": r.moe_expert_union})
        );
        return Ok(ExitCode::SUCCESS);
    }
    print_report(&r, b.tokens);
    Ok(ExitCode::SUCCESS)
}

/// The text report: the table, the MoE union, the crossovers, the projection, the prompts.
fn print_report(r: &SpecBenchReport, tokens: usize) {
    print_rows(&r.results);
    if let Some(u) = &r.moe_expert_union {
        print_union(u);
    }
    for (draft, c) in &r.crossover {
        println!("crossover, {draft}: {c}");
    }
    print_projected(&r.results);
    println!(
        "prompts ({tokens}, through the chat template): {}",
        r.prompts.join(", ")
    );
}

/// `resident` or `streamed`.
fn mode(r: &SpecRow) -> &'static str {
    if r.resident {
        "resident"
    } else {
        "streamed"
    }
}

/// MiB of `x` bytes.
fn mib(x: u64) -> f64 {
    x as f64 / (1 << 20) as f64
}

/// The text table of the rows.
fn print_rows(rows: &[SpecRow]) {
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
        let mode = mode(r);
        // A self draft is named by the blocks it opened with (`self:N`).
        let draft = match &r.draft_name {
            Some(n) if r.draft == "self" => n,
            _ => &r.draft,
        };
        if let Some(why) = &r.refused {
            println!(
                "{mode:<10} {:>7.0}Mi {:>9} {draft:<22} refused: {why}",
                mib(r.budget_bytes),
                ""
            );
            continue;
        }
        println!(
            "{mode:<10} {:>7.0}Mi {:>9.1} {draft:<22} {:>8.1} {:>7.2}x {:>6.0}% {:>8.2} {:>10.1} {:>9}",
            mib(r.budget_bytes),
            mib(r.draft_bytes),
            r.tok_s,
            r.speedup,
            r.acceptance_rate * 100.0,
            r.tokens_per_pass,
            r.streamed_bytes_per_token / (1 << 20) as f64,
            if r.greedy_identical { "yes" } else { "NO" }
        );
    }
}

/// MoE models: the verify batch's expert union, pass time and bytes.
fn print_union(union: &[UnionRow]) {
    println!("MoE verify batch (M = k + 1 tokens): experts per block (union), streamed pass time and MiB copied");
    for r in union {
        println!(
            "  M {:>2}: {:>5.2} experts/block, {:>7.1} ms/pass ({:.2}x M = 1), {:>7.1} MiB/pass",
            r.m, r.experts_per_block, r.pass_ms, r.pass_time_vs_m1, r.mib_per_pass,
        );
    }
}

/// The projected speedups beside the measured ones, one line per row.
fn print_projected(rows: &[SpecRow]) {
    println!(
        "projected on {BENCH_BOARD} (board model {}), each configuration's last round replayed; measured on this machine beside it:",
        ork_board::MODEL_VERSION
    );
    for r in rows {
        let head = format!(
            "  {:<9} {:>7.0}Mi {:<18}",
            mode(r),
            mib(r.requested_budget_bytes),
            r.draft
        );
        match &r.projected {
            SpecProjection::Projected { tok_s, speedup } => println!(
                "{head} measured {:>5.2}x   projected {speedup:>5.2}x ({tok_s:.1} tok/s projected)",
                r.speedup
            ),
            SpecProjection::None(why) => println!("{head} not projected: {why}"),
        }
    }
}
