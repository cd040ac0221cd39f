//! The feed-forward block: dense SwiGLU, or a Mixture of Experts computed as llama.cpp's
//! `build_moe_ffn` (`src/llama-graph.cpp`) does it for llama (Mixtral layout), qwen2moe and
//! qwen3moe (docs/moe.md):
//!
//! 1. router logits `h · W_routerᵀ` (`ffn_gate_inp`, one matmul over the batch);
//! 2. per token, softmax over all experts, the `k` most probable (descending), their
//!    probabilities as weights, renormalized to sum 1 for llama and qwen3moe (not qwen2moe),
//!    times `expert_weights_scale` when the file has one;
//! 3. tokens grouped per expert: each chosen expert runs gate, up, SwiGLU and down **once**, over
//!    every token routed to it (M > 1 in prefill); the experts needed are announced to the
//!    [`Linear`] in that order first ([`Linear::upcoming`]) so a streaming backend loads expert
//!    e + 1 while e computes;
//! 4. per token, the weighted expert outputs summed in slot order (llama.cpp adds the k views
//!    of its `[n_embd, k, tokens]` result one after another);
//! 5. qwen2moe: plus the shared expert's SwiGLU output times `sigmoid(h · ffn_gate_inp_shexp)`.
//!
//! **Speculative expert prefetch** (decode, one token): right after block l's router has run,
//! block l + 1's router is applied to block l's FFN input (the hidden state available now) and
//! its top `k + extra` experts are announced after block l's own, so a streaming backend loads
//! them while block l (and block l + 1's attention) computes. The residual stream changes little
//! from one block to the next, so the guess is usually right; a wrong guess costs a load on
//! demand, never a wrong result (announcing is a hint only). [`MoeStats`] counts predictions and
//! recall.
use crate::linear::Linear;
use crate::ops::{dot, geglu, swiglu};
use crate::ExecError;
use ork_manifest::WeightId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A block's feed-forward network.
#[derive(Clone)]
pub(crate) enum FeedForward {
    /// Dense gated FFN: `down(act(gate·x) ⊙ up·x)`, `act` SiLU (SwiGLU) or GeLU (Gemma).
    Dense {
        /// `ffn_gate` weight.
        gate: WeightId,
        /// `ffn_up` weight.
        up: WeightId,
        /// `ffn_down` weight.
        down: WeightId,
        /// Inner width.
        n_ff: usize,
        /// The gate's activation.
        act: Activation,
    },
    /// Dense SwiGLU whose gate and up are one weight (phi3's `ffn_up`, `[n_embd, 2·n_ff]`,
    /// gate rows first; `crate::fused`).
    FusedDense {
        /// `ffn_up` weight (gate and up).
        gate_up: WeightId,
        /// `ffn_down` weight.
        down: WeightId,
        /// Inner width (half of `gate_up`'s outputs).
        n_ff: usize,
    },
    /// Mixture of Experts.
    Moe(Box<MoeFfn>),
}

/// The activation of a gated feed-forward's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Activation {
    /// SiLU (SwiGLU): llama, qwen.
    Silu,
    /// GeLU, tanh form (GeGLU): gemma3.
    GeluTanh,
}

/// One expert's weights (slices `TENSOR#EXPERT` of the 3-D expert tensors).
#[derive(Clone)]
pub(crate) struct Expert {
    pub(crate) gate: WeightId,
    pub(crate) up: WeightId,
    pub(crate) down: WeightId,
}

/// qwen2moe's shared expert: a SwiGLU FFN every token runs, scaled by a sigmoid gate.
#[derive(Clone)]
pub(crate) struct SharedExpert {
    pub(crate) gate: WeightId,
    pub(crate) up: WeightId,
    pub(crate) down: WeightId,
    pub(crate) n_ff: usize,
    /// `ffn_gate_inp_shexp`: the gate is `sigmoid(h · gate_inp)`.
    pub(crate) gate_inp: Vec<f32>,
}

/// Counters of the speculative expert prefetch, summed over a model's MoE blocks (and over the
/// sessions running it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// Decode steps of a block whose experts were predicted by the block before.
    pub predicted_steps: u64,
    /// Experts predicted (announced ahead) in total.
    pub predictions: u64,
    /// Experts the predicted steps used.
    pub used: u64,
    /// Of those, experts that had been predicted.
    pub predicted_used: u64,
    /// Forward passes of a MoE block, every batch size (decode, verify batches, prefill).
    pub forwards: u64,
    /// Token rows in those passes.
    pub rows: u64,
    /// Experts those passes ran: per pass, the union of its rows' experts (the expert weights a
    /// batch needs, `docs/speculative.md`).
    pub experts_run: u64,
}

impl MoeStats {
    /// Recall: predicted ∩ used / used (`None` before any prediction was checked).
    pub fn recall(&self) -> Option<f64> {
        (self.used > 0).then(|| self.predicted_used as f64 / self.used as f64)
    }
}

/// Prediction state and counters of one MoE block.
#[derive(Default)]
pub(crate) struct Speculation {
    /// Extra experts predicted beyond `k`; `usize::MAX`: speculation off.
    pub(crate) extra: AtomicUsize,
    /// The experts the previous block predicted for this one (this decode step).
    pending: Mutex<Option<Vec<usize>>>,
    predicted_steps: AtomicU64,
    predictions: AtomicU64,
    used: AtomicU64,
    predicted_used: AtomicU64,
    forwards: AtomicU64,
    rows: AtomicU64,
    experts_run: AtomicU64,
}

/// A copy (a model cut to its first blocks for a draft) starts with fresh counters and no
/// pending prediction, predicting as many experts as the original.
impl Clone for Speculation {
    fn clone(&self) -> Speculation {
        Speculation::new(self.extra.load(Ordering::Relaxed))
    }
}

impl Speculation {
    /// Speculation predicting `k + extra` experts.
    pub(crate) fn new(extra: usize) -> Speculation {
        Speculation {
            extra: AtomicUsize::new(extra),
            ..Speculation::default()
        }
    }

    pub(crate) fn stats(&self) -> MoeStats {
        MoeStats {
            predicted_steps: self.predicted_steps.load(Ordering::Relaxed),
            predictions: self.predictions.load(Ordering::Relaxed),
            used: self.used.load(Ordering::Relaxed),
            predicted_used: self.predicted_used.load(Ordering::Relaxed),
            forwards: self.forwards.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            experts_run: self.experts_run.load(Ordering::Relaxed),
        }
    }

    /// Compare this step's experts with what was predicted for it.
    fn check(&self, used: &[usize]) {
        let Some(predicted) = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let hit = used.iter().filter(|e| predicted.contains(e)).count();
        self.predicted_steps.fetch_add(1, Ordering::Relaxed);
        self.used.fetch_add(used.len() as u64, Ordering::Relaxed);
        self.predicted_used.fetch_add(hit as u64, Ordering::Relaxed);
    }

    fn predict(&self, experts: Vec<usize>) {
        self.predictions
            .fetch_add(experts.len() as u64, Ordering::Relaxed);
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(experts);
    }
}

/// A Mixture-of-Experts feed-forward block.
#[derive(Clone)]
pub(crate) struct MoeFfn {
    /// `ffn_gate_inp`: `[n_embd, n_expert]`.
    pub(crate) router: WeightId,
    pub(crate) experts: Vec<Expert>,
    pub(crate) shared: Option<SharedExpert>,
    pub(crate) n_used: usize,
    pub(crate) n_ff_exp: usize,
    pub(crate) renormalize: bool,
    pub(crate) weights_scale: Option<f32>,
    pub(crate) speculation: Speculation,
}

/// Per token, the chosen experts and their weights, in slot order (most probable first).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Experts chosen per token.
    pub k: usize,
    /// `tokens × k` expert indices.
    pub experts: Vec<usize>,
    /// `tokens × k` weights.
    pub weights: Vec<f32>,
}

impl Routing {
    /// Route `logits` (`tokens × n_expert`, row-major) as llama.cpp does: softmax over all
    /// experts, top `k` by probability (ties to the lower index), weights renormalized to sum 1
    /// when `renormalize`, then multiplied by `scale`.
    pub fn from_logits(
        logits: &[f32],
        n_expert: usize,
        k: usize,
        renormalize: bool,
        scale: Option<f32>,
    ) -> Routing {
        let tokens = logits.len() / n_expert;
        let mut experts = Vec::with_capacity(tokens * k);
        let mut weights = Vec::with_capacity(tokens * k);
        let mut probs = vec![0.0f32; n_expert];
        let mut order: Vec<usize> = Vec::with_capacity(n_expert);
        for row in logits.chunks_exact(n_expert) {
            softmax_into(row, &mut probs);
            order.clear();
            order.extend(0..n_expert);
            // Descending probability; NaN sorts last. Stable: equal values keep index order.
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
            let chosen = &order[..k];
            let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
            for &e in chosen {
                let mut w = probs[e];
                if renormalize {
                    w /= sum;
                }
                if let Some(s) = scale {
                    w *= s;
                }
                experts.push(e);
                weights.push(w);
            }
        }
        Routing {
            k,
            experts,
            weights,
        }
    }

    /// The experts used by any token, each once, ascending.
    pub fn used(&self) -> Vec<usize> {
        let mut u = self.experts.clone();
        u.sort_unstable();
        u.dedup();
        u
    }
}

/// `out = softmax(x)` (max-subtracted, as ggml's `soft_max`).
fn softmax_into(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl FeedForward {
    /// `out = FFN(h)` for `m` tokens (`h` and `out` are `m × n_embd`); `next` is the next
    /// block's feed-forward (for speculative expert prefetch).
    pub(crate) fn forward(
        &self,
        linear: &dyn Linear,
        h: &[f32],
        m: usize,
        out: &mut [f32],
        next: Option<&FeedForward>,
    ) -> Result<(), ExecError> {
        match self {
            FeedForward::Dense {
                gate,
                up,
                down,
                n_ff,
                act,
            } => gated_ffn(linear, [*gate, *up, *down], *n_ff, *act, h, m, out),
            FeedForward::FusedDense {
                gate_up,
                down,
                n_ff,
            } => crate::fused::fused_swiglu_ffn(linear, [*gate_up, *down], *n_ff, h, m, out),
            FeedForward::Moe(moe) => {
                let next = match next {
                    Some(FeedForward::Moe(n)) => Some(&**n),
                    _ => None,
                };
                moe.forward(linear, h, m, out, next)
            }
        }
    }
}

/// `out = down(act(gate·x) ⊙ up·x)` for `m` rows of `x`.
fn gated_ffn(
    linear: &dyn Linear,
    [gate, up, down]: [WeightId; 3],
    n_ff: usize,
    act: Activation,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<(), ExecError> {
    let mut g = vec![0.0f32; m * n_ff];
    let mut u = vec![0.0f32; m * n_ff];
    linear.matmul_many(&[gate, up], x, m, &mut [&mut g, &mut u])?;
    match act {
        Activation::Silu => swiglu(&mut g, &u),
        Activation::GeluTanh => geglu(&mut g, &u),
    }
    linear.matmul(down, &g, m, out)
}

impl MoeFfn {
    /// The router's choice for `m` tokens of `h`.
    pub(crate) fn route(
        &self,
        linear: &dyn Linear,
        h: &[f32],
        m: usize,
    ) -> Result<Routing, ExecError> {
        let n_expert = self.experts.len();
        let mut logits = vec![0.0f32; m * n_expert];
        linear.matmul(self.router, h, m, &mut logits)?;
        Ok(Routing::from_logits(
            &logits,
            n_expert,
            self.n_used,
            self.renormalize,
            self.weights_scale,
        ))
    }

    /// The weights of `experts`, in compute order (gate, up, down of each).
    pub(crate) fn expert_weights(&self, experts: &[usize]) -> Vec<WeightId> {
        experts
            .iter()
            .flat_map(|&e| {
                let x = &self.experts[e];
                [x.gate, x.up, x.down]
            })
            .collect()
    }

    /// The `k + extra` experts this block's router ranks first for one token of `h`.
    fn predict(
        &self,
        linear: &dyn Linear,
        h: &[f32],
        extra: usize,
    ) -> Result<Vec<usize>, ExecError> {
        let n_expert = self.experts.len();
        let mut logits = vec![0.0f32; n_expert];
        linear.matmul(self.router, h, 1, &mut logits)?;
        let k = (self.n_used + extra).min(n_expert);
        Ok(Routing::from_logits(&logits, n_expert, k, false, None).experts)
    }

    fn forward(
        &self,
        linear: &dyn Linear,
        h: &[f32],
        m: usize,
        out: &mut [f32],
        next: Option<&MoeFfn>,
    ) -> Result<(), ExecError> {
        let d = h.len() / m;
        let routing = self.route(linear, h, m)?;
        let k = routing.k;
        let used = routing.used();
        let sp = &self.speculation;
        sp.forwards.fetch_add(1, Ordering::Relaxed);
        sp.rows.fetch_add(m as u64, Ordering::Relaxed);
        sp.experts_run
            .fetch_add(used.len() as u64, Ordering::Relaxed);
        let mut announce = self.expert_weights(&used);
        if m == 1 {
            self.speculation.check(&used);
            let extra = self.speculation.extra.load(Ordering::Relaxed);
            if let (Some(next), true) = (next, extra != usize::MAX) {
                let predicted = next.predict(linear, h, extra)?;
                announce.extend(next.expert_weights(&predicted));
                next.speculation.predict(predicted);
            }
        }
        linear.upcoming(&announce);

        let shared = match &self.shared {
            Some(s) => {
                let mut y = vec![0.0f32; m * d];
                let w = [s.gate, s.up, s.down];
                gated_ffn(linear, w, s.n_ff, Activation::Silu, h, m, &mut y)?;
                for (row, x) in y.chunks_exact_mut(d).zip(h.chunks_exact(d)) {
                    let g = sigmoid(dot(&s.gate_inp, x));
                    row.iter_mut().for_each(|v| *v *= g);
                }
                Some(y)
            }
            None => None,
        };

        // Per (token, slot): the weighted output of the slot's expert.
        let mut slots = vec![0.0f32; m * k * d];
        let mut rows: Vec<usize> = Vec::with_capacity(m * k);
        let mut xe: Vec<f32> = Vec::with_capacity(m * k * d);
        let mut ye: Vec<f32> = Vec::new();
        for &e in &used {
            rows.clear();
            rows.extend(
                routing
                    .experts
                    .iter()
                    .enumerate()
                    .filter(|&(_, &x)| x == e)
                    .map(|(i, _)| i),
            );
            xe.clear();
            for &i in &rows {
                xe.extend_from_slice(&h[(i / k) * d..][..d]);
            }
            ye.clear();
            ye.resize(rows.len() * d, 0.0);
            let x = &self.experts[e];
            gated_ffn(
                linear,
                [x.gate, x.up, x.down],
                self.n_ff_exp,
                Activation::Silu,
                &xe,
                rows.len(),
                &mut ye,
            )?;
            for (&i, y) in rows.iter().zip(ye.chunks_exact(d)) {
                let w = routing.weights[i];
                for (s, v) in slots[i * d..][..d].iter_mut().zip(y) {
                    *s = v * w;
                }
            }
        }
        for (t, o) in out.chunks_exact_mut(d).enumerate() {
            o.copy_from_slice(&slots[t * k * d..][..d]);
            for j in 1..k {
                for (a, b) in o.iter_mut().zip(&slots[(t * k + j) * d..][..d]) {
                    *a += b;
                }
            }
        }
        if let Some(y) = shared {
            for (a, b) in out.iter_mut().zip(&y) {
                *a += b;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_is_softmax_top_k_renormalized_and_scaled() {
        let logits = [0.0, 2.0, 1.0, 2.0, /* token 2 */ 5.0, -1.0, 0.0, 0.0];
        let r = Routing::from_logits(&logits, 4, 2, false, None);
        // Ties keep the lower index first.
        assert_eq!(r.experts, [1, 3, 0, 2]);
        let z: f32 = [0.0f32, 2.0, 1.0, 2.0].iter().map(|v| v.exp()).sum();
        assert!((r.weights[0] - 2f32.exp() / z).abs() < 1e-6);
        assert!((r.weights[1] - 2f32.exp() / z).abs() < 1e-6);
        let n = Routing::from_logits(&logits, 4, 2, true, Some(2.0));
        assert_eq!(n.experts, r.experts);
        assert!((n.weights[0] - 1.0).abs() < 1e-6 && (n.weights[1] - 1.0).abs() < 1e-6);
        let p0 = 5f32.exp();
        let p2 = 1.0;
        assert!((n.weights[2] - 2.0 * p0 / (p0 + p2)).abs() < 1e-5);
        assert_eq!(n.used(), vec![0, 1, 2, 3]);
    }
}
