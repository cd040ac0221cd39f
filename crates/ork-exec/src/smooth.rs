//! SmoothQuant-style smoothing (`docs/chip.md`): per input channel `j` of the weights that read
//! a normed activation, `s_j = max|X_j|^α / max|W_j|^(1−α)`; the activation becomes `X/s` (the
//! `1/s` folded into the RMSNorm weight before it: `attn_norm` for q/k/v, `ffn_norm` for
//! gate/up) and each weight `W·s`, so the product is unchanged and smoothing costs nothing at
//! run time. `max|X_j|` comes from running a calibration text through the f32 reference.
use crate::linear::CpuF32Linear;
use crate::model::Model;
use crate::moe::FeedForward;
use crate::{ExecError, Linear, Session};
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile};
use ork_manifest::{tensor_name, Role};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Per-column `max|x_j|` of every matmul input, recorded while the f32 reference runs.
struct Recorder {
    inner: Arc<CpuF32Linear>,
    maxima: Mutex<HashMap<String, Vec<f32>>>,
}

impl Linear for Recorder {
    fn matmul(&self, weight: &str, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.inner.matmul(weight, x, m, y)?;
        if let Some(k) = x.len().checked_div(m).filter(|&k| k > 0) {
            let mut maxima = self.maxima.lock().unwrap_or_else(|e| e.into_inner());
            let col = maxima
                .entry(weight.to_owned())
                .or_insert_with(|| vec![0.0; k]);
            for row in x.chunks_exact(k) {
                for (c, v) in col.iter_mut().zip(row) {
                    *c = c.max(v.abs());
                }
            }
        }
        Ok(())
    }
}

/// Smoothing factors of one block: `attn` for the input of q/k/v, `ffn` for the input of
/// gate/up (`None` for a mixture-of-experts block, which is left as it is).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSmoothing {
    /// `s` for the columns of q, k and v (length `n_embd`).
    pub attn: Vec<f32>,
    /// `s` for the columns of gate and up (length `n_embd`), dense blocks only.
    pub ffn: Option<Vec<f32>>,
}

/// Column maxima `max_n |W[n, j]|` over the rows of every weight in `names`.
fn weight_maxima(
    reference: &CpuF32Linear,
    names: &[&str],
    k: usize,
) -> Result<Vec<f32>, ExecError> {
    let mut col = vec![0.0f32; k];
    for name in names {
        let w = reference
            .weight(name)
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: (*name).to_owned(),
            })?;
        for row in w.chunks_exact(k) {
            for (c, v) in col.iter_mut().zip(row) {
                *c = c.max(v.abs());
            }
        }
    }
    Ok(col)
}

/// `s_j = a_j^α / w_j^(1−α)`, 1 where either maximum is zero or the result is not finite and
/// positive (a channel the text never excites is left alone).
fn factors(act: &[f32], w: &[f32], alpha: f32) -> Vec<f32> {
    act.iter()
        .zip(w)
        .map(|(&a, &w)| {
            let s = a.powf(alpha) / w.powf(1.0 - alpha);
            if a > 0.0 && w > 0.0 && s.is_finite() && s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect()
}

/// The smoothing factors of every block of `model` for strength `alpha` (in `[0, 1]`), the
/// activation maxima taken over `tokens` run through `reference` (the f32 weights of `model`)
/// in chunks of at most `n_ctx`.
///
/// # Errors
/// [`ExecError::InvalidSmoothing`] for an `alpha` outside `[0, 1]` or no tokens; any error of
/// the forward pass.
pub fn smoothing_factors(
    model: &Arc<Model>,
    reference: &Arc<CpuF32Linear>,
    tokens: &[u32],
    n_ctx: usize,
    alpha: f32,
) -> Result<Vec<BlockSmoothing>, ExecError> {
    if !(0.0..=1.0).contains(&alpha) {
        return Err(ExecError::InvalidSmoothing {
            what: format!("alpha {alpha} is outside [0, 1]"),
        });
    }
    if tokens.is_empty() {
        return Err(ExecError::InvalidSmoothing {
            what: "the calibration text has no tokens".to_owned(),
        });
    }
    let recorder = Arc::new(Recorder {
        inner: Arc::clone(reference),
        maxima: Mutex::new(HashMap::new()),
    });
    for chunk in tokens.chunks(n_ctx.max(1)) {
        let linear: Arc<dyn Linear> = Arc::clone(&recorder) as Arc<dyn Linear>;
        let mut s = Session::new(Arc::clone(model), linear);
        s.prefill(chunk)?;
    }
    let maxima = std::mem::take(&mut *recorder.maxima.lock().unwrap_or_else(|e| e.into_inner()));
    let d = model.config().n_embd;
    let act = |name: &str| -> Result<Vec<f32>, ExecError> {
        maxima
            .get(name)
            .cloned()
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: name.to_owned(),
            })
    };
    let mut out = Vec::with_capacity(model.layers.len());
    for layer in &model.layers {
        let a = act(&layer.wq)?;
        let w = weight_maxima(reference, &[&layer.wq, &layer.wk, &layer.wv], d)?;
        let attn = factors(&a, &w, alpha);
        let ffn = match &layer.ffn {
            FeedForward::Dense { gate, up, .. } => {
                let a = act(gate)?;
                let w = weight_maxima(reference, &[gate, up], d)?;
                Some(factors(&a, &w, alpha))
            }
            FeedForward::Moe(_) => None,
        };
        out.push(BlockSmoothing { attn, ffn });
    }
    Ok(out)
}

/// Scale the columns of `rows` (`n × k`, row-major) by `s`.
fn scale_columns(rows: &mut [f32], s: &[f32]) {
    for row in rows.chunks_exact_mut(s.len()) {
        for (v, f) in row.iter_mut().zip(s) {
            *v *= f;
        }
    }
}

/// Apply `smoothing` to the f32 weights of `reference` in place: the columns of q/k/v and
/// gate/up multiplied by `s`. With the norms divided by `s` (as [`smoothed_gguf`] does), the block outputs
/// equal the unsmoothed model's up to f32 rounding.
///
/// # Errors
/// [`ExecError::UnknownWeight`] if `reference` lacks one of the weights;
/// [`ExecError::InvalidSmoothing`] if `smoothing` does not match the model's blocks.
pub fn smooth_reference(
    model: &Model,
    reference: &mut CpuF32Linear,
    smoothing: &[BlockSmoothing],
) -> Result<(), ExecError> {
    check_blocks(model, smoothing)?;
    for (layer, b) in model.layers.iter().zip(smoothing) {
        let mut names: Vec<(&str, &[f32])> = vec![
            (&layer.wq, &b.attn),
            (&layer.wk, &b.attn),
            (&layer.wv, &b.attn),
        ];
        if let (FeedForward::Dense { gate, up, .. }, Some(f)) = (&layer.ffn, &b.ffn) {
            names.push((gate, f));
            names.push((up, f));
        }
        for (name, s) in names {
            let w = reference
                .weight_mut(name)
                .ok_or_else(|| ExecError::UnknownWeight {
                    weight: name.to_owned(),
                })?;
            scale_columns(w, s);
        }
    }
    Ok(())
}

fn check_blocks(model: &Model, smoothing: &[BlockSmoothing]) -> Result<(), ExecError> {
    let d = model.config().n_embd;
    let ok = smoothing.len() == model.layers.len()
        && smoothing.iter().zip(&model.layers).all(|(b, l)| {
            b.attn.len() == d
                && match (&b.ffn, &l.ffn) {
                    (Some(f), FeedForward::Dense { .. }) => f.len() == d,
                    (None, _) => true,
                    (Some(_), FeedForward::Moe(_)) => false,
                }
        });
    if ok {
        Ok(())
    } else {
        Err(ExecError::InvalidSmoothing {
            what: format!(
                "{} blocks of factors do not fit the model's {} blocks of {d} channels",
                smoothing.len(),
                model.layers.len()
            ),
        })
    }
}

/// A copy of `gguf` with `smoothing` folded in: each block's `attn_norm` (and `ffn_norm` for a
/// dense block) divided by `s`, and q/k/v (gate/up) with their columns multiplied by `s`, the
/// changed tensors stored as f32 (every other tensor and key copied unchanged). `label` names
/// the in-memory file in errors.
///
/// # Errors
/// A tensor cannot be read, or the file cannot be built.
pub fn smoothed_gguf(
    gguf: &GgufFile,
    model: &Model,
    smoothing: &[BlockSmoothing],
    label: impl Into<std::path::PathBuf>,
) -> Result<GgufFile, ExecError> {
    check_blocks(model, smoothing)?;
    // name → factors: weights scale columns, norms divide.
    let mut weights: HashMap<String, &[f32]> = HashMap::new();
    let mut norms: HashMap<String, &[f32]> = HashMap::new();
    for (i, (layer, b)) in model.layers.iter().zip(smoothing).enumerate() {
        let name = |r: Role| tensor_name(r, i).expect("roles in the table have names");
        norms.insert(name(Role::AttnNorm), &b.attn);
        for w in [&layer.wq, &layer.wk, &layer.wv] {
            weights.insert(w.clone(), &b.attn);
        }
        if let (FeedForward::Dense { gate, up, .. }, Some(f)) = (&layer.ffn, &b.ffn) {
            norms.insert(name(Role::FfnNorm), f);
            weights.insert(gate.clone(), f);
            weights.insert(up.clone(), f);
        }
    }
    // Every key; the tensors in their original order, the changed ones as f32.
    let mut order = GgufBuilder::from_file(gguf, |_| false, &[]);
    for t in gguf.tensors() {
        let mut values = gguf.dequantize_tensor(t).map_err(ExecError::from)?;
        if let Some(s) = weights.get(&t.name) {
            scale_columns(&mut values, s);
        } else if let Some(s) = norms.get(&t.name) {
            for (v, f) in values.iter_mut().zip(*s) {
                *v /= f;
            }
        } else {
            order = order.tensor(&t.name, &t.dims, t.ty, gguf.tensor_data(t).to_vec());
            continue;
        }
        order = order
            .tensor_f32(&t.name, &t.dims, GgmlType::F32, &values)
            .map_err(ExecError::from)?;
    }
    let bytes = order.to_bytes().map_err(ExecError::from)?;
    GgufFile::from_bytes(label, bytes).map_err(ExecError::from)
}
