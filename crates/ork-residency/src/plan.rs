//! Placement: keep the whole model resident across IOMMU domains when it fits, else stream it
//! through the budgeted cache with as much as possible pinned.
//!
//! Resident placement fills domains with *consecutive* weights in execution order, so a forward
//! pass visits domain 0, then 1, … once each: `d` domains cost `d` switches per token (the last
//! switch returns to domain 0 for the next token), one domain costs none. Streaming keeps a
//! working set of `slots + 1` weights (the prefetch slots plus the one computing) and pins, in
//! execution order, every weight that still fits beside it; the rest is copied in on every
//! forward pass.
//!
//! Mixture-of-Experts models (expert slices named `TENSOR#EXPERT`, docs/moe.md): a token uses
//! only the experts its router picks, so streaming pins every non-expert weight first
//! (attention, routers, shared experts, the output projection), then experts in execution order
//! with what is left; the other experts are loaded when a router picks them.

use ork_device::DomainId;
use ork_manifest::is_expert_key;
use serde::Serialize;

/// How the model's weights live on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every weight resident; no per-token weight traffic.
    Resident,
    /// Some weights streamed through the cache on every forward pass.
    Streamed,
}

/// What the planner needs to know.
#[derive(Clone, Debug)]
pub struct PlanInput {
    /// Matmul weights in execution order with their device bytes.
    pub weights: Vec<(String, u64)>,
    /// Weight budget per domain in bytes.
    pub budget_bytes: u64,
    /// Usable bytes of one domain's window.
    pub window_bytes: u64,
    /// Domains available.
    pub domains: u32,
    /// Prefetch slots (cores + 1).
    pub slots: usize,
}

/// One weight's placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Tensor name.
    pub name: String,
    /// Device bytes.
    pub bytes: u64,
    /// Domain it lives in.
    pub domain: u32,
    /// Whether it stays resident (never evicted).
    pub resident: bool,
}

/// The plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Resident or streamed.
    pub mode: Mode,
    /// Per weight, in execution order.
    pub placement: Vec<Placement>,
    /// Sum of all weights' device bytes.
    pub model_bytes: u64,
    /// Bytes that stay resident.
    pub resident_bytes: u64,
    /// Domains holding weights.
    pub domains_used: u32,
    /// Domain switches per forward pass (per decoded token; once for a whole prefill).
    pub switches_per_pass: u32,
    /// Weight bytes copied into the device per forward pass (per decoded token).
    pub streamed_bytes_per_pass: u64,
    /// Largest single weight and its bytes.
    pub largest: (String, u64),
    /// Bytes of Mixture-of-Experts expert slices (0 for a dense model).
    pub expert_bytes: u64,
    /// Of those, bytes pinned.
    pub pinned_expert_bytes: u64,
    /// Smallest per-domain budget that can run the model at all (the largest weight).
    pub min_budget_bytes: u64,
    /// Whether the model can run with this budget.
    pub runnable: bool,
}

impl Plan {
    /// Weights to pin in the cache.
    pub fn pinned(&self) -> impl Iterator<Item = &Placement> {
        self.placement.iter().filter(|p| p.resident)
    }

    /// Streamed bytes per token of a prefill of `tokens` tokens (one pass for the whole batch).
    pub fn streamed_bytes_per_prefill_token(&self, tokens: usize) -> f64 {
        self.streamed_bytes_per_pass as f64 / tokens.max(1) as f64
    }

    /// Device bytes one decoded token computes with when each MoE block uses the fraction
    /// `used_fraction` (`expert_used_count / expert_count`) of its experts; the model's bytes
    /// for a dense model.
    pub fn active_bytes_per_token(&self, used_fraction: f64) -> f64 {
        (self.model_bytes - self.expert_bytes) as f64 + used_fraction * self.expert_bytes as f64
    }

    /// Bytes streamed per decoded token when routing is uniform over the experts: every
    /// non-expert weight not pinned, and `used_fraction` of the experts not pinned. Routing that
    /// favours pinned (or cached) experts streams less.
    pub fn expected_streamed_bytes_per_token(&self, used_fraction: f64) -> f64 {
        let unpinned_experts = self.expert_bytes - self.pinned_expert_bytes;
        (self.streamed_bytes_per_pass - unpinned_experts) as f64
            + used_fraction * unpinned_experts as f64
    }

    /// Whether decode must copy weights for every token (then it is bound by copy bandwidth,
    /// not by compute).
    pub fn decode_bandwidth_bound(&self) -> bool {
        self.streamed_bytes_per_pass > 0
    }
}

/// Make the plan.
pub fn plan(input: &PlanInput) -> Plan {
    let model_bytes: u64 = input.weights.iter().map(|w| w.1).sum();
    let largest = input
        .weights
        .iter()
        .max_by_key(|w| w.1)
        .cloned()
        .unwrap_or_default();
    let capacity = input.budget_bytes.min(input.window_bytes);
    let runnable = largest.1 <= capacity;
    let expert_bytes: u64 = input
        .weights
        .iter()
        .filter(|w| is_expert_key(&w.0))
        .map(|w| w.1)
        .sum();
    if let Some(placement) = resident_placement(input, capacity) {
        let domains_used = placement
            .iter()
            .map(|p| p.domain)
            .max()
            .map_or(0, |d| d + 1);
        return Plan {
            mode: Mode::Resident,
            resident_bytes: model_bytes,
            placement,
            model_bytes,
            domains_used,
            switches_per_pass: if domains_used > 1 { domains_used } else { 0 },
            streamed_bytes_per_pass: 0,
            min_budget_bytes: largest.1,
            largest,
            runnable,
            expert_bytes,
            pinned_expert_bytes: expert_bytes,
        };
    }
    // Stream through domain 0: reserve the working set, pin what fits beside it.
    let mut sizes: Vec<u64> = input.weights.iter().map(|w| w.1).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let reserve: u64 = sizes.iter().take(input.slots + 1).sum();
    let mut pinned = 0u64;
    let mut pinned_expert_bytes = 0u64;
    let mut placement: Vec<Placement> = input
        .weights
        .iter()
        .map(|(name, bytes)| Placement {
            name: name.clone(),
            bytes: *bytes,
            domain: 0,
            resident: false,
        })
        .collect();
    // Non-expert weights first, then experts, each in execution order.
    for experts in [false, true] {
        for p in placement
            .iter_mut()
            .filter(|p| is_expert_key(&p.name) == experts)
        {
            if runnable && pinned + p.bytes + reserve <= capacity {
                p.resident = true;
                pinned += p.bytes;
                if experts {
                    pinned_expert_bytes += p.bytes;
                }
            }
        }
    }
    Plan {
        mode: Mode::Streamed,
        resident_bytes: pinned,
        streamed_bytes_per_pass: model_bytes - pinned,
        placement,
        model_bytes,
        domains_used: 1,
        switches_per_pass: 0,
        min_budget_bytes: largest.1,
        largest,
        runnable,
        expert_bytes,
        pinned_expert_bytes,
    }
}

/// Consecutive weights per domain, each domain at most `capacity`; `None` if they do not fit.
fn resident_placement(input: &PlanInput, capacity: u64) -> Option<Vec<Placement>> {
    let mut domain = 0u32;
    let mut used = 0u64;
    let mut out = Vec::with_capacity(input.weights.len());
    for (name, bytes) in &input.weights {
        if used + bytes > capacity {
            domain += 1;
            used = 0;
            if domain >= input.domains || *bytes > capacity {
                return None;
            }
        }
        used += bytes;
        out.push(Placement {
            name: name.clone(),
            bytes: *bytes,
            domain,
            resident: true,
        });
    }
    Some(out)
}

/// Placement as the cache wants it: by the ids of `manifest`, the model the plan was made for.
///
/// # Errors
/// [`crate::ResidencyError::UnknownWeight`] for a placed weight the manifest does not hold.
pub fn domain_map(
    plan: &Plan,
    manifest: &ork_manifest::Manifest,
) -> Result<std::collections::HashMap<ork_manifest::WeightId, DomainId>, crate::ResidencyError> {
    plan.placement
        .iter()
        .map(|p| {
            let id = manifest
                .id(&p.name)
                .ok_or_else(|| crate::ResidencyError::UnknownWeight {
                    name: p.name.clone(),
                    source_desc: manifest.file().display().to_string(),
                })?;
            Ok((id, DomainId(p.domain)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(sizes: &[u64], budget: u64, domains: u32) -> PlanInput {
        PlanInput {
            weights: sizes
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("w{i}"), *s))
                .collect(),
            budget_bytes: budget,
            window_bytes: 100,
            domains,
            slots: 2,
        }
    }

    #[test]
    fn fits_one_domain_is_resident_without_switches() {
        let p = plan(&input(&[10, 20, 30], 100, 1));
        assert_eq!(p.mode, Mode::Resident);
        assert_eq!(p.switches_per_pass, 0);
        assert_eq!(p.streamed_bytes_per_pass, 0);
    }

    #[test]
    fn spreads_consecutive_weights_over_domains() {
        let p = plan(&input(&[40, 40, 40, 40, 40], 100, 3));
        assert_eq!(p.mode, Mode::Resident);
        let d: Vec<u32> = p.placement.iter().map(|x| x.domain).collect();
        assert_eq!(d, vec![0, 0, 1, 1, 2]);
        assert_eq!(p.switches_per_pass, 3);
    }

    #[test]
    fn too_big_streams_and_pins_what_fits_beside_the_working_set() {
        let p = plan(&input(&[10, 10, 10, 10, 10, 10], 45, 1));
        assert_eq!(p.mode, Mode::Streamed);
        // working set: the 3 largest = 30; pinned: 10 (only one fits in 45 - 30).
        assert_eq!(p.resident_bytes, 10);
        assert_eq!(p.streamed_bytes_per_pass, 50);
        assert!(p.decode_bandwidth_bound());
    }

    #[test]
    fn streaming_pins_non_expert_weights_before_experts() {
        let mut i = input(&[10, 10, 10, 10, 10, 10], 55, 1);
        for (n, w) in i.weights.iter_mut().enumerate().take(4) {
            w.0 = format!("blk.0.ffn_up_exps.weight#{n}");
        }
        let p = plan(&i);
        assert_eq!(p.mode, Mode::Streamed);
        // Working set 30; 25 left: the two non-experts (w4, w5) first, then no expert fits.
        let pinned: Vec<&str> = p.pinned().map(|x| x.name.as_str()).collect();
        assert_eq!(pinned, ["w4", "w5"]);
        assert_eq!((p.expert_bytes, p.pinned_expert_bytes), (40, 0));
        assert_eq!(p.streamed_bytes_per_pass, 40);
        // Top-1 of 4 experts: a token computes with 20 + 40/4 bytes and streams 10 of them.
        assert_eq!(p.active_bytes_per_token(0.25), 30.0);
        assert_eq!(p.expected_streamed_bytes_per_token(0.25), 10.0);
        let p = plan(&input(&[10, 10], 100, 1));
        assert_eq!(p.active_bytes_per_token(0.25), 20.0);
    }

    #[test]
    fn weight_larger_than_budget_is_not_runnable() {
        let p = plan(&input(&[10, 80], 50, 4));
        assert!(!p.runnable);
        assert_eq!(p.min_budget_bytes, 80);
    }
}
