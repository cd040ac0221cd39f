//! `--project BOARD`: the board clock (`ork-board`, `docs/board-model.md`) on `ork run` (the
//! run's own event stream, replayed) and `ork plan` (the planned schedule, without running).
//! Every figure is labelled projected.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use ork_board::{
    replay, schedule_sampled, Board, EventNames, ModelShape, Projection, Recorder, ReplayOptions,
    ShapeWeight, WeightType,
};
use ork_pack::{PackDtype, ScaleGroup, TiledLayout};
use ork_residency::{Mode, Plan as Placement};
use ork_runtime::Engine;

/// `ork run --project`.
#[derive(Args, Debug, Clone, Default)]
pub struct RunProject {
    /// Project the run's cost on a board: a preset (`orangepi5-16g`, `rock5b-16g`, …), a chip
    /// (`rk3588`, `rk3576`) or a board description file (`.json`); the run's own event stream
    /// is replayed on the board's cost model (docs/board-model.md). Unknown names list the
    /// known ones (exit 2).
    #[arg(long, value_name = "BOARD|CHIP|FILE")]
    pub project: Option<String>,
}

/// `ork plan --project`.
#[derive(Args, Debug, Clone, Default)]
pub struct PlanProject {
    /// Project the planned schedule's cost on a board (without running; only shapes matter):
    /// a preset, a chip or a board file; without a value, the `--soc` chip.
    #[arg(long, value_name = "BOARD|CHIP|FILE", num_args = 0..=1, default_missing_value = "")]
    pub project: Option<String>,
    /// Prompt tokens of the projected run.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub prompt_tokens: u64,
    /// Generated tokens of the projected run (the first comes from the prefill).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub gen_tokens: u64,
    /// Project speculative decoding with this draft, as `ork run --draft` takes it: `lookup`
    /// (no device time), `self:N` (the model's first N blocks) or a draft GGUF (resident).
    #[arg(long, requires = "project", value_parser = crate::cli::parse_draft)]
    pub draft: Option<ork_runtime::DraftKind>,
    /// Draft tokens per verifier pass (`ork run --draft-max`).
    #[arg(long, requires = "draft", default_value_t = crate::cli::DEFAULT_DRAFT_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub draft_max: usize,
    /// Probability that a drafted token is accepted, an input (measure it with `ork bench
    /// spec`; the projection does not know it).
    #[arg(long, requires = "draft", value_parser = crate::cli::parse_unit)]
    pub acceptance: Option<f32>,
    /// As `ork run --no-prefetch`: no prefetch thread (every streamed weight, and a MoE model's
    /// experts, loaded on demand by compute).
    #[arg(long, requires = "project")]
    pub no_prefetch: bool,
    /// As `ork run --no-speculate`, MoE models: experts prefetched only once their block's
    /// router has run.
    #[arg(long, requires = "project", conflicts_with = "expert_recall")]
    pub no_speculate: bool,
    /// MoE models: project speculative expert prefetch (the next block's experts predicted when
    /// a router has run) with this recall, the fraction of the next block's experts the
    /// prediction holds (0..=1), an input; without it, router-driven prefetch is projected.
    #[arg(long, requires = "project", value_parser = crate::cli::parse_unit)]
    pub expert_recall: Option<f32>,
    /// MoE models: experts the device cache holds (all blocks together; default: the experts the
    /// plan keeps resident).
    #[arg(long, requires = "project")]
    pub expert_cache: Option<usize>,
}

/// The board `--project` names, resolved before anything is loaded (`None` without the flag);
/// an empty name means `soc`. A board file is read under the input rule every file ork reads
/// whole follows (`ork_io::input::read_input`: a regular file, opened without blocking, its
/// size checked before reading, at most [`ork_board::BOARD_FILE_LIMIT`] bytes).
pub fn board(project: Option<&str>, soc: &str) -> Result<Option<Board>> {
    let Some(name) = project else {
        return Ok(None);
    };
    let name = if name.is_empty() { soc } else { name };
    named_board("--project", name).map(Some)
}

/// The board `flag` names (a preset, a chip or a board file, read as [`board`] reads it); an
/// error names the flag.
pub fn named_board(flag: &str, name: &str) -> Result<Board> {
    let board = if Board::names_file(name) {
        let path = Path::new(name);
        let bytes = ork_io::input::read_input(path, ork_board::BOARD_FILE_LIMIT)
            .with_context(|| flag.to_owned())?;
        Board::from_bytes(&path.display().to_string(), &bytes)
    } else {
        Board::named(name)
    };
    board.with_context(|| flag.to_owned())
}

/// The NPU's board and the CPU engine's for the board `flag` names: a CPU-only preset
/// (`pi5-16g`) has no NPU board; an error names the flag.
pub fn boards_named(
    flag: &str,
    name: &str,
) -> Result<(Option<Board>, Option<ork_board::cpu::CpuBoard>)> {
    use ork_board::cpu::{CpuBoard, FITTED_CPU};
    if let Some(cpu) = CpuBoard::cpu_only(name, &FITTED_CPU) {
        return Ok((None, Some(cpu)));
    }
    let board = named_board(flag, name)?;
    let cpu = CpuBoard::of(&board, &FITTED_CPU);
    Ok((Some(board), cpu))
}

/// Start recording `engine`'s events when projecting (device engines only: the CPU engine
/// records no device work).
pub fn record(engine: &Engine, board: &Option<Board>) -> Option<Arc<Recorder>> {
    ork_runtime::bench::project::record(engine, board.as_ref())
}

/// The projection of the recorded run.
pub fn project_run(
    engine: &Engine,
    board: Option<&Board>,
    rec: Option<&Arc<Recorder>>,
    prompt_tokens: usize,
    generated: usize,
) -> Result<Option<Projection>> {
    let (Some(board), Some(rec)) = (board, rec) else {
        return Ok(None);
    };
    let events = rec.events();
    // Only the engine's model records (a self draft's weights are the model's own).
    let names = EventNames {
        target: engine.manifest().names(),
        draft: None,
    };
    dump(&events, names)?;
    let timeline = replay(
        &events,
        board,
        // Weights loaded once (a resident plan's, a streamed plan's pinned ones) are the
        // model's load, before the prompt.
        ork_runtime::bench::project::run_options(engine, true),
    )?;
    Ok(Some(Projection::new(
        &timeline,
        board,
        prompt_tokens,
        generated,
    )))
}

/// The projection of `plan` for the model at `path` (its manifest `manifest`), its weights of
/// `quant` = (dtype, scale groups, chip), with `(slots, budget)` of a streamed plan.
pub fn project_plan(
    path: &Path,
    manifest: &ork_manifest::Manifest,
    plan: &Placement,
    board: &Board,
    args: &PlanProject,
    (dtype, group, soc): (PackDtype, ScaleGroup, ork_device::Soc),
    (slots, budget): (usize, u64),
) -> Result<Projection> {
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let c =
        ork_exec::ModelConfig::from_gguf(&gguf).with_context(|| format!("{}", path.display()))?;
    let slots = if args.no_prefetch { 0 } else { slots };
    check_context(args, c.context_length, path)?;
    if manifest.n_expert() > 0 {
        return crate::cmd_moe_project::project_moe(path, &c, plan, board, args, dtype);
    }
    let shape = plan_shape(path, &c, manifest, plan, (dtype, group, soc))?;
    let resident = plan.mode == Mode::Resident;
    let sched = ork_board::Plan {
        resident,
        slots,
        budget_bytes: budget,
        prompt_tokens: args.prompt_tokens as usize,
        gen_tokens: args.gen_tokens as usize,
        kv_bytes: 2,
    };
    // Plain and speculative decode replay at most `DECODE_PASSES_REPLAYED` decode passes (or
    // rounds), each standing for its share: the plan's memory does not grow with `--gen-tokens`.
    let (events, weights, generated, label, draft_names) = match &args.draft {
        None => {
            let (events, weights) = schedule_sampled(&shape, &sched)?;
            (events, weights, args.gen_tokens as usize, None, None)
        }
        Some(d) => {
            let s =
                crate::cmd_spec_project::plan_spec(&gguf, &shape, &sched, d, args, &board.chip)?;
            let (e, w, g) = (s.events, s.pass_weights, s.generated);
            (e, w, g, Some(s.label), s.draft_names)
        }
    };
    let names = EventNames {
        target: &shape.names,
        draft: draft_names.as_deref(),
    };
    dump(&events, names)?;
    let device_bytes = if resident {
        shape.total_bytes()
    } else {
        budget * u64::from(plan.domains_used.max(1))
    };
    let mut timeline = replay(
        &events,
        board,
        ReplayOptions {
            preload: true,
            device_bytes: device_bytes as f64,
            // The prefetcher's rule, as the run's replay applies it.
            prefetch_slots: (!resident && slots > 0).then_some(slots),
        },
    )?;
    timeline.weigh_passes(&weights);
    let mut p = Projection::new(&timeline, board, args.prompt_tokens as usize, generated);
    p.schedule = label;
    Ok(p)
}

/// The board clock's shape of the model: its blocks' seven matmul weights and its output
/// projection, each with the bytes and domain `plan` placed it at and its device calls on the
/// chip.
fn plan_shape(
    path: &Path,
    c: &ork_exec::ModelConfig,
    manifest: &ork_manifest::Manifest,
    plan: &Placement,
    (dtype, group, soc): (PackDtype, ScaleGroup, ork_device::Soc),
) -> Result<ModelShape> {
    // The plan names its weights (it is for people); the shape keys them by the manifest's ids.
    let placed: HashMap<ork_manifest::WeightId, (u64, u32, bool)> = plan
        .placement
        .iter()
        .filter_map(|p| Some((manifest.id(&p.name)?, (p.bytes, p.domain, p.resident))))
        .collect();
    let ty = match dtype {
        PackDtype::I8 => WeightType::Int8,
        PackDtype::I4 => WeightType::Int4,
        PackDtype::F16 => WeightType::Fp16,
    };
    let mut blocks: Vec<Vec<ShapeWeight>> = Vec::new();
    let mut output = None;
    for w in manifest.execution_order() {
        let (bytes, domain, pinned) = placed.get(&w.id).copied().unwrap_or((0, 0, false));
        let layout = TiledLayout::new(dtype, w.k, w.n);
        let calls = ork_device::split::split(&layout, group, soc)
            .or_else(|_| ork_device::split::split(&layout, ScaleGroup::PerChannel, soc))
            .map(|p| p.len())
            .with_context(|| format!("{}: splitting '{}'", path.display(), w.key))?;
        let sw = ShapeWeight {
            id: w.id,
            k: w.k,
            n: w.n,
            ty,
            bytes: if bytes > 0 {
                bytes
            } else {
                layout.blob_bytes() as u64
            },
            domain,
            calls: calls as u32,
            pinned: pinned && plan.mode == Mode::Streamed,
        };
        match w.layer {
            Some(l) => {
                let l = l as usize;
                if blocks.len() <= l {
                    blocks.resize_with(l + 1, Vec::new);
                }
                blocks[l].push(sw);
            }
            None => output = Some(sw),
        }
    }
    let blocks = blocks
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            <[ShapeWeight; 7]>::try_from(b).map_err(|b| {
                anyhow::anyhow!(
                    "{}: block {i} has {} matmul weights; the board clock's plan projection \
                     models blocks of q, k, v, o, gate, up, down",
                    path.display(),
                    b.len()
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelShape {
        d_model: c.n_embd,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim_k,
        vocab: c.vocab_size,
        blocks,
        output: output.with_context(|| format!("{}: no output projection", path.display()))?,
        windows: windows(c),
        names: Arc::new(manifest.names().clone()),
    })
}

/// The projected run within the model's context, as `ork run` holds a prompt and `-n` to it:
/// `--prompt-tokens` + `--gen-tokens` at most `context` (a million-token prompt projected a
/// TTFT of 2,160,208,021 ms on a model of 8,192 positions).
fn check_context(args: &PlanProject, context: usize, path: &Path) -> Result<()> {
    let (prompt, gen) = (args.prompt_tokens, args.gen_tokens);
    if prompt.saturating_add(gen) > context as u64 {
        anyhow::bail!(
            "--prompt-tokens {prompt} and --gen-tokens {gen} need {} positions, but the context \
             of {} is {context} tokens",
            prompt.saturating_add(gen),
            path.display()
        );
    }
    Ok(())
}

/// Per block, the keys a sliding-window layer's query sees (Gemma 3's local layers), as the
/// executor attends them.
pub fn windows(c: &ork_exec::ModelConfig) -> Vec<Option<usize>> {
    c.gemma3.as_ref().map_or_else(Vec::new, |g| {
        g.local.iter().map(|&l| g.window.filter(|_| l)).collect()
    })
}

/// With `ORK_BOARD_EVENTS=FILE`, write the event stream replayed (one JSON array, its weights
/// named from `names`), to compare a run's stream with the plan's.
fn dump(events: &[ork_board::Event], names: EventNames<'_>) -> Result<()> {
    if let Some(path) = std::env::var_os("ORK_BOARD_EVENTS") {
        let json = serde_json::to_vec(&names.named(events))?;
        // Under the rule for every file ork writes (docs/cli.md): never over a model or a pack.
        ork_io::output::write_output(Path::new(&path), &json, &[]).context("ORK_BOARD_EVENTS")?;
    }
    Ok(())
}
