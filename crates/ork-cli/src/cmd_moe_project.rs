//! `ork plan --project` on a Mixture-of-Experts model: the board clock's MoE schedule
//! (`ork_board::moe`, docs/board-model.md) for the model's shapes — a device expert cache,
//! experts loaded on demand, once their router has run, or speculatively a block ahead — replayed
//! on the board. Every figure is projected; routing is uniform at random, the recall an input.

use std::path::Path;

use anyhow::{bail, Result};
use ork_board::moe::{moe_schedule, ExpertPrefetch, MoeDims, MoePlan};
use ork_board::{replay_warm, Board, Projection, ReplayOptions, WeightType};
use ork_pack::PackDtype;
use ork_residency::{Mode, Plan as Placement};

use crate::cmd_project::PlanProject;

/// The projection of the MoE model at `path` (config `c`) planned as `plan`.
pub fn project_moe(
    path: &Path,
    c: &ork_exec::ModelConfig,
    plan: &Placement,
    board: &Board,
    args: &PlanProject,
    dtype: PackDtype,
) -> Result<Projection> {
    let Some(moe) = &c.moe else {
        bail!(
            "{}: the manifest has experts but the configuration no expert count",
            path.display()
        );
    };
    if let Some(n) = moe.n_ff_shexp {
        bail!(
            "{}: a shared expert (FFN {n}) is not in the board clock's MoE schedule (routed \
             experts only); projecting without it would understate every token",
            path.display()
        );
    }
    if args.draft.is_some() {
        bail!("--draft: the board clock's speculative schedule is for dense models");
    }
    let dims = MoeDims {
        n_layer: c.n_layer,
        d_model: c.n_embd,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim_k,
        n_expert: moe.n_expert,
        top_k: moe.n_expert_used,
        expert_ffn: moe.n_ff_exp,
        vocab: c.vocab_size,
    };
    let ty = match dtype {
        PackDtype::I8 => WeightType::Int8,
        PackDtype::I4 => WeightType::Int4,
        PackDtype::F16 => WeightType::Fp16,
    };
    let all = dims.n_layer * dims.n_expert;
    let cache_experts = match args.expert_cache {
        Some(n) => n.min(all),
        None if plan.mode == Mode::Resident => all,
        None => (plan.pinned_expert_bytes / dims.expert_bytes(ty).max(1)) as usize,
    };
    let (prefetch, how) = match (args.no_prefetch, args.no_speculate, args.expert_recall) {
        (true, _, _) => (ExpertPrefetch::OnDemand, "on demand".to_owned()),
        (false, _, Some(r)) => (
            ExpertPrefetch::Speculative {
                recall: f64::from(r),
            },
            format!("speculative, recall {r} (an input, not measured)"),
        ),
        (false, true, None) => (ExpertPrefetch::Router, "router-driven".to_owned()),
        (false, false, None) => (
            ExpertPrefetch::Router,
            "router-driven (give --expert-recall R to project speculative prefetch)".to_owned(),
        ),
    };
    let mplan = MoePlan {
        ty,
        prefetch,
        cache_experts,
        prompt_tokens: args.prompt_tokens as usize,
        gen_tokens: args.gen_tokens as usize,
        kv_bytes: 2,
        seed: 28,
    };
    let s = moe_schedule(&dims, &mplan, &board.chip)?;
    let mut timeline = replay_warm(
        &s.events,
        board,
        ReplayOptions {
            preload: false,
            device_bytes: s.device_bytes as f64,
            prefetch_slots: None,
        },
        Some(&s.warm),
    )?;
    // At most `DECODE_PASSES_REPLAYED` decode passes were scheduled, each standing for its share.
    timeline.weigh_passes(&s.pass_weights);
    let mut p = Projection::new(
        &timeline,
        board,
        args.prompt_tokens as usize,
        args.gen_tokens as usize,
    );
    p.schedule = Some(format!(
        "MoE: {} of {all} experts in the device cache, expert loads {how}; routing uniform at \
         random (real routers are skewed: a cache hits more often)",
        s.cache_experts
    ));
    Ok(p)
}
