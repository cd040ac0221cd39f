//! The residency plan: device bytes of every weight, and the model planned beside its draft
//! within the budget and the window.

use ork_device::EmuConfig;
use ork_manifest::{Manifest, WeightId};
use ork_pack::PackDtype;
use ork_residency::{device_bytes, Plan, PlanInput};

use crate::draft::DraftReservation;
use crate::{EngineConfig, RuntimeError};

/// Prefetch slots of the default emulated device (`cores + 1`), for planning without a device.
pub fn default_slots() -> usize {
    EmuConfig::default().cores as usize + 1
}

/// Plan `manifest`'s weights (execution order, device bytes at `dtype`, or what
/// [`ork_store::weight_quant`] makes of it with `group`) for a budget and window per domain,
/// `domains` domains and `slots` prefetch slots.
pub fn plan_weights(
    manifest: &Manifest,
    dtype: PackDtype,
    group: ork_pack::ScaleGroup,
    budget: u64,
    window: u64,
    domains: u32,
    slots: usize,
) -> Result<Plan, RuntimeError> {
    let weights = weight_bytes(manifest, dtype, group)?;
    Ok(plan_of(manifest, &weights, budget, window, domains, slots))
}

/// [`plan_weights`] of the dense (non-expert) weights alone: what the device holds for a
/// dense-only split ([`crate::DeviceWeights::Dense`]); every weight of a dense model.
pub fn plan_dense_weights(
    manifest: &Manifest,
    dtype: PackDtype,
    group: ork_pack::ScaleGroup,
    budget: u64,
    window: u64,
    domains: u32,
    slots: usize,
) -> Result<Plan, RuntimeError> {
    let weights = device_weights(
        manifest,
        weight_bytes(manifest, dtype, group)?,
        crate::DeviceWeights::Dense,
    );
    Ok(plan_of(manifest, &weights, budget, window, domains, slots))
}

/// The residency plan of `weights` (by id, with their device bytes) for a budget and window per
/// domain, `domains` domains and `slots` prefetch slots.
fn plan_of(
    manifest: &Manifest,
    weights: &[(WeightId, u64)],
    budget: u64,
    window: u64,
    domains: u32,
    slots: usize,
) -> Plan {
    ork_residency::plan(&PlanInput {
        weights: named(manifest, weights),
        budget_bytes: budget,
        window_bytes: window,
        domains,
        slots,
    })
}

/// Of `weights` (by id, with their device bytes), those the device holds as `which` says.
pub(crate) fn device_weights(
    manifest: &Manifest,
    weights: Vec<(WeightId, u64)>,
    which: crate::DeviceWeights,
) -> Vec<(WeightId, u64)> {
    match which {
        crate::DeviceWeights::All => weights,
        crate::DeviceWeights::Dense => weights
            .into_iter()
            .filter(|&(id, _)| manifest.get(id).expert.is_none())
            .collect(),
    }
}

/// `weights` by name, for the planner: its plan is for people (`ork plan`) and names them.
fn named(manifest: &Manifest, weights: &[(WeightId, u64)]) -> Vec<(String, u64)> {
    weights
        .iter()
        .map(|&(id, bytes)| (manifest.get(id).key.clone(), bytes))
        .collect()
}

/// Device bytes of every matmul weight of `manifest` at `dtype`, by id, in execution order.
pub(crate) fn weight_bytes(
    manifest: &Manifest,
    dtype: PackDtype,
    group: ork_pack::ScaleGroup,
) -> Result<Vec<(WeightId, u64)>, RuntimeError> {
    let mut weights = Vec::new();
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice).map_err(|source| RuntimeError::Plan {
            model: manifest.file().to_path_buf(),
            source,
        })?;
        weights.push((
            w.id,
            device_bytes(&ork_pack::TiledLayout::new(
                ork_store::weight_quant(&w.key, dtype, group).0,
                k,
                n,
            )),
        ));
    }
    Ok(weights)
}

/// Plan the model's weights `all` (execution order, device bytes) beside `draft`: the draft's
/// resident bytes come out of the budget and the window first, and a self draft's weights (the
/// model's own) are pinned in domain 0, in execution order.
///
/// # Errors
/// [`RuntimeError::DraftTooLarge`] when the draft leaves no room for the model's largest
/// remaining weight, [`RuntimeError::BudgetTooSmall`] when the budget cannot hold the largest
/// weight.
pub(crate) fn plan_beside_draft(
    config: &EngineConfig,
    all: &[(WeightId, u64)],
    draft: &DraftReservation,
    budget: u64,
    window_bytes: u64,
    domains: u32,
    slots: usize,
) -> Result<Plan, RuntimeError> {
    let capacity = budget.min(window_bytes);
    let draft_bytes = draft.bytes;
    let manifest = draft.manifest();
    let rest: Vec<(WeightId, u64)> = all.iter().filter(|w| !draft.holds(w.0)).copied().collect();
    if draft_bytes > 0 {
        let largest = rest.iter().map(|w| w.1).max().unwrap_or(0);
        if draft_bytes + largest > capacity {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            return Err(RuntimeError::DraftTooLarge {
                model: config.model.clone(),
                draft: draft.label(),
                draft_mib: mib(draft_bytes),
                model_min_mib: mib(largest),
                budget_mib: budget >> 20,
                need_mib: (draft_bytes + largest).div_ceil(1 << 20),
            });
        }
    }
    let mut plan = ork_residency::plan(&PlanInput {
        weights: named(manifest, &rest),
        budget_bytes: budget - draft_bytes,
        window_bytes: window_bytes.saturating_sub(draft_bytes),
        domains,
        slots,
    });
    if !draft.weights.is_empty() {
        // A self draft's weights are the model's own: pinned in domain 0, in execution order.
        let mut planned = std::mem::take(&mut plan.placement).into_iter();
        for &(id, bytes) in all {
            if draft.holds(id) {
                plan.placement.push(ork_residency::Placement {
                    name: manifest.get(id).key.clone(),
                    bytes,
                    domain: 0,
                    resident: true,
                });
            } else if let Some(p) = planned.next() {
                plan.placement.push(p);
            }
        }
        plan.model_bytes += draft_bytes;
        plan.resident_bytes += draft_bytes;
    }
    if !plan.runnable {
        return Err(RuntimeError::BudgetTooSmall {
            model: config.model.clone(),
            budget_mib: budget >> 20,
            weight: plan.largest.0.clone(),
            weight_mib: plan.largest.1 as f64 / (1 << 20) as f64,
            min_mib: plan.min_budget_bytes.div_ceil(1 << 20),
        });
    }
    Ok(plan)
}
