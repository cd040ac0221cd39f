//! `ork bench spec`'s projected ratios: each configuration's last round, replayed on the board
//! clock's bench board (`ork_runtime::bench::project::BENCH_BOARD`, docs/board-model.md),
//! beside the measured ones. Labelled projected, with the board and the cost model's version.

use anyhow::{Context, Result};
use ork_board::Recorder;
use ork_runtime::bench::project::{bench_decode_s, BENCH_BOARD};
use ork_runtime::Engine;

/// One configuration of the bench, as the projection sees it.
pub struct Measured<'a> {
    /// Its engine (`None`: refused).
    pub engine: Option<&'a Engine>,
    /// Its recording of the last round.
    pub rec: Option<&'a Recorder>,
    /// The budget its row is compared at.
    pub requested: u64,
    /// Resident plan.
    pub resident: bool,
    /// Plain decode (no draft): the baseline of its budget.
    pub plain: bool,
    /// A separate draft model, whose device work the verifier's recording does not hold.
    pub separate_draft: bool,
}

/// Per configuration: projected decode tok/s and speedup over plain decode at the same budget,
/// or why there is none.
pub struct Projected {
    rows: Vec<Result<(f64, f64), &'static str>>,
}

/// Project every configuration; `per_round` tokens were generated in a round.
pub fn project(configs: &[Measured<'_>], per_round: f64) -> Result<Projected> {
    let mut tok_s: Vec<Result<f64, &'static str>> = Vec::with_capacity(configs.len());
    for c in configs {
        tok_s.push(match (c.engine, c.rec) {
            _ if c.separate_draft => Err("a separate draft model's device work is not recorded"),
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
    let rows = configs
        .iter()
        .zip(&tok_s)
        .map(|(c, t)| {
            let t = (*t)?;
            let plain = configs
                .iter()
                .zip(&tok_s)
                .find(|(p, _)| p.plain && p.requested == c.requested && p.resident == c.resident)
                .and_then(|(_, p)| p.ok())
                .ok_or("no plain decode at this budget")?;
            Ok((t, t / plain))
        })
        .collect();
    Ok(Projected { rows })
}

impl Projected {
    /// The `projected` object of row `i` for `--json`.
    pub fn json(&self, i: usize) -> serde_json::Value {
        match self.rows.get(i) {
            Some(Ok((tok_s, speedup))) => serde_json::json!({
                "label": "projected", "board": BENCH_BOARD,
                "model_version": ork_board::MODEL_VERSION,
                "tok_s": tok_s, "speedup": speedup}),
            Some(Err(why)) => serde_json::json!({
                "label": "projected", "board": BENCH_BOARD, "none": why}),
            None => serde_json::Value::Null,
        }
    }

    /// Print the projected speedups beside the measured ones, one line per row of `rows`
    /// (the bench's result rows, in the same order).
    pub fn print(&self, rows: &[serde_json::Value]) {
        println!(
            "projected on {BENCH_BOARD} (board model {}), each configuration's last round replayed; measured on this machine beside it:",
            ork_board::MODEL_VERSION
        );
        for (r, p) in rows.iter().zip(&self.rows) {
            let mode = if r["resident"].as_bool().unwrap_or(false) {
                "resident"
            } else {
                "streamed"
            };
            let head = format!(
                "  {mode:<9} {:>7.0}Mi {:<18}",
                r["requested_budget_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64,
                r["draft"].as_str().unwrap_or("")
            );
            match p {
                Ok((tok_s, speedup)) => println!(
                    "{head} measured {:>5.2}x   projected {speedup:>5.2}x ({tok_s:.1} tok/s projected)",
                    r["speedup"].as_f64().unwrap_or(f64::NAN)
                ),
                Err(why) => println!("{head} not projected: {why}"),
            }
        }
    }
}

/// A speculative plan's events, the passes each replayed pass stands for, the tokens generated,
/// the schedule's label and the draft's name table (for printing the events).
pub struct SpecEvents {
    /// The events.
    pub events: Vec<ork_board::Event>,
    /// Per replayed pass, the passes it stands for.
    pub pass_weights: Vec<f64>,
    /// Tokens generated.
    pub generated: usize,
    /// The schedule's label.
    pub label: String,
    /// The draft's weight names (`None`: a draft with no device weights).
    pub draft_names: Option<std::sync::Arc<ork_manifest::WeightNames>>,
}

/// `ork plan --project --draft D --acceptance A`: the planned schedule of speculative decoding
/// (`ork_board::spec`: a resident draft proposing `--draft-max` tokens, the verifier — `plan` —
/// checking them in one pass of k + 1 rows, each draft accepted with probability A).
pub fn plan_spec(
    model: &ork_gguf::GgufFile,
    verifier: &ork_board::ModelShape,
    plan: &ork_board::Plan,
    draft: &crate::cli::DraftArg,
    args: &crate::cmd_project::PlanProject,
    chip: &ork_board::Chip,
) -> Result<SpecEvents> {
    use crate::cli::DraftArg;
    let Some(acceptance) = args.acceptance else {
        anyhow::bail!(
            "--draft needs --acceptance A (the probability that a drafted token is accepted, \
             0..=1): the projection cannot know it; measure it with `ork bench spec`"
        );
    };
    let shape = match draft {
        DraftArg::Lookup => None,
        DraftArg::SelfLayers(None) => anyhow::bail!(
            "--draft self: give the draft's blocks as self:N to project it (the runtime chooses N \
             to fit a device it has; the plan has none)"
        ),
        DraftArg::SelfLayers(Some(n)) => {
            if *n > verifier.blocks.len() {
                anyhow::bail!(
                    "--draft self:{n}: the model has {} blocks",
                    verifier.blocks.len()
                );
            }
            Some(ork_board::ModelShape {
                blocks: verifier.blocks[..*n].to_vec(),
                ..verifier.clone()
            })
        }
        DraftArg::Model(path) => {
            let gguf = ork_gguf::GgufFile::open(path)
                .with_context(|| format!("--draft {}", path.display()))?;
            let c = ork_exec::ModelConfig::from_gguf(&gguf)
                .with_context(|| format!("--draft {}", path.display()))?;
            // The check `ork run --draft` makes: a draft with another vocabulary is refused.
            let model_tokens = ork_exec::Tokenizer::from_gguf(model).context("the model")?;
            let draft_tokens = ork_exec::Tokenizer::from_gguf(&gguf)
                .with_context(|| format!("--draft {}", path.display()))?;
            ork_exec::check_draft_vocabulary(
                &model_tokens,
                &draft_tokens,
                &path.display().to_string(),
            )
            .with_context(|| format!("--draft {}", path.display()))?;
            let dims = ork_board::Dims {
                n_layer: c.n_layer,
                d_model: c.n_embd,
                ffn: c.n_ff,
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim_k,
                vocab: c.vocab_size,
            };
            let ty = verifier.output.ty;
            Some(ork_board::ModelShape {
                windows: crate::cmd_project::windows(&c),
                ..ork_board::ModelShape::from_dims(&dims, ty, chip)
            })
        }
    };
    let s = ork_board::spec::spec_schedule(
        verifier,
        shape.as_ref(),
        &ork_board::spec::SpecPlan {
            verifier: *plan,
            k: args.draft_max,
            acceptance: f64::from(acceptance),
            seed: 13,
        },
    )?;
    let label = format!(
        "speculative: draft {}, {} drafts per verifier pass, acceptance {acceptance} per draft \
         (an input, not measured), drawn independently from a fixed seed",
        draft.label(),
        args.draft_max
    );
    Ok(SpecEvents {
        events: s.events,
        pass_weights: s.pass_weights,
        generated: s.generated,
        label,
        draft_names: shape.map(|d| d.names),
    })
}
