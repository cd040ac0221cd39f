//! The executor's matmul interface served by the device through the weight cache, and the
//! expert figures it counts.

use std::sync::atomic::{AtomicU64, Ordering};

use ork_exec::{ExecError, Linear};
use ork_residency::DeviceMatmul;

/// The executor's matmul interface served by the device through the weight cache.
pub struct EngineLinear {
    dm: DeviceMatmul,
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

impl EngineLinear {
    pub(crate) fn new(dm: DeviceMatmul) -> EngineLinear {
        EngineLinear {
            dm,
            expert_calls: AtomicU64::new(0),
            expert_hits: AtomicU64::new(0),
        }
    }
}

impl EngineLinear {
    /// Count a call of `weight` if it is an expert slice, and a hit if it is resident now.
    fn count_expert(&self, weight: &str) {
        if ork_manifest::is_expert_key(weight) {
            self.expert_calls.fetch_add(1, Ordering::Relaxed);
            if self.dm.cache().is_resident(weight) {
                self.expert_hits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Linear for EngineLinear {
    fn matmul(&self, weight: &str, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.count_expert(weight);
        self.dm
            .matmul(weight, x, m, y)
            .map_err(|e| ExecError::Backend {
                weight: weight.to_owned(),
                source: Box::new(e),
            })
    }

    /// Served by [`DeviceMatmul::matmul_many`]: one quantization of `x`, one device batch for
    /// the weights that are resident.
    fn matmul_many(
        &self,
        weights: &[&str],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        for w in weights {
            self.count_expert(w);
        }
        self.dm
            .matmul_many(weights, x, m, ys)
            .map_err(|e| ExecError::Backend {
                weight: weights.join(","),
                source: Box::new(e),
            })
    }

    /// Forwarded to the prefetcher, which serves announced weights before the plan order.
    fn upcoming(&self, weights: &[&str]) {
        self.dm.upcoming(weights);
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
