//! Fused projections (phi3, docs/models.md "phi3"), run as llama.cpp runs them: one matmul
//! whose output rows are split afterwards.
//!
//! - `blk.N.attn_qkv.weight` `[n_embd, q + k + v]`: each output row holds q, then k, then v
//!   (llama.cpp's `build_qkv` views at offsets 0, `n_embd_q`, `n_embd_q + n_embd_k`).
//! - `blk.N.ffn_up.weight` `[n_embd, 2·n_ff]` without `ffn_gate`: each output row holds the gate
//!   then the up projection (ggml's `ggml_swiglu` activates the first half: `silu(a) · b`).
//!
//! One call rather than three (or two): the device pays one submission per matmul, and the
//! activation is quantized once; splitting the weight at load would triple the calls.
use crate::linear::Linear;
use crate::ops::swiglu;
use crate::ExecError;
use ork_manifest::WeightId;

/// A block's q/k/v projection weights.
#[derive(Clone)]
pub(crate) enum QkvWeights {
    /// `attn_q`, `attn_k`, `attn_v`.
    Separate([WeightId; 3]),
    /// `attn_qkv`.
    Fused(WeightId),
}

impl QkvWeights {
    /// The weights, in first-use order.
    pub(crate) fn ids(&self) -> Vec<WeightId> {
        match self {
            QkvWeights::Separate(w) => w.to_vec(),
            QkvWeights::Fused(w) => vec![*w],
        }
    }

    /// The weights, to change in place.
    pub(crate) fn ids_mut(&mut self) -> Vec<&mut WeightId> {
        match self {
            QkvWeights::Separate(w) => w.iter_mut().collect(),
            QkvWeights::Fused(w) => vec![w],
        }
    }

    /// `q`, `k`, `v` (each `m` rows) of the `m` rows of `h`.
    pub(crate) fn forward(
        &self,
        linear: &dyn Linear,
        h: &[f32],
        m: usize,
        [q, k, v]: [&mut [f32]; 3],
    ) -> Result<(), ExecError> {
        match self {
            // q, k and v take the same input: one call, so the backend can quantize it once
            // and submit the three together.
            QkvWeights::Separate([wq, wk, wv]) => {
                linear.matmul_many(&[*wq, *wk, *wv], h, m, &mut [q, k, v])
            }
            QkvWeights::Fused(w) => {
                let (qd, kd, vd) = (q.len() / m, k.len() / m, v.len() / m);
                let mut qkv = vec![0.0f32; m * (qd + kd + vd)];
                linear.matmul(*w, h, m, &mut qkv)?;
                for (i, row) in qkv.chunks_exact(qd + kd + vd).enumerate() {
                    q[i * qd..][..qd].copy_from_slice(&row[..qd]);
                    k[i * kd..][..kd].copy_from_slice(&row[qd..qd + kd]);
                    v[i * vd..][..vd].copy_from_slice(&row[qd + kd..]);
                }
                Ok(())
            }
        }
    }
}

/// `out = down(silu(gate·x) ⊙ up·x)` for `m` rows of `x`, gate and up from one fused weight.
pub(crate) fn fused_swiglu_ffn(
    linear: &dyn Linear,
    [gate_up, down]: [WeightId; 2],
    n_ff: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<(), ExecError> {
    let mut gu = vec![0.0f32; m * 2 * n_ff];
    linear.matmul(gate_up, x, m, &mut gu)?;
    let mut g = vec![0.0f32; m * n_ff];
    let mut u = vec![0.0f32; m * n_ff];
    for (i, row) in gu.chunks_exact(2 * n_ff).enumerate() {
        g[i * n_ff..][..n_ff].copy_from_slice(&row[..n_ff]);
        u[i * n_ff..][..n_ff].copy_from_slice(&row[n_ff..]);
    }
    swiglu(&mut g, &u);
    linear.matmul(down, &g, m, out)
}
