//! A loaded model: configuration, the small f32 tensors (norms, biases), the embedding table
//! borrowed from the GGUF map, and the ids, names and shapes of the matmul weights a
//! [`crate::Linear`] must provide (ids from the model's manifest, see `docs/architecture.md`).
use crate::config::{Arch, ModelConfig, MoeConfig};
use crate::gemma3::{Gemma3, PostNorms};
use crate::moe::{Activation, Expert, FeedForward, MoeFfn, MoeStats, SharedExpert, Speculation};
use std::sync::atomic::Ordering;

/// Experts predicted beyond `k` by the speculative expert prefetch, by default.
const DEFAULT_SPECULATION_EXTRA: usize = 1;
use crate::fused::QkvWeights;
use crate::ops::Rope;
use crate::weights::{dequantize_tensor, tensor_info, RowTable, WeightSpec};
use crate::ExecError;
use ork_gguf::GgufFile;
use ork_manifest::{tensor_name, Manifest, Role, WeightId};
use std::sync::Arc;

/// The name of a tensor that is not per block (from the manifest's name table).
fn global(role: Role) -> String {
    tensor_name(role, 0).expect("roles in the table have names")
}

/// Per-block tensors held by the executor, and ids of the block's matmul weights.
#[derive(Clone)]
pub(crate) struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) q_bias: Option<Vec<f32>>,
    pub(crate) k_bias: Option<Vec<f32>>,
    pub(crate) v_bias: Option<Vec<f32>>,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    pub(crate) qkv: QkvWeights,
    pub(crate) wo: WeightId,
    pub(crate) ffn: FeedForward,
    /// gemma3: the norms after attention and after the feed-forward.
    pub(crate) post_norms: Option<PostNorms>,
    /// gemma3's local layers: keys a query sees, itself included (`None`: every earlier one).
    pub(crate) window: Option<usize>,
}

impl Layer {
    /// Every matmul weight of the block, to change in place.
    fn ids_mut(&mut self) -> Vec<&mut WeightId> {
        let mut ids = self.qkv.ids_mut();
        ids.push(&mut self.wo);
        match &mut self.ffn {
            FeedForward::Dense { gate, up, down, .. } => ids.extend([gate, up, down]),
            FeedForward::FusedDense { gate_up, down, .. } => ids.extend([gate_up, down]),
            FeedForward::Moe(moe) => {
                let moe = &mut **moe;
                ids.push(&mut moe.router);
                for e in &mut moe.experts {
                    ids.extend([&mut e.gate, &mut e.up, &mut e.down]);
                }
                if let Some(s) = &mut moe.shared {
                    ids.extend([&mut s.gate, &mut s.up, &mut s.down]);
                }
            }
        }
        ids
    }
}

/// A model ready to run. It holds an `Arc` of the GGUF it was loaded from (the embedding rows are
/// read from the map on demand), so it can be shared by many sessions on many threads.
pub struct Model {
    gguf: Arc<GgufFile>,
    embedding_name: String,
    config: ModelConfig,
    pub(crate) rope: Rope,
    pub(crate) layers: Vec<Layer>,
    pub(crate) output_norm: Vec<f32>,
    output_weight: WeightId,
    weights: Vec<WeightSpec>,
    /// The file's matmul weights: the id space of [`WeightSpec::id`].
    manifest: Arc<Manifest>,
    /// What a gemma3 model computes beyond the llama family (`crate::gemma3`).
    pub(crate) gemma3: Option<Gemma3>,
}

fn dims(k: usize, n: usize) -> [u64; 2] {
    [k as u64, n as u64]
}

impl Model {
    /// Read the configuration, refuse any tensor or `{arch}.` key the architecture's table
    /// (`ork_manifest::SUPPORTED`) does not list, and check that every tensor the architecture
    /// needs is present with the right shape. Small tensors are dequantized now; matmul weights are left to the
    /// [`crate::Linear`].
    pub fn load(file: &Arc<GgufFile>) -> Result<Model, ExecError> {
        let gguf: &GgufFile = file;
        let config = ModelConfig::from_gguf(gguf)?;
        // Nothing the architecture's table does not list is skipped quietly (docs/models.md).
        ork_manifest::check_understood(gguf)?;
        let c = &config;
        let embd_name = global(Role::TokenEmbd);
        // Checked now; read row by row later.
        RowTable::new(gguf, &embd_name, &dims(c.n_embd, c.vocab_size))?;

        let mut weights = Vec::new();
        // Expert slices (`TENSOR#EXPERT`) are checked by `load_moe` through their 3-D tensor.
        // Ids are provisional (the specs' indices) until every check has passed, so the
        // executor's own checks name a bad tensor before the manifest's do; then the manifest's.
        let mut spec = |name: String, k: usize, n: usize| -> Result<WeightId, ExecError> {
            if !name.contains('#') {
                tensor_info(gguf, &name, &dims(k, n))?;
            }
            let id = WeightId::provisional(weights.len() as u32);
            weights.push(WeightSpec { id, name, k, n });
            Ok(id)
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            layers.push(load_layer(gguf, c, i, &mut spec)?);
        }
        let output_norm = dequantize_tensor(gguf, &global(Role::OutputNorm), &[c.n_embd as u64])?;
        // Tied embeddings: without output.weight the embedding table is the output projection.
        let output_name = match global(Role::Output) {
            name if gguf.tensor(&name).is_some() => name,
            _ => embd_name.clone(),
        };
        let mut output_weight = spec(output_name, c.n_embd, c.vocab_size)?;
        let manifest = adopt_manifest_ids(gguf, &mut weights, &mut layers, &mut output_weight)?;
        let rope = crate::rope_factors::load_rope(gguf, c)?;
        let gemma3 = c.gemma3.as_ref().map(|g| Gemma3::new(c, g));
        Ok(Model {
            gemma3,
            config,
            rope,
            gguf: Arc::clone(file),
            embedding_name: embd_name,
            layers,
            output_norm,
            output_weight,
            weights,
            manifest: Arc::new(manifest),
        })
    }

    /// The first `n_layer` blocks of this model followed by its output norm and projection: an
    /// early-exit draft that runs on the model's own weights (`--draft self`,
    /// `docs/speculative.md`). Its matmul weights are a subset of this model's.
    ///
    /// # Errors
    /// [`ExecError::InvalidDraft`] unless `1 <= n_layer <= ` the model's block count.
    pub fn truncated(&self, n_layer: usize) -> Result<Model, ExecError> {
        if n_layer == 0 || n_layer > self.config.n_layer {
            return Err(ExecError::InvalidDraft {
                what: format!(
                    "a self draft of {n_layer} layers: the model has {} (use 1..={})",
                    self.config.n_layer, self.config.n_layer
                ),
            });
        }
        let mut layers = self.layers[..n_layer].to_vec();
        let mut used: Vec<WeightId> = layers
            .iter_mut()
            .flat_map(Layer::ids_mut)
            .map(|id| *id)
            .collect();
        used.push(self.output_weight);
        let weights = self
            .weights
            .iter()
            .filter(|w| used.contains(&w.id))
            .cloned()
            .collect();
        let mut config = self.config.clone();
        config.n_layer = n_layer;
        if let Some(g) = &mut config.gemma3 {
            g.local.truncate(n_layer);
        }
        Ok(Model {
            gemma3: self.gemma3.clone(),
            gguf: Arc::clone(&self.gguf),
            embedding_name: self.embedding_name.clone(),
            config,
            rope: self.rope.clone(),
            layers,
            output_norm: self.output_norm.clone(),
            output_weight: self.output_weight,
            weights,
            manifest: Arc::clone(&self.manifest),
        })
    }

    /// The GGUF it was loaded from.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Every matmul weight the forward pass asks the [`crate::Linear`] for, in first-use order
    /// (block 0's projections first, the output projection last).
    pub fn matmul_weights(&self) -> &[WeightSpec] {
        &self.weights
    }

    /// The manifest of the file's matmul weights, whose ids the [`crate::Linear`] is asked for
    /// (a truncated draft shares its model's).
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// Speculative expert prefetch in decode (MoE models; see docs/moe.md): `Some(extra)`
    /// predicts each block's top `k + extra` experts from the block before and announces them
    /// to the [`crate::Linear`]; `None` announces only the experts a router has chosen. A hint
    /// to a streaming backend only: results never change. Default `Some(1)`.
    pub fn set_expert_speculation(&self, extra: Option<usize>) {
        for l in &self.layers {
            if let FeedForward::Moe(m) = &l.ffn {
                m.speculation
                    .extra
                    .store(extra.unwrap_or(usize::MAX), Ordering::Relaxed);
            }
        }
    }

    /// Speculative expert prefetch counters summed over every MoE block and session (`None`
    /// for a dense model).
    pub fn moe_stats(&self) -> Option<MoeStats> {
        let mut total: Option<MoeStats> = None;
        for l in &self.layers {
            if let FeedForward::Moe(m) = &l.ffn {
                let s = m.speculation.stats();
                let t = total.get_or_insert_with(MoeStats::default);
                t.predicted_steps += s.predicted_steps;
                t.predictions += s.predictions;
                t.used += s.used;
                t.predicted_used += s.predicted_used;
                t.forwards += s.forwards;
                t.rows += s.rows;
                t.experts_run += s.experts_run;
            }
        }
        total
    }

    /// The output projection (`output.weight`, or `token_embd.weight` when tied).
    pub fn output_weight(&self) -> WeightId {
        self.output_weight
    }

    /// Embedding rows of `tokens` into `out` (`tokens.len() × n_embd`), dequantized straight
    /// from the GGUF.
    pub fn embed(&self, tokens: &[u32], out: &mut [f32]) -> Result<(), ExecError> {
        let d = self.config.n_embd;
        if out.len() != tokens.len() * d {
            return Err(ExecError::MatmulShape {
                weight: self.embedding_name.clone(),
                what: format!(
                    "output has {} values for {} tokens",
                    out.len(),
                    tokens.len()
                ),
            });
        }
        let embedding = RowTable::new(
            &self.gguf,
            &self.embedding_name,
            &dims(d, self.config.vocab_size),
        )?;
        for (&tok, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
            self.check_token(tok)?;
            embedding.dequantize_rows(tok as usize, row)?;
        }
        Ok(())
    }

    /// Error unless `token` is a valid id.
    pub(crate) fn check_token(&self, token: u32) -> Result<(), ExecError> {
        if (token as usize) < self.config.vocab_size {
            Ok(())
        } else {
            Err(ExecError::TokenOutOfRange {
                token,
                vocab: self.config.vocab_size,
            })
        }
    }
}

/// One id space: the manifest's, which the runtime's pack, plan and cache share. Every weight's
/// provisional id (its spec's index) becomes the manifest's id of its name.
fn adopt_manifest_ids(
    gguf: &GgufFile,
    weights: &mut [WeightSpec],
    layers: &mut [Layer],
    output_weight: &mut WeightId,
) -> Result<Manifest, ExecError> {
    let manifest = Manifest::from_gguf(gguf)?;
    let mut ids = Vec::with_capacity(weights.len());
    for w in weights.iter_mut() {
        w.id = manifest
            .id(&w.name)
            .ok_or_else(|| ExecError::MissingTensor {
                tensor: w.name.clone(),
            })?;
        ids.push(w.id);
    }
    for id in layers
        .iter_mut()
        .flat_map(Layer::ids_mut)
        .chain([output_weight])
    {
        *id = ids[id.index()];
    }
    Ok(manifest)
}

/// Block `i`'s vectors (dequantized now) and weight specs (through `spec`).
fn load_layer(
    gguf: &GgufFile,
    c: &ModelConfig,
    i: usize,
    spec: &mut impl FnMut(String, usize, usize) -> Result<WeightId, ExecError>,
) -> Result<Layer, ExecError> {
    let vector = |name: &str, len: usize| dequantize_tensor(gguf, name, &[len as u64]);
    let optional = |name: &str, len: usize| -> Result<Option<Vec<f32>>, ExecError> {
        if gguf.tensor(name).is_some() {
            vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    };
    let t = |role: Role| tensor_name(role, i).expect("roles in the table have names");
    let (q_bias, k_bias, v_bias) = match c.arch {
        // llama.cpp loads qwen2's (and qwen2moe's) q/k/v biases as required tensors.
        Arch::Qwen2 | Arch::Qwen2Moe => (
            Some(vector(&t(Role::AttnQBias), c.q_dim())?),
            Some(vector(&t(Role::AttnKBias), c.k_dim())?),
            Some(vector(&t(Role::AttnVBias), c.v_dim())?),
        ),
        // llama.cpp accepts optional biases for llama; qwen3 has none.
        Arch::Llama => (
            optional(&t(Role::AttnQBias), c.q_dim())?,
            optional(&t(Role::AttnKBias), c.k_dim())?,
            optional(&t(Role::AttnVBias), c.v_dim())?,
        ),
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3 | Arch::Gemma3 => (None, None, None),
    };
    let (q_norm, k_norm) = match c.arch {
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => (
            Some(vector(&t(Role::AttnQNorm), c.head_dim_k)?),
            Some(vector(&t(Role::AttnKNorm), c.head_dim_k)?),
        ),
        Arch::Llama | Arch::Qwen2 | Arch::Qwen2Moe | Arch::Phi3 => (None, None),
    };
    // phi3 may fuse q/k/v (llama.cpp's `create_tensor_qkv` takes `attn_qkv` when present, else
    // the three); its table is the only one listing `attn_qkv`.
    let qkv = if c.arch == Arch::Phi3 && gguf.tensor(&t(Role::AttnQkv)).is_some() {
        let n = c.q_dim() + c.k_dim() + c.v_dim();
        QkvWeights::Fused(spec(t(Role::AttnQkv), c.n_embd, n)?)
    } else {
        QkvWeights::Separate([
            spec(t(Role::AttnQ), c.n_embd, c.q_dim())?,
            spec(t(Role::AttnK), c.n_embd, c.k_dim())?,
            spec(t(Role::AttnV), c.n_embd, c.v_dim())?,
        ])
    };
    let wo = spec(t(Role::AttnOutput), c.attn_out_dim(), c.n_embd)?;
    let ffn = load_ffn(gguf, c, i, spec)?;
    Ok(Layer {
        attn_norm: vector(&t(Role::AttnNorm), c.n_embd)?,
        ffn_norm: vector(&t(Role::FfnNorm), c.n_embd)?,
        q_bias,
        k_bias,
        v_bias,
        q_norm,
        k_norm,
        qkv,
        wo,
        ffn,
        post_norms: match c.arch {
            Arch::Gemma3 => Some(PostNorms {
                attn: vector(&t(Role::AttnPostNorm), c.n_embd)?,
                ffn: vector(&t(Role::FfnPostNorm), c.n_embd)?,
            }),
            _ => None,
        },
        window: c
            .gemma3
            .as_ref()
            .and_then(|g| g.window.filter(|_| g.local[i])),
    })
}

/// Block `i`'s feed-forward: dense, phi3's fused gate/up, or experts.
fn load_ffn(
    gguf: &GgufFile,
    c: &ModelConfig,
    i: usize,
    spec: &mut impl FnMut(String, usize, usize) -> Result<WeightId, ExecError>,
) -> Result<FeedForward, ExecError> {
    let t = |role: Role| tensor_name(role, i).expect("roles in the table have names");
    Ok(match &c.moe {
        // phi3's `ffn_up` holds the gate rows then the up rows; it has no `ffn_gate`.
        None if c.arch == Arch::Phi3 => FeedForward::FusedDense {
            gate_up: spec(t(Role::FfnUp), c.n_embd, 2 * c.n_ff)?,
            down: spec(t(Role::FfnDown), c.n_ff, c.n_embd)?,
            n_ff: c.n_ff,
        },
        None => {
            if gguf.tensor(&t(Role::Router)).is_some() {
                return Err(ExecError::ExpertMismatch {
                    tensor: t(Role::Router),
                    key: format!("{}.expert_count", c.arch.name()),
                    what: "the block has a router, but the key says the model is dense \
                           (absent or 0)"
                        .to_owned(),
                });
            }
            FeedForward::Dense {
                gate: spec(t(Role::FfnGate), c.n_embd, c.n_ff)?,
                up: spec(t(Role::FfnUp), c.n_embd, c.n_ff)?,
                down: spec(t(Role::FfnDown), c.n_ff, c.n_embd)?,
                n_ff: c.n_ff,
                act: if c.arch == Arch::Gemma3 {
                    Activation::GeluTanh
                } else {
                    Activation::Silu
                },
            }
        }
        Some(moe) => FeedForward::Moe(Box::new(load_moe(gguf, c, moe, i, spec)?)),
    })
}

/// The MoE feed-forward of block `layer`: router, expert tensors (checked against the expert
/// keys, each error naming the tensor and the key) and qwen2moe's shared expert. `spec` records
/// each matmul weight in first-use order: router, shared expert, then expert by expert.
fn load_moe(
    gguf: &GgufFile,
    c: &ModelConfig,
    moe: &MoeConfig,
    layer: usize,
    spec: &mut impl FnMut(String, usize, usize) -> Result<WeightId, ExecError>,
) -> Result<MoeFfn, ExecError> {
    let t = |role: Role| tensor_name(role, layer).expect("roles in the table have names");
    let count_key = format!("{}.expert_count", c.arch.name());
    let (e, d) = (moe.n_expert as u64, c.n_embd as u64);
    let router_name = t(Role::Router);
    let router = gguf
        .tensor(&router_name)
        .ok_or_else(|| ExecError::MissingTensor {
            tensor: router_name.clone(),
        })?;
    match router.dims[..] {
        [k, n] if k == d && n == e => {}
        [k, n] if k == d => {
            return Err(expert_mismatch(
                &router_name,
                &count_key,
                format!("the router scores {n} experts, the key says {e}"),
            ))
        }
        _ => return Err(shape_error(&router_name, vec![d, e], &router.dims)),
    }
    let router = spec(router_name, c.n_embd, moe.n_expert)?;
    let shared = match moe.n_ff_shexp {
        None => None,
        Some(n_ff) => Some(load_shared_expert(gguf, c, n_ff, layer, spec)?),
    };
    let names = check_expert_tensors(gguf, c, moe, layer)?;
    let mut experts = Vec::with_capacity(moe.n_expert);
    for x in 0..moe.n_expert {
        let key = |i: usize| format!("{}#{x}", names[i]);
        experts.push(Expert {
            gate: spec(key(0), c.n_embd, moe.n_ff_exp)?,
            up: spec(key(1), c.n_embd, moe.n_ff_exp)?,
            down: spec(key(2), moe.n_ff_exp, c.n_embd)?,
        });
    }
    Ok(MoeFfn {
        router,
        experts,
        shared,
        n_used: moe.n_expert_used,
        n_ff_exp: moe.n_ff_exp,
        renormalize: moe.renormalize,
        weights_scale: moe.weights_scale,
        speculation: Speculation::new(DEFAULT_SPECULATION_EXTRA),
    })
}

/// A tensor whose shape disagrees with an expert key.
fn expert_mismatch(tensor: &str, key: &str, what: String) -> ExecError {
    ExecError::ExpertMismatch {
        tensor: tensor.to_owned(),
        key: key.to_owned(),
        what,
    }
}

/// A tensor of the wrong shape.
fn shape_error(tensor: &str, expected: Vec<u64>, found: &[u64]) -> ExecError {
    ExecError::TensorShape {
        tensor: tensor.to_owned(),
        expected,
        found: found.to_vec(),
    }
}

/// Block `layer`'s shared expert of width `n_ff`: its gate vector (dequantized now) and its
/// gate/up/down weights, checked against `{arch}.expert_shared_feed_forward_length`.
fn load_shared_expert(
    gguf: &GgufFile,
    c: &ModelConfig,
    n_ff: usize,
    layer: usize,
    spec: &mut impl FnMut(String, usize, usize) -> Result<WeightId, ExecError>,
) -> Result<SharedExpert, ExecError> {
    let t = |role: Role| tensor_name(role, layer).expect("roles in the table have names");
    let d = c.n_embd as u64;
    let gate_inp = t(Role::SharedExpertGateInp);
    let found = gguf
        .tensor(&gate_inp)
        .ok_or_else(|| ExecError::MissingTensor {
            tensor: gate_inp.clone(),
        })?;
    // gguf-py writes the gate vector as [n_embd] (llama.cpp also accepts [n_embd, 1]).
    if found.dims != [d] && found.dims != [d, 1] {
        return Err(shape_error(&gate_inp, vec![d], &found.dims));
    }
    let gate_inp_values = dequantize_tensor(gguf, &gate_inp, &found.dims.clone())?;
    let sff_key = format!("{}.expert_shared_feed_forward_length", c.arch.name());
    let sff = n_ff as u64;
    for (role, k, n) in [
        (Role::SharedExpertGate, d, sff),
        (Role::SharedExpertUp, d, sff),
        (Role::SharedExpertDown, sff, d),
    ] {
        let name = t(role);
        let info = gguf.tensor(&name).ok_or_else(|| ExecError::MissingTensor {
            tensor: name.clone(),
        })?;
        if info.dims.len() == 2 && info.dims != [k, n] && info.dims.contains(&d) {
            return Err(expert_mismatch(
                &name,
                &sff_key,
                format!("dims {:?}, the key implies {:?}", info.dims, [k, n]),
            ));
        }
    }
    Ok(SharedExpert {
        gate: spec(t(Role::SharedExpertGate), c.n_embd, n_ff)?,
        up: spec(t(Role::SharedExpertUp), c.n_embd, n_ff)?,
        down: spec(t(Role::SharedExpertDown), n_ff, c.n_embd)?,
        n_ff,
        gate_inp: gate_inp_values,
    })
}

/// Block `layer`'s gate/up/down expert tensors: [K, N, n_expert] for gate/up
/// ([n_embd, n_ff_exp, E]) and down ([n_ff_exp, n_embd, E]), agreeing with the expert keys and
/// splitting evenly into experts. Returns their names.
fn check_expert_tensors(
    gguf: &GgufFile,
    c: &ModelConfig,
    moe: &MoeConfig,
    layer: usize,
) -> Result<Vec<String>, ExecError> {
    let t = |role: Role| tensor_name(role, layer).expect("roles in the table have names");
    let p = c.arch.name();
    let count_key = format!("{p}.expert_count");
    let ff_key = if c.arch == Arch::Llama {
        format!("{p}.feed_forward_length")
    } else {
        format!("{p}.expert_feed_forward_length")
    };
    let (e, ff, d) = (moe.n_expert as u64, moe.n_ff_exp as u64, c.n_embd as u64);
    let mut names = Vec::with_capacity(3);
    for (role, down) in [
        (Role::ExpertGate, false),
        (Role::ExpertUp, false),
        (Role::ExpertDown, true),
    ] {
        let name = t(role);
        let info = gguf.tensor(&name).ok_or_else(|| ExecError::MissingTensor {
            tensor: name.clone(),
        })?;
        let expected = if down { vec![ff, d, e] } else { vec![d, ff, e] };
        let [k, n, experts] = info.dims[..] else {
            return Err(shape_error(&name, expected, &info.dims));
        };
        let (width, ff_found) = if down { (n, k) } else { (k, n) };
        if width != d {
            return Err(shape_error(&name, expected, &info.dims));
        }
        if experts != e {
            return Err(expert_mismatch(
                &name,
                &count_key,
                format!("the tensor holds {experts} experts, the key says {e}"),
            ));
        }
        if ff_found != ff {
            return Err(expert_mismatch(
                &name,
                &ff_key,
                format!("experts are {ff_found} wide, the key says {ff}"),
            ));
        }
        if !info.size.is_multiple_of(e) {
            return Err(ExecError::TensorData {
                tensor: name,
                what: format!("{} bytes do not split into {e} experts", info.size),
            });
        }
        names.push(name);
    }
    Ok(names)
}
