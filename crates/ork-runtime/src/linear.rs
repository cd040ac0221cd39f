//! The executor's matmul interface served by the device through the weight cache, and the
//! expert figures it counts.

use std::sync::atomic::{AtomicU64, Ordering};

use ork_exec::{ExecError, Linear, WeightId};
use ork_manifest::Manifest;
use ork_residency::DeviceMatmul;

/// The executor's matmul interface served by the device through the weight cache.
///
/// The executor asks by the manifest's [`WeightId`]; the cache numbers the weights of its source
/// in an id space of its own. Each manifest id is resolved to the cache's once, here, when the
/// engine opens (`docs/architecture.md`), so a matmul does no name lookup.
pub struct EngineLinear {
    dm: DeviceMatmul,
    /// Per manifest id: the weight's id in the cache (`None` when the cache's source lacks it:
    /// the call then goes by name, and the cache reports it), its cache key, and whether it is
    /// an expert slice.
    weights: Vec<Resolved>,
    /// MoE expert matmuls, and how many found their expert already in the cache.
    pub(crate) expert_calls: AtomicU64,
    pub(crate) expert_hits: AtomicU64,
}

/// Expert figures of a MoE run (see docs/moe.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Expert matmuls computed.
    pub expert_matmuls: u64,
    /// Of those, how many found their expert resident (pinned, cached or prefetched in time).
    pub expert_hits: u64,
    /// `expert_hits / expert_matmuls`.
    pub expert_hit_rate: f64,
    /// Experts predicted ahead by the speculative prefetch.
    pub predictions: u64,
    /// Predicted ∩ used / used, over the decode steps that had a prediction.
    pub recall: Option<f64>,
}

/// A manifest weight as the cache knows it.
struct Resolved {
    id: Option<WeightId>,
    key: String,
    expert: bool,
}

impl EngineLinear {
    pub(crate) fn new(dm: DeviceMatmul, manifest: &Manifest) -> EngineLinear {
        let weights = manifest
            .weights()
            .iter()
            .map(|w| Resolved {
                id: dm.cache().id(&w.key).ok(),
                key: w.key.clone(),
                expert: w.expert.is_some(),
            })
            .collect();
        EngineLinear {
            dm,
            weights,
            expert_calls: AtomicU64::new(0),
            expert_hits: AtomicU64::new(0),
        }
    }
}

impl EngineLinear {
    /// What the cache knows of manifest weight `weight`.
    fn resolved(&self, weight: WeightId) -> Result<&Resolved, ExecError> {
        self.weights
            .get(weight.index())
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: weight.to_string(),
            })
    }

    /// Count a call of `w` if it is an expert slice, and a hit if it is resident now.
    fn count_expert(&self, w: &Resolved) {
        if w.expert {
            self.expert_calls.fetch_add(1, Ordering::Relaxed);
            if w.id.is_some_and(|id| self.dm.cache().is_resident(id)) {
                self.expert_hits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A weight as [`DeviceMatmul`] takes it: the cache's id, or the name the cache lacks (so its
/// error names it).
enum Key<'a> {
    Id(WeightId),
    Name(&'a str),
}

impl<'a> From<&'a Resolved> for Key<'a> {
    fn from(w: &'a Resolved) -> Self {
        match w.id {
            Some(id) => Key::Id(id),
            None => Key::Name(&w.key),
        }
    }
}

impl ork_residency::WeightKey for Key<'_> {
    fn weight_id(
        &self,
        cache: &ork_residency::WeightCache,
    ) -> Result<WeightId, ork_residency::ResidencyError> {
        match self {
            Key::Id(id) => Ok(*id),
            Key::Name(name) => cache.id(name),
        }
    }
}

impl Linear for EngineLinear {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let w = self.resolved(id)?;
        self.count_expert(w);
        self.dm
            .matmul(Key::from(w), x, m, y)
            .map_err(|e| ExecError::Backend {
                weight: w.key.clone(),
                source: Box::new(e),
            })
    }

    /// Served by [`DeviceMatmul::matmul_many`]: one quantization of `x`, one device batch for
    /// the weights that are resident.
    fn matmul_many(
        &self,
        weights: &[WeightId],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        let resolved = weights
            .iter()
            .map(|&w| self.resolved(w))
            .collect::<Result<Vec<_>, _>>()?;
        for w in &resolved {
            self.count_expert(w);
        }
        let keys: Vec<Key<'_>> = resolved.iter().map(|&w| Key::from(w)).collect();
        self.dm
            .matmul_many(&keys, x, m, ys)
            .map_err(|e| ExecError::Backend {
                weight: resolved
                    .iter()
                    .map(|w| w.key.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                source: Box::new(e),
            })
    }

    /// Forwarded to the prefetcher, which serves announced weights before the plan order.
    fn upcoming(&self, weights: &[WeightId]) {
        let keys: Vec<Key<'_>> = weights
            .iter()
            .filter_map(|&w| self.resolved(w).ok())
            .map(Key::from)
            .collect();
        self.dm.upcoming(&keys);
    }

    /// Kept by the device matmul's board-clock recorder, if any (`docs/board-model.md`).
    fn record(&self, event: ork_board::Event) {
        self.dm.record(event);
    }
}

impl EngineLinear {
    /// The device matmul behind it.
    pub fn device_matmul(&self) -> &DeviceMatmul {
        &self.dm
    }
}
