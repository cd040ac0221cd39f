//! `ork plan --project --draft D --acceptance A`: the planned schedule of speculative decoding
//! on the board clock (docs/board-model.md). Labelled projected, with the acceptance an input.

use anyhow::{Context, Result};
use ork_runtime::DraftKind;

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
    draft: &DraftKind,
    args: &crate::cmd_project::PlanProject,
    chip: &ork_board::Chip,
) -> Result<SpecEvents> {
    let Some(acceptance) = args.acceptance else {
        anyhow::bail!(
            "--draft needs --acceptance A (the probability that a drafted token is accepted, \
             0..=1): the projection cannot know it; measure it with `ork bench spec`"
        );
    };
    let shape = match draft {
        DraftKind::Lookup => None,
        DraftKind::SelfLayers(None) => anyhow::bail!(
            "--draft self: give the draft's blocks as self:N to project it (the runtime chooses N \
             to fit a device it has; the plan has none)"
        ),
        DraftKind::SelfLayers(Some(n)) => {
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
        DraftKind::Model(path) => {
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
