//! The executor's matmul interface served by the device through the weight cache, and the
//! expert figures it counts.

use std::sync::atomic::{AtomicU64, Ordering};

use ork_exec::{ExecError, Linear, WeightId};
use ork_manifest::Manifest;
use ork_residency::DeviceMatmul;

/// The executor's matmul interface served by the device through the weight cache.
///
/// The executor, the cache and the plan share one id space, the manifest's [`WeightId`]
/// (`docs/architecture.md`): a matmul passes its id straight to the cache, with no lookup. Beside
/// that it counts expert matmuls and how many found their expert resident.
pub struct EngineLinear {
    dm: DeviceMatmul,
    /// Per manifest id: whether the weight is an expert slice.
    expert: Vec<bool>,
    /// MoE expert matmuls, and how many found their expert already in the cache.
    pub(crate) expert_calls: AtomicU64,
    pub(crate) expert_hits: AtomicU64,
    /// The device holds only the dense weights ([`crate::DeviceWeights::Dense`]): an expert
    /// slice asked of it is an error, never loaded.
    dense_only: bool,
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

impl EngineLinear {
    pub(crate) fn new(dm: DeviceMatmul, manifest: &Manifest) -> EngineLinear {
        EngineLinear {
            dm,
            expert: manifest
                .weights()
                .iter()
                .map(|w| w.expert.is_some())
                .collect(),
            expert_calls: AtomicU64::new(0),
            expert_hits: AtomicU64::new(0),
            dense_only: false,
        }
    }

    /// The device holds only the dense weights: asking it for an expert slice is an error.
    pub(crate) fn dense_only(mut self, dense_only: bool) -> EngineLinear {
        self.dense_only = dense_only;
        self
    }

    /// Whether weight `id` is an expert slice.
    fn is_expert(&self, id: WeightId) -> bool {
        self.expert.get(id.index()).copied().unwrap_or(false)
    }

    /// Refuse an expert slice on a dense-only device, before anything is loaded.
    fn check_held(&self, id: WeightId) -> Result<(), ExecError> {
        if self.dense_only && self.is_expert(id) {
            return Err(ExecError::Backend {
                weight: self.name(id),
                source: Box::new(crate::RuntimeError::Phases {
                    what: "the device holds only the dense weights: a MoE's experts are \
                           computed on the CPU engine"
                        .to_owned(),
                }),
            });
        }
        Ok(())
    }

    /// Count a call of `id` if it is an expert slice, and a hit if it is resident now.
    fn count_expert(&self, id: WeightId) {
        if self.is_expert(id) {
            self.expert_calls.fetch_add(1, Ordering::Relaxed);
            if self.dm.cache().is_resident(id) {
                self.expert_hits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The weight's name, for an error.
    fn name(&self, id: WeightId) -> String {
        self.dm
            .cache()
            .name(id)
            .map_or_else(|| id.to_string(), |n| n.to_string())
    }
}

impl Linear for EngineLinear {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.check_held(id)?;
        self.count_expert(id);
        self.dm.matmul(id, x, m, y).map_err(|e| ExecError::Backend {
            weight: self.name(id),
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
        for &w in weights {
            self.check_held(w)?;
        }
        for &w in weights {
            self.count_expert(w);
        }
        self.dm
            .matmul_many(weights, x, m, ys)
            .map_err(|e| ExecError::Backend {
                weight: weights
                    .iter()
                    .map(|&w| self.name(w))
                    .collect::<Vec<_>>()
                    .join(","),
                source: Box::new(e),
            })
    }

    /// Forwarded to the prefetcher, which serves announced weights before the plan order.
    /// A dense-only device is never told of an expert slice (it would load it).
    fn upcoming(&self, weights: &[WeightId]) {
        if self.dense_only {
            let held: Vec<WeightId> = weights
                .iter()
                .copied()
                .filter(|&w| !self.is_expert(w))
                .collect();
            self.dm.upcoming(&held);
        } else {
            self.dm.upcoming(weights);
        }
    }

    /// Kept by the device matmul's board-clock recorder, if any (`docs/board-model.md`).
    fn record(&self, event: ork_board::Event) {
        self.dm.record(event);
    }
}

impl EngineLinear {
    /// Rows `rows` of weight `id` on the device, the rest left to another engine (the decode
    /// row split, [`crate::SplitLinear`]; [`DeviceMatmul::matmul_rows`]).
    pub(crate) fn matmul_rows(
        &self,
        id: WeightId,
        rows: std::ops::Range<usize>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        self.check_held(id)?;
        self.count_expert(id);
        self.dm
            .matmul_rows(id, rows, x, m, y)
            .map_err(|e| ExecError::Backend {
                weight: self.name(id),
                source: Box::new(e),
            })
    }

    /// The device matmul behind it.
    pub fn device_matmul(&self) -> &DeviceMatmul {
        &self.dm
    }
}
