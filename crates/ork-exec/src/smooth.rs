//! SmoothQuant-style smoothing (`docs/chip.md`): per input channel `j` of the weights that read
//! a normed activation, `s_j = max|X_j|^α / max|W_j|^(1−α)`; the activation becomes `X/s` (the
//! `1/s` folded into the RMSNorm weight before it: `attn_norm` for q/k/v, `ffn_norm` for
//! gate/up) and each weight `W·s`, so the product is unchanged and smoothing costs nothing at
//! run time. `max|X_j|` comes from running a calibration text through the f32 reference.
//!
//! Where no norm precedes, the `1/s` is folded into the projection before instead
//! ([`SmoothTargets`]): `v → o` divides `attn_v`'s output rows (and its bias) by `s` and scales
//! `attn_output`'s input columns, one factor per (kv head, dim) shared by every q head of the
//! group; `up → down` divides `ffn_up`'s output rows by `s` (the input of `ffn_down` is
//! `silu(gate) ⊙ up`, so channel `j` is divided exactly) and scales `ffn_down`'s columns.
use crate::fused::QkvWeights;
use crate::linear::CpuF32Linear;
use crate::model::Model;
use crate::moe::FeedForward;
use crate::{ExecError, KvType, Linear, Session};
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile};
use ork_manifest::{tensor_name, Role, WeightId};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Per-column `max|x_j|` of every matmul input, recorded while the f32 reference runs.
struct Recorder {
    inner: Arc<CpuF32Linear>,
    maxima: Mutex<HashMap<WeightId, Vec<f32>>>,
}

impl Linear for Recorder {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        self.inner.matmul(id, x, m, y)?;
        if let Some(k) = x.len().checked_div(m).filter(|&k| k > 0) {
            let mut maxima = self.maxima.lock().unwrap_or_else(|e| e.into_inner());
            let col = maxima.entry(id).or_insert_with(|| vec![0.0; k]);
            for row in x.chunks_exact(k) {
                for (c, v) in col.iter_mut().zip(row) {
                    *c = c.max(v.abs());
                }
            }
        }
        Ok(())
    }
}

/// Which matmul inputs are smoothed besides the normed ones (q/k/v and gate/up, always).
/// `docs/chip.md` has the measured figures of each set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmoothTargets {
    /// `v → o` per head: the input of `attn_output`, `1/s` folded into `attn_v`'s output rows.
    pub v_to_o: bool,
    /// `up → down`: the input of `ffn_down`, `1/s` folded into `ffn_up`'s output rows (dense
    /// feed-forward blocks only; experts are left alone).
    pub up_to_down: bool,
}

impl SmoothTargets {
    /// Only the inputs that follow a norm (q/k/v, gate/up).
    pub const NORM: SmoothTargets = SmoothTargets {
        v_to_o: false,
        up_to_down: false,
    };
    /// Every target: the normed inputs, `v → o` and `up → down`.
    pub const ALL: SmoothTargets = SmoothTargets {
        v_to_o: true,
        up_to_down: true,
    };

    /// The name `FromStr` reads back: `norm`, `norm,vo`, `norm,down` or `all`.
    pub fn name(self) -> &'static str {
        match (self.v_to_o, self.up_to_down) {
            (false, false) => "norm",
            (true, false) => "norm,vo",
            (false, true) => "norm,down",
            (true, true) => "all",
        }
    }
}

impl Default for SmoothTargets {
    /// `norm,down`, the set measurement shows best on SmolLM2 with both `w8a8` and
    /// `w8a8-g256` at α 0.7 (`docs/chip.md`: +1.10 % and +0.45 % perplexity against llama.cpp,
    /// against +1.85 % for `norm` alone).
    fn default() -> Self {
        SmoothTargets {
            v_to_o: false,
            up_to_down: true,
        }
    }
}

impl std::fmt::Display for SmoothTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SmoothTargets {
    type Err = String;

    /// A comma-separated list of `norm`, `vo`, `down`, or `all`; `norm` must be in it (the
    /// normed inputs are always smoothed).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut t = SmoothTargets::NORM;
        let mut norm = false;
        for part in s.split(',').map(str::trim) {
            match part {
                "norm" => norm = true,
                "vo" => t.v_to_o = true,
                "down" => t.up_to_down = true,
                "all" => {
                    norm = true;
                    t = SmoothTargets::ALL;
                }
                other => {
                    return Err(format!(
                        "unknown smoothing target '{other}' (norm, vo, down, all)"
                    ))
                }
            }
        }
        if norm {
            Ok(t)
        } else {
            Err(format!(
                "'{s}' leaves out norm: the inputs after a norm are always smoothed \
                 (norm, norm,vo, norm,down or all)"
            ))
        }
    }
}

/// Smoothing factors of one block: `attn` for the input of q/k/v, `ffn` for the input of
/// gate/up (`None` for a mixture-of-experts block, which is left as it is), `vo` and `down`
/// for the inputs of `attn_output` and `ffn_down` when those targets are smoothed.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSmoothing {
    /// `s` for the columns of q, k and v (length `n_embd`).
    pub attn: Vec<f32>,
    /// `s` for the columns of gate and up (length `n_embd`), dense blocks only.
    pub ffn: Option<Vec<f32>>,
    /// `s` per (kv head, dim) (length `n_head_kv · head_dim_v`): `attn_v`'s output rows are
    /// divided by it, `attn_output`'s columns `(h, d)` multiplied by the factor of `h`'s group.
    pub vo: Option<Vec<f32>>,
    /// `s` for the columns of `ffn_down` (length `n_ff`), dense blocks only: `ffn_up`'s output
    /// rows are divided by it.
    pub down: Option<Vec<f32>>,
}

/// The name of `model`'s weight `id`, for messages and the GGUF's tensors.
fn key(model: &Model, id: WeightId) -> String {
    model.manifest().get(id).key.clone()
}

/// Column maxima `max_n |W[n, j]|` over the rows of every weight in `ids` of `model`.
fn weight_maxima(
    model: &Model,
    reference: &CpuF32Linear,
    ids: &[WeightId],
    k: usize,
) -> Result<Vec<f32>, ExecError> {
    let mut col = vec![0.0f32; k];
    for &id in ids {
        let w = reference
            .weight(id)
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: key(model, id),
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

/// The smoothing factors of every block of `model` for strength `alpha` (in `[0, 1]`) and
/// `targets`, the activation maxima taken over `tokens` run through `reference` (the f32
/// weights of `model`) in chunks of at most `n_ctx`.
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
    targets: SmoothTargets,
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
    let maxima = activation_maxima(model, reference, tokens, n_ctx)?;
    let c = model.config();
    let d = c.n_embd;
    let act = |id: WeightId| -> Result<Vec<f32>, ExecError> {
        maxima
            .get(&id)
            .cloned()
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: key(model, id),
            })
    };
    let mut out = Vec::with_capacity(model.layers.len());
    for layer in &model.layers {
        let qkv = layer.qkv.ids();
        let a = act(qkv[0])?;
        let w = weight_maxima(model, reference, &qkv, d)?;
        let attn = factors(&a, &w, alpha);
        let (ffn, down) = match &layer.ffn {
            FeedForward::Dense {
                gate,
                up,
                down,
                n_ff,
                ..
            } => {
                let a = act(*gate)?;
                let w = weight_maxima(model, reference, &[*gate, *up], d)?;
                let ffn = Some(factors(&a, &w, alpha));
                let down = if targets.up_to_down {
                    let a = act(*down)?;
                    let w = weight_maxima(model, reference, &[*down], *n_ff)?;
                    Some(factors(&a, &w, alpha))
                } else {
                    None
                };
                (ffn, down)
            }
            // One weight holds gate and up: its columns take the factors; `up → down` would
            // divide half of its rows and is not applied to fused weights.
            FeedForward::FusedDense { gate_up, .. } => {
                let a = act(*gate_up)?;
                let w = weight_maxima(model, reference, &[*gate_up], d)?;
                (Some(factors(&a, &w, alpha)), None)
            }
            FeedForward::Moe(_) => (None, None),
        };
        // `v → o` divides `attn_v`'s rows: not applied to a fused q/k/v weight.
        let vo = if targets.v_to_o && matches!(layer.qkv, QkvWeights::Separate(_)) {
            // One factor per (kv head, dim): the maxima over the q heads of its group.
            let a = act(layer.wo)?;
            let w = weight_maxima(model, reference, &[layer.wo], c.attn_out_dim())?;
            let (group, dv) = (c.n_head / c.n_head_kv.max(1), c.head_dim_v);
            let mut ga = vec![0.0f32; c.n_head_kv * dv];
            let mut gw = vec![0.0f32; c.n_head_kv * dv];
            for h in 0..c.n_head {
                let g = h / group.max(1);
                for i in 0..dv {
                    ga[g * dv + i] = ga[g * dv + i].max(a[h * dv + i]);
                    gw[g * dv + i] = gw[g * dv + i].max(w[h * dv + i]);
                }
            }
            Some(factors(&ga, &gw, alpha))
        } else {
            None
        };
        out.push(BlockSmoothing {
            attn,
            ffn,
            vo,
            down,
        });
    }
    Ok(out)
}

/// The largest absolute input of every weight's columns over `tokens`, run through `reference`
/// (the f32 weights, its KV cache included) in chunks of at most `n_ctx`.
fn activation_maxima(
    model: &Arc<Model>,
    reference: &Arc<CpuF32Linear>,
    tokens: &[u32],
    n_ctx: usize,
) -> Result<HashMap<WeightId, Vec<f32>>, ExecError> {
    let recorder = Arc::new(Recorder {
        inner: Arc::clone(reference),
        maxima: Mutex::new(HashMap::new()),
    });
    for chunk in tokens.chunks(n_ctx.max(1)) {
        let linear: Arc<dyn Linear> = Arc::clone(&recorder) as Arc<dyn Linear>;
        // The f32 reference throughout, its cache included.
        let mut s = Session::new(Arc::clone(model), linear).with_kv_type(KvType::F32);
        s.prefill(chunk)?;
    }
    let maxima = std::mem::take(&mut *recorder.maxima.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(maxima)
}

/// What folding a block's factors does to one tensor.
enum Fold<'a> {
    /// Multiply the columns (input channels) by `s`.
    Columns(Cow<'a, [f32]>),
    /// Divide the rows (output channels; a vector's elements) by `s`.
    Rows(&'a [f32]),
}

/// Every fold of a set of factors, by tensor name.
struct Folds<'a> {
    /// Matmul weights.
    weights: HashMap<String, Vec<Fold<'a>>>,
    /// Norm weights and biases.
    vectors: HashMap<String, Vec<Fold<'a>>>,
}

/// The folds of `smoothing` into `model`'s tensors (module docs).
fn folds<'a>(model: &Model, smoothing: &'a [BlockSmoothing]) -> Result<Folds<'a>, ExecError> {
    check_blocks(model, smoothing)?;
    let c = model.config();
    let (group, dv) = (c.n_head / c.n_head_kv, c.head_dim_v);
    let mut weights: HashMap<String, Vec<Fold<'a>>> = HashMap::new();
    let mut vectors: HashMap<String, Vec<Fold<'a>>> = HashMap::new();
    for (i, (layer, b)) in model.layers.iter().zip(smoothing).enumerate() {
        let name = |r: Role| tensor_name(r, i).expect("roles in the table have names");
        vectors
            .entry(name(Role::AttnNorm))
            .or_default()
            .push(Fold::Rows(&b.attn));
        for w in layer.qkv.ids() {
            weights
                .entry(key(model, w))
                .or_default()
                .push(Fold::Columns(Cow::Borrowed(&b.attn)));
        }
        let gate_up: Vec<WeightId> = match &layer.ffn {
            FeedForward::Dense { gate, up, .. } => vec![*gate, *up],
            FeedForward::FusedDense { gate_up, .. } => vec![*gate_up],
            FeedForward::Moe(_) => Vec::new(),
        };
        if let (false, Some(f)) = (gate_up.is_empty(), &b.ffn) {
            vectors
                .entry(name(Role::FfnNorm))
                .or_default()
                .push(Fold::Rows(f));
            for w in gate_up {
                weights
                    .entry(key(model, w))
                    .or_default()
                    .push(Fold::Columns(Cow::Borrowed(f)));
            }
        }
        if let (Some(vo), QkvWeights::Separate([_, _, wv])) = (&b.vo, &layer.qkv) {
            weights
                .entry(key(model, *wv))
                .or_default()
                .push(Fold::Rows(vo));
            if layer.v_bias.is_some() {
                vectors
                    .entry(name(Role::AttnVBias))
                    .or_default()
                    .push(Fold::Rows(vo));
            }
            // Column (h, d) of attn_output reads q head h, which attends over kv head h / group.
            let per_head: Vec<f32> = (0..c.n_head)
                .flat_map(|h| vo[(h / group) * dv..][..dv].iter().copied())
                .collect();
            weights
                .entry(key(model, layer.wo))
                .or_default()
                .push(Fold::Columns(Cow::Owned(per_head)));
        }
        if let (FeedForward::Dense { up, down, .. }, Some(s)) = (&layer.ffn, &b.down) {
            weights
                .entry(key(model, *up))
                .or_default()
                .push(Fold::Rows(s));
            weights
                .entry(key(model, *down))
                .or_default()
                .push(Fold::Columns(Cow::Borrowed(s)));
        }
    }
    Ok(Folds { weights, vectors })
}

/// Apply `folds` to `values` (row-major, one row per output channel).
fn apply(values: &mut [f32], folds: &[Fold<'_>]) {
    for f in folds {
        match f {
            Fold::Columns(s) => {
                for row in values.chunks_exact_mut(s.len()) {
                    for (v, f) in row.iter_mut().zip(s.iter()) {
                        *v *= f;
                    }
                }
            }
            Fold::Rows(s) => {
                let k = values.len() / s.len();
                for (row, f) in values.chunks_exact_mut(k).zip(s.iter()) {
                    for v in row {
                        *v /= f;
                    }
                }
            }
        }
    }
}

/// Apply `smoothing` to the f32 weights of `reference` in place: the columns of q/k/v and
/// gate/up multiplied by `s` (and, where smoothed, the rows of v and up divided by theirs and
/// the columns of `attn_output` and `ffn_down` multiplied). With the norms (and v biases)
/// divided by `s` (as [`smoothed_gguf`] does), the block outputs equal the unsmoothed model's
/// up to f32 rounding.
///
/// # Errors
/// [`ExecError::UnknownWeight`] if `reference` lacks one of the weights;
/// [`ExecError::InvalidSmoothing`] if `smoothing` does not match the model's blocks.
pub fn smooth_reference(
    model: &Model,
    reference: &mut CpuF32Linear,
    smoothing: &[BlockSmoothing],
) -> Result<(), ExecError> {
    let folds = folds(model, smoothing)?;
    for (name, f) in &folds.weights {
        let w = model
            .manifest()
            .id(name)
            .and_then(|id| reference.weight_mut(id))
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: name.clone(),
            })?;
        apply(w, f);
    }
    Ok(())
}

fn check_blocks(model: &Model, smoothing: &[BlockSmoothing]) -> Result<(), ExecError> {
    let c = model.config();
    let d = c.n_embd;
    let heads_ok = c.n_head_kv > 0 && c.n_head.is_multiple_of(c.n_head_kv);
    let ok = smoothing.len() == model.layers.len()
        && smoothing.iter().zip(&model.layers).all(|(b, l)| {
            b.attn.len() == d
                && b.vo
                    .as_ref()
                    .is_none_or(|v| heads_ok && v.len() == c.n_head_kv * c.head_dim_v)
                && match (&b.ffn, &b.down, &l.ffn) {
                    (f, down, FeedForward::Dense { n_ff, .. }) => {
                        f.as_ref().is_none_or(|f| f.len() == d)
                            && down.as_ref().is_none_or(|s| s.len() == *n_ff)
                    }
                    (f, None, FeedForward::FusedDense { .. }) => {
                        f.as_ref().is_none_or(|f| f.len() == d)
                    }
                    (None, None, FeedForward::Moe(_)) => true,
                    (_, _, FeedForward::Moe(_) | FeedForward::FusedDense { .. }) => false,
                }
                && (b.vo.is_none() || matches!(l.qkv, QkvWeights::Separate(_)))
        });
    if ok {
        Ok(())
    } else {
        Err(ExecError::InvalidSmoothing {
            what: format!(
                "{} blocks of factors do not fit the model's {} blocks ({d} channels, {} kv \
                 heads of {}, feed-forward width {})",
                smoothing.len(),
                model.layers.len(),
                c.n_head_kv,
                c.head_dim_v,
                c.n_ff
            ),
        })
    }
}

/// A copy of `gguf` with `smoothing` folded in: each block's `attn_norm` (and `ffn_norm` for a
/// dense block) divided by `s`, and q/k/v (gate/up) with their columns multiplied by `s`; where
/// the block has `vo` / `down` factors, `attn_v`'s rows (and bias) and `ffn_up`'s rows divided
/// and `attn_output`'s and `ffn_down`'s columns multiplied. The changed tensors are stored as
/// f32 (every other tensor and key copied unchanged). `label` names the in-memory file in
/// errors.
///
/// # Errors
/// A tensor cannot be read, or the file cannot be built.
pub fn smoothed_gguf(
    gguf: &GgufFile,
    model: &Model,
    smoothing: &[BlockSmoothing],
    label: impl Into<std::path::PathBuf>,
) -> Result<GgufFile, ExecError> {
    let folds = folds(model, smoothing)?;
    // Every key; the tensors in their original order, the changed ones as f32.
    let mut order = GgufBuilder::from_file(gguf, |_| false, &[]);
    for t in gguf.tensors() {
        let Some(f) = folds
            .weights
            .get(&t.name)
            .or_else(|| folds.vectors.get(&t.name))
        else {
            order = order.tensor(&t.name, &t.dims, t.ty, gguf.tensor_data(t).to_vec());
            continue;
        };
        let mut values = gguf.dequantize_tensor(t).map_err(ExecError::from)?;
        apply(&mut values, f);
        order = order
            .tensor_f32(&t.name, &t.dims, GgmlType::F32, &values)
            .map_err(ExecError::from)?;
    }
    let bytes = order.to_bytes().map_err(ExecError::from)?;
    GgufFile::from_bytes(label, bytes).map_err(ExecError::from)
}
