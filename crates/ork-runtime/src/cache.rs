//! The model's weight cache on the device, and the device matmul that serves sessions from it
//! (prefetch when the plan streams, warmup when it is resident, the trace).

use std::sync::Arc;

use ork_device::Device;
use ork_exec::Model;
use ork_manifest::Manifest;
use ork_residency::{
    plan::domain_map, CacheConfig, DeviceBudget, DeviceMatmul, LayerOrder, Mode, Plan, Trace,
    WeightCache, WeightSource,
};

use crate::{EngineConfig, EngineLinear, RuntimeError};

/// A cache on `device` of `budget` bytes per domain, booked in `device_budget`.
pub(crate) fn budgeted_cache(
    device: &Arc<dyn Device>,
    source: WeightSource,
    budget: u64,
    domains: u32,
    device_budget: &Arc<DeviceBudget>,
) -> Result<WeightCache, RuntimeError> {
    let cache_config = CacheConfig {
        domains,
        ..CacheConfig::new(budget)
    };
    Ok(WeightCache::with_budget(
        Arc::clone(device),
        source,
        cache_config,
        Arc::clone(device_budget),
    )?)
}

/// The model's weight cache on `device`, placed and pinned as `plan` says, and the device's one
/// budget it is booked in.
pub(crate) fn model_cache(
    device: &Arc<dyn Device>,
    source: WeightSource,
    plan: &Plan,
    manifest: &Manifest,
    model: &Model,
    budget: u64,
    domains: u32,
) -> Result<(Arc<WeightCache>, Arc<DeviceBudget>), RuntimeError> {
    // The device's one budget: a second cache on this device (a draft model, an expert
    // cache) books its weights in the same ledger.
    let device_budget = DeviceBudget::new(budget, domains);
    let cache = budgeted_cache(device, source, budget, domains, &device_budget)?
        .with_placement(domain_map(plan, manifest)?);
    // MoE: streamed experts are evicted by block order (the block just computed first), not
    // LRU, which would evict the experts of the blocks about to run (docs/moe.md).
    let cache = if manifest.n_expert() > 0 {
        cache.with_policy(Box::new(LayerOrder {
            n_layer: model.config().n_layer,
        }))
    } else {
        cache
    };
    for p in plan.pinned() {
        cache.pin(&p.name)?;
    }
    let cache = Arc::new(cache);
    device_budget.register(&cache);
    Ok((cache, device_budget))
}

/// The matmul backend sessions use: the device matmul over `cache`, with the prefetch thread
/// when the plan streams and the first-pass loader when it is resident (if the config
/// prefetches), recording into `trace`.
pub(crate) fn model_linear(
    config: &EngineConfig,
    cache: &Arc<WeightCache>,
    plan: &Plan,
    slots: usize,
    trace: Option<Arc<Trace>>,
    model: &Model,
) -> EngineLinear {
    // Experts are not in the static order: a token uses only those its router picks, and
    // the executor announces them (Linear::upcoming) once the router has run.
    // Names resolved to the manifest's ids once, here; a name the manifest lacks is left out
    // of the schedules (compute then reports it when it asks for that weight).
    let schedule = (config.prefetch && plan.mode == Mode::Streamed).then(|| {
        (
            plan.placement
                .iter()
                .filter_map(|p| cache.id(&p.name).ok())
                .filter(|&id| model.manifest().get(id).expert.is_none())
                .collect::<Vec<_>>(),
            slots,
        )
    });
    cache.set_trace(trace.clone());
    let mut dm =
        DeviceMatmul::new(Arc::clone(cache), schedule).with_activations(config.activations);
    if let Some(t) = &trace {
        dm = dm.with_trace(Arc::clone(t));
    }
    // Resident: the first pass's loads run on a thread of their own, ahead of compute,
    // instead of one by one on the compute path (`ork_residency::Warmup`).
    if config.prefetch && plan.mode == Mode::Resident {
        dm = dm.with_warmup(
            plan.placement
                .iter()
                .filter_map(|p| cache.id(&p.name).ok())
                .collect(),
        );
    }
    EngineLinear::new(dm, model.manifest())
        .dense_only(config.device_weights == crate::DeviceWeights::Dense)
}
