//! `ork bench spec`: speculative decoding against plain decoding at several weight budgets and
//! resident, each draft on an engine of its own, measured in the same run with interleaved
//! rounds; each configuration's last round projected on the board clock (`docs/speculative.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ork_exec::{
    generate, generate_speculative, GenerateOptions, Sampler, SpeculativeOptions, SpeculativeStats,
    StandardAcceptance,
};
use serde::ser::SerializeMap;
use serde::Serialize;

use super::project::{bench_decode_s, record_bench, BENCH_BOARD};
use super::stream::packed_model_bytes;
use super::{upper_median, BenchError, EngineFrontEnd};
use crate::{bytes_moved, DraftKind, Engine, EngineConfig, RuntimeError};

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

/// The names of the bench's prompts, in the order they run.
pub fn prompt_names() -> Vec<&'static str> {
    PROMPTS.iter().map(|p| p.0).collect()
}

/// A draft the bench compares with plain decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecDraft {
    /// Prompt lookup, verified as a chain.
    Lookup,
    /// Prompt lookup, verified as trees of [`SpecBenchOptions::draft_tree`] tokens.
    LookupTree,
    /// The model's own first blocks (as many as fit).
    SelfLayers,
    /// A draft model ([`SpecBenchOptions::draft_model`]).
    Model,
}

/// What `ork bench spec` runs.
#[derive(Clone, Debug)]
pub struct SpecBenchOptions {
    /// The model and every engine option the configurations share (each sets its own budget and
    /// draft).
    pub base: EngineConfig,
    /// Tokens generated per prompt.
    pub tokens: usize,
    /// Timed rounds, interleaved across configurations (the median is reported).
    pub rounds: usize,
    /// Most draft tokens per verifier pass.
    pub draft_max: usize,
    /// Tokens per tree of [`SpecDraft::LookupTree`].
    pub draft_tree: usize,
    /// The drafts to compare with plain decoding.
    pub drafts: Vec<SpecDraft>,
    /// The draft model; `None`: the model's first eighth of blocks, written to a temporary
    /// GGUF.
    pub draft_model: Option<PathBuf>,
    /// The streamed budgets; empty: 1/4, 1/2 and 3/4 of the model. A resident run is added.
    pub budgets_bytes: Vec<u64>,
}

/// A configuration's figures projected on the board clock's bench board, or why there are none.
#[derive(Clone, Debug, PartialEq)]
pub enum SpecProjection {
    /// Projected decode tok/s and the speed-up over plain decoding at the same budget.
    Projected {
        /// Projected decode tok/s.
        tok_s: f64,
        /// Over the projected plain decoding of the same budget.
        speedup: f64,
    },
    /// Not projected, and why.
    None(&'static str),
}

impl Serialize for SpecProjection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("label", "projected")?;
        m.serialize_entry("board", BENCH_BOARD)?;
        match self {
            SpecProjection::Projected { tok_s, speedup } => {
                m.serialize_entry("model_version", ork_board::MODEL_VERSION)?;
                m.serialize_entry("tok_s", tok_s)?;
                m.serialize_entry("speedup", speedup)?;
            }
            SpecProjection::None(why) => m.serialize_entry("none", why)?,
        }
        m.end()
    }
}

/// One configuration's row: its speed against the plain run of the same budget, its draft
/// counters, and its projection.
#[derive(Clone, Debug, Serialize)]
pub struct SpecRow {
    /// `none` (plain decoding), or the draft's label (`lookup-tree:N` for trees).
    pub draft: String,
    /// The draft the engine opened (`self:N`, the draft model's file), if any.
    pub draft_name: Option<String>,
    /// The resident configuration (the budget holds the whole model).
    pub resident: bool,
    /// The budget opened with (a draft model's bytes on top of the requested one when they did
    /// not fit beside it).
    pub budget_bytes: u64,
    /// The budget of the row, which the plain run it is compared with has too.
    pub requested_budget_bytes: u64,
    /// Device bytes the draft keeps resident.
    pub draft_bytes: u64,
    /// Why the engine did not open, if it did not.
    pub refused: Option<String>,
    /// Median decode tok/s over the rounds.
    pub tok_s: f64,
    /// Each round's tok/s.
    pub round_tok_s: Vec<f64>,
    /// Over plain decoding at the same budget.
    pub speedup: f64,
    /// Accepted drafted tokens over drafted ones (0 without drafts).
    pub acceptance_rate: f64,
    /// Generated tokens per verifier pass.
    pub tokens_per_pass: f64,
    /// The same, per prompt.
    pub tokens_per_pass_by_prompt: BTreeMap<&'static str, f64>,
    /// Weight bytes copied to the device per generated token.
    pub streamed_bytes_per_token: f64,
    /// MoE models: experts run per block pass.
    pub experts_per_block_pass: Option<f64>,
    /// The tokens are those of plain greedy decoding at the same budget.
    pub greedy_identical: bool,
    /// On the board clock.
    pub projected: SpecProjection,
}

/// MoE models: one verify batch size's figures (the lowest streamed budget's plain engine).
#[derive(Clone, Debug, Serialize)]
pub struct UnionRow {
    /// Tokens in the batch.
    pub m: usize,
    /// Experts a block runs per pass (the union of the rows' experts).
    pub experts_per_block: f64,
    /// Median pass time, ms.
    pub pass_ms: f64,
    /// Over the pass time of M = 1.
    pub pass_time_vs_m1: f64,
    /// Median weight MiB copied per pass.
    pub mib_per_pass: f64,
    /// The budget of the engine measured.
    pub budget_bytes: u64,
}

/// What `ork bench spec` measured.
#[derive(Clone, Debug)]
pub struct SpecBenchReport {
    /// The packed model's bytes.
    pub model_bytes: u64,
    /// The prompts' names ([`prompt_names`]).
    pub prompts: Vec<&'static str>,
    /// One row per configuration: budgets in order, the resident one last; per budget, plain
    /// decoding first, then each draft.
    pub results: Vec<SpecRow>,
    /// Per draft label, where drafting stops paying.
    pub crossover: BTreeMap<String, String>,
    /// MoE models: the verify batch's expert union by batch size; `None` for a dense model.
    pub moe_expert_union: Option<Vec<UnionRow>>,
}

/// A draft of the bench: a kind, verified as a chain or (`tree`) as trees.
#[derive(Clone)]
struct BenchDraft {
    kind: DraftKind,
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
    rec: Option<Arc<ork_board::Recorder>>,
}

impl Config {
    fn new(requested: u64, resident: bool, kind: Option<BenchDraft>) -> Config {
        Config {
            requested,
            budget: requested,
            draft_bytes: 0,
            resident,
            kind,
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
        }
    }

    /// A separate draft model, whose device work the verifier's recording does not hold.
    fn separate_draft(&self) -> bool {
        matches!(
            self.kind,
            Some(BenchDraft {
                kind: DraftKind::Model(_),
                ..
            })
        )
    }
}

/// Speculative decoding against plain decoding: per budget (and resident), plain decoding and
/// each draft on an engine of its own, warmed up, then interleaved timed rounds of every
/// prompt; each configuration's last round projected on the board clock.
///
/// # Errors
/// The model does not open or plan, the draft model cannot be written, or a generation fails.
/// A configuration whose engine does not open is kept in the report, refused.
pub fn bench_spec(
    options: &SpecBenchOptions,
    front: &EngineFrontEnd<'_>,
) -> Result<SpecBenchReport, BenchError> {
    let gguf = ork_gguf::GgufFile::open(&options.base.model)?;
    let manifest = ork_manifest::Manifest::from_gguf(&gguf).map_err(RuntimeError::from)?;
    let full = packed_model_bytes(&manifest, options.base.dtype)?;
    let budgets: Vec<u64> = if options.budgets_bytes.is_empty() {
        [1, 2, 3]
            .iter()
            .map(|q| (full * q / 4).div_ceil(1 << 20) << 20)
            .collect()
    } else {
        options.budgets_bytes.clone()
    };
    let resident_budget = (full + (64 << 20)).div_ceil(1 << 20) << 20;
    let (prompts, n_layer) = bench_prompts(options, front, resident_budget)?;
    let tmp = tempfile::tempdir().map_err(|source| BenchError::Io {
        what: "a temporary directory for the draft model".into(),
        source,
    })?;
    let draft_path = match &options.draft_model {
        Some(p) => p.clone(),
        None => first_blocks_draft(&gguf, &options.base.model, n_layer, tmp.path())?,
    };
    let kinds = bench_drafts(options, &draft_path);
    let mut configs = Vec::new();
    for (budget, resident) in budgets
        .iter()
        .map(|&x| (x, false))
        .chain([(resident_budget, true)])
    {
        for kind in &kinds {
            let c = open_config(options, front, budget, resident, kind, &prompts[0])?;
            configs.push(c);
        }
    }
    // Interleaved rounds: a noisy machine hits every configuration alike.
    for _ in 0..options.rounds {
        for c in configs.iter_mut() {
            timed_round(c, &prompts, options)?;
        }
    }
    let per_round = (options.tokens * prompts.len()) as f64;
    let projected = project(&configs, per_round)?;
    let results = result_rows(&configs, per_round, projected);
    let crossover = crossovers(&results);
    let moe_expert_union = expert_union(&configs, &prompts[0])?;
    Ok(SpecBenchReport {
        model_bytes: full,
        prompts: prompt_names(),
        results,
        crossover,
        moe_expert_union,
    })
}

/// Open the engine once (so the .orkpack exists before anything is timed) and tokenize the
/// bench's prompts through the model's chat template; (prompts, the model's block count).
fn bench_prompts(
    options: &SpecBenchOptions,
    front: &EngineFrontEnd<'_>,
    resident_budget: u64,
) -> Result<(Vec<Vec<u32>>, usize), BenchError> {
    let mut base = options.base.clone();
    base.trace = false;
    base.draft = None;
    base.budget_bytes = Some(resident_budget);
    let first = front.open(base, true)?;
    let template = first.chat_template()?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|(_, p)| -> Result<Vec<u32>, BenchError> {
            Ok(match &template {
                Some(t) => {
                    let text = t.render(&[ork_exec::ChatMessage::new("user", p)], true)?;
                    first.tokenizer().encode(&text, false, true)?
                }
                None => first.tokenizer().encode(p, true, false)?,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((prompts, first.model().config().n_layer))
}

/// The default draft model: the first eighth of the blocks of `src` (the model at `path`),
/// written to `dir`.
fn first_blocks_draft(
    src: &ork_gguf::GgufFile,
    path: &Path,
    n_layer: usize,
    dir: &Path,
) -> Result<PathBuf, BenchError> {
    let blocks = (n_layer / 8).max(1);
    let arch = src
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| BenchError::Model {
            what: format!("{}: the model has no general.architecture", path.display()),
        })?
        .to_owned();
    let keep = |name: &str| ork_manifest::block_of(name).is_none_or(|i| i < blocks);
    let out = dir.join(format!("draft-{blocks}-blocks.gguf"));
    ork_gguf::writer::GgufBuilder::from_file(
        src,
        keep,
        &[(
            &format!("{arch}.block_count"),
            ork_gguf::MetaValue::U32(blocks as u32),
        )],
    )
    .write(&out)?;
    Ok(out)
}

/// The drafts of the bench: none (plain decoding) first, then each of `options.drafts`.
fn bench_drafts(options: &SpecBenchOptions, draft_path: &Path) -> Vec<Option<BenchDraft>> {
    let mut kinds = vec![None];
    for d in &options.drafts {
        let (kind, tree) = match d {
            SpecDraft::Lookup => (DraftKind::Lookup, None),
            SpecDraft::LookupTree => (DraftKind::Lookup, Some(options.draft_tree)),
            SpecDraft::SelfLayers => (DraftKind::SelfLayers(None), None),
            SpecDraft::Model => (DraftKind::Model(draft_path.to_path_buf()), None),
        };
        kinds.push(Some(BenchDraft { kind, tree }));
    }
    kinds
}

/// `e`'s text and its sources', joined by `: ` (as the command line prints an error).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// One configuration's engine, warmed up (first use of every weight, and of the draft's), its
/// board-clock recording started; a configuration whose engine does not open is kept, refused.
fn open_config(
    options: &SpecBenchOptions,
    front: &EngineFrontEnd<'_>,
    budget: u64,
    resident: bool,
    kind: &Option<BenchDraft>,
    warm_prompt: &[u32],
) -> Result<Config, BenchError> {
    let mut config = options.base.clone();
    config.trace = false;
    config.draft = kind.as_ref().and_then(|k| k.kind.engine_source());
    config.budget_bytes = Some(budget);
    let mut c = Config::new(budget, resident, kind.clone());
    match (front.open)(config.clone(), true) {
        Ok(e) => c.engine = Some(e),
        Err(e) => match e.downcast_ref::<RuntimeError>() {
            // A draft model does not fit beside a quarter of the model: give the model the
            // same share as the others, the draft's bytes on top.
            Some(RuntimeError::DraftTooLarge { draft_mib, .. }) if c.separate_draft() => {
                let extra = ((draft_mib * (1 << 20) as f64) as u64).div_ceil(1 << 20) << 20;
                config.budget_bytes = Some(budget + extra);
                c.budget = budget + extra;
                match (front.open)(config, true) {
                    Ok(e) => c.engine = Some(e),
                    Err(e) => c.refused = Some(error_chain(e.as_ref())),
                }
            }
            _ => c.refused = Some(error_chain(e.as_ref())),
        },
    }
    if let Some(e) = &c.engine {
        c.draft_bytes = e.draft().map_or(0, |d| d.bytes());
        generate_once(e, c.kind.as_ref(), warm_prompt, 4, options.draft_max)?;
        c.rec = record_bench(e);
    }
    Ok(c)
}

/// One greedy generation of `n` tokens; (tokens, seconds after the prefill, the speculative
/// counters if any).
fn generate_once(
    engine: &Engine,
    kind: Option<&BenchDraft>,
    prompt: &[u32],
    n: usize,
    draft_max: usize,
) -> Result<(Vec<u32>, f64, Option<SpeculativeStats>), BenchError> {
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
            let mut draft = kind.kind.drafter(engine, Sampler::greedy(), 0.0)?;
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

/// One timed round of configuration `c` (nothing for a refused one): every prompt generated,
/// the counters added; the board clock records this round only.
fn timed_round(
    c: &mut Config,
    prompts: &[Vec<u32>],
    options: &SpecBenchOptions,
) -> Result<(), BenchError> {
    let Some(e) = &c.engine else { return Ok(()) };
    if let Some(r) = &c.rec {
        r.clear();
    }
    let mut secs = 0.0;
    let mut tokens = Vec::new();
    let moved0 = bytes_moved(e);
    let moe0 = e.model().moe_stats().unwrap_or_default();
    for (i, p) in prompts.iter().enumerate() {
        let (t, s, st) = generate_once(e, c.kind.as_ref(), p, options.tokens, options.draft_max)?;
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

/// Per configuration: projected decode tok/s and speed-up over plain decoding at the same
/// budget, or why there is none; `per_round` tokens were generated in a round.
fn project(configs: &[Config], per_round: f64) -> Result<Vec<SpecProjection>, BenchError> {
    let mut tok_s: Vec<Result<f64, &'static str>> = Vec::with_capacity(configs.len());
    for c in configs {
        tok_s.push(match (&c.engine, &c.rec) {
            _ if c.separate_draft() => Err("a separate draft model's device work is not recorded"),
            (Some(e), Some(r)) => {
                let s = bench_decode_s(e, r)?;
                if s > 0.0 {
                    Ok(per_round / s)
                } else {
                    Err("no decode passes recorded")
                }
            }
            _ => Err("not run"),
        });
    }
    let row = |c: &Config, t: &Result<f64, &'static str>| -> Result<(f64, f64), &'static str> {
        let t = (*t)?;
        let plain = configs
            .iter()
            .zip(&tok_s)
            .find(|(p, _)| {
                p.kind.is_none() && p.requested == c.requested && p.resident == c.resident
            })
            .and_then(|(_, p)| p.ok())
            .ok_or("no plain decode at this budget")?;
        Ok((t, t / plain))
    };
    Ok(configs
        .iter()
        .zip(&tok_s)
        .map(|(c, t)| match row(c, t) {
            Ok((tok_s, speedup)) => SpecProjection::Projected { tok_s, speedup },
            Err(why) => SpecProjection::None(why),
        })
        .collect())
}

/// `a / b`, 0 when `b` is 0.
fn ratio(a: usize, b: usize) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

/// Each configuration's row (with its projection, in the same order).
fn result_rows(configs: &[Config], per_round: f64, projected: Vec<SpecProjection>) -> Vec<SpecRow> {
    configs
        .iter()
        .zip(projected)
        .map(|(c, projected)| {
            let plain = configs.iter().find(|p| {
                p.kind.is_none() && p.requested == c.requested && p.resident == c.resident
            });
            let tok_s = per_round / upper_median(&c.seconds);
            let plain_tok_s = plain.map_or(f64::NAN, |p| per_round / upper_median(&p.seconds));
            let draft = c.kind.as_ref().map_or("none".to_owned(), |k| match k.tree {
                Some(n) => format!("{}-tree:{n}", k.kind.label()),
                None => k.kind.label(),
            });
            SpecRow {
                draft,
                draft_name: c
                    .engine
                    .as_ref()
                    .and_then(|e| e.draft())
                    .map(|d| d.label().to_owned()),
                resident: c.resident,
                budget_bytes: c.budget,
                requested_budget_bytes: c.requested,
                draft_bytes: c.draft_bytes,
                refused: c.refused.clone(),
                tok_s,
                round_tok_s: c.seconds.iter().map(|s| per_round / s).collect(),
                speedup: tok_s / plain_tok_s,
                acceptance_rate: ratio(c.accepted, c.drafted),
                tokens_per_pass: ratio(c.generated, c.passes),
                tokens_per_pass_by_prompt: PROMPTS
                    .iter()
                    .zip(&c.per_prompt)
                    .map(|((name, _), &(g, p))| (*name, ratio(g, p)))
                    .collect(),
                streamed_bytes_per_token: c.moved as f64 / c.generated.max(1) as f64,
                experts_per_block_pass: (c.moe.0 > 0).then(|| c.moe.1 as f64 / c.moe.0 as f64),
                greedy_identical: plain.is_some_and(|p| p.tokens == c.tokens),
                projected,
            }
        })
        .collect()
}

/// MoE models: for verify batches of M = 1, 2, 3, 5, 9, 17 tokens (the prompt's plain greedy
/// continuation after the prompt), the experts a block runs per pass (the union of the batch's
/// rows' experts) and, on the lowest streamed budget's plain engine, the pass time and the weight
/// bytes copied (median of 3). `None` for a dense model.
fn expert_union(configs: &[Config], prompt: &[u32]) -> Result<Option<Vec<UnionRow>>, BenchError> {
    let Some((c, e)) = configs
        .iter()
        .filter(|c| c.kind.is_none())
        .find_map(|c| c.engine.as_ref().map(|e| (c, e)))
    else {
        return Ok(None);
    };
    if e.model().moe_stats().is_none() {
        return Ok(None);
    }
    let continuation = c.tokens.first().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut m1_ms = f64::NAN;
    for m in [1usize, 2, 3, 5, 9, 17] {
        if continuation.len() < m {
            break;
        }
        let (ms, moved, experts) = verify_passes(e, prompt, &continuation[..m])?;
        if m == 1 {
            m1_ms = ms;
        }
        out.push(UnionRow {
            m,
            experts_per_block: experts.1 as f64 / experts.0.max(1) as f64,
            pass_ms: ms,
            pass_time_vs_m1: ms / m1_ms,
            mib_per_pass: moved as f64 / (1 << 20) as f64,
            budget_bytes: c.budget,
        });
    }
    Ok(Some(out))
}

/// Three verify passes of `batch` after `prompt`: the median pass ms, the median weight bytes
/// copied, and the (block forwards, experts run) of the three.
fn verify_passes(
    e: &Engine,
    prompt: &[u32],
    batch: &[u32],
) -> Result<(f64, u64, (u64, u64)), BenchError> {
    let mut times = Vec::new();
    let mut moved = Vec::new();
    let mut experts = (0, 0);
    for _ in 0..3 {
        let mut s = e.session();
        s.prefill(prompt)?;
        let s0 = e.model().moe_stats().unwrap_or_default();
        let b0 = bytes_moved(e);
        let t0 = Instant::now();
        s.forward_all(batch)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        moved.push(bytes_moved(e) - b0);
        let s1 = e.model().moe_stats().unwrap_or_default();
        experts.0 += s1.forwards - s0.forwards;
        experts.1 += s1.experts_run - s0.experts_run;
    }
    times.sort_by(f64::total_cmp);
    moved.sort_unstable();
    Ok((times[1], moved[1], experts))
}

/// Per draft, the budget where drafting stops paying: the speed-ups against plain decoding at
/// each budget, the crossing of 1.0× interpolated linearly between the two budgets around it.
fn crossovers(rows: &[SpecRow]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for d in rows.iter().map(|r| &r.draft).filter(|d| *d != "none") {
        if out.contains_key(d) {
            continue;
        }
        let mut points: Vec<(f64, f64, bool)> = rows
            .iter()
            .filter(|r| r.draft == *d && r.refused.is_none())
            .map(|r| {
                (
                    r.requested_budget_bytes as f64 / (1 << 20) as f64,
                    r.speedup,
                    r.resident,
                )
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let text = match points.iter().position(|p| p.1 < 1.0 || p.1.is_nan()) {
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
        out.insert(d.clone(), text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(draft: &str, mib: u64, speedup: f64, resident: bool) -> SpecRow {
        SpecRow {
            draft: draft.into(),
            draft_name: None,
            resident,
            budget_bytes: mib << 20,
            requested_budget_bytes: mib << 20,
            draft_bytes: 0,
            refused: None,
            tok_s: 1.0,
            round_tok_s: vec![1.0],
            speedup,
            acceptance_rate: 0.0,
            tokens_per_pass: 1.0,
            tokens_per_pass_by_prompt: BTreeMap::new(),
            streamed_bytes_per_token: 0.0,
            experts_per_block_pass: None,
            greedy_identical: true,
            projected: SpecProjection::None("not run"),
        }
    }

    #[test]
    fn crossover_interpolates_between_the_budgets_around_one() {
        let rows = [
            row("none", 40, 1.0, false),
            row("lookup", 40, 1.5, false),
            row("self", 40, 0.5, false),
            row("none", 80, 1.0, false),
            row("lookup", 80, 0.5, false),
            row("self", 80, f64::NAN, false),
            row("none", 200, 1.0, true),
            row("lookup", 200, 0.4, true),
            row("self", 200, 2.0, true),
        ];
        let c = crossovers(&rows);
        assert_eq!(c.len(), 2, "{c:?}");
        // 1.5 at 40 MiB, 0.5 at 80 MiB: 1.0 halfway.
        assert_eq!(
            c["lookup"],
            "pays up to ~60 MiB (1.50× at 40 MiB, 0.50× at 80 MiB)"
        );
        assert_eq!(c["self"], "does not pay at any budget measured");
        let pays = [row("lookup", 40, 1.2, false), row("lookup", 200, 1.0, true)];
        assert_eq!(
            crossovers(&pays)["lookup"],
            "pays at every budget measured, resident included"
        );
    }

    #[test]
    fn projection_serializes_as_the_report_says() {
        let p = serde_json::to_value(SpecProjection::Projected {
            tok_s: 10.0,
            speedup: 1.5,
        })
        .unwrap();
        assert_eq!(p["label"], "projected");
        assert_eq!(p["board"], BENCH_BOARD);
        assert_eq!(p["model_version"], ork_board::MODEL_VERSION);
        assert_eq!(
            (p["tok_s"].as_f64(), p["speedup"].as_f64()),
            (Some(10.0), Some(1.5))
        );
        let n = serde_json::to_value(SpecProjection::None("not run")).unwrap();
        assert_eq!(n["none"], "not run");
        assert!(n.get("tok_s").is_none() && n.get("model_version").is_none());
    }
}
