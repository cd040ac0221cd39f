//! A loaded model: configuration, the small f32 tensors (norms, biases), the embedding table
//! borrowed from the GGUF map, and the names and shapes of the matmul weights a [`crate::Linear`]
//! must provide.
use crate::config::{Arch, ModelConfig};
use crate::ops::Rope;
use crate::weights::{dequantize_tensor, tensor_info, RowTable, WeightSpec};
use crate::ExecError;
use ork_gguf::GgufFile;
use ork_manifest::{tensor_name, Role};
use std::sync::Arc;

/// The name of a tensor that is not per block (from the manifest's name table).
fn global(role: Role) -> String {
    tensor_name(role, 0).expect("roles in the table have names")
}

/// Per-block tensors held by the executor, and names of the block's matmul weights.
#[derive(Clone)]
pub(crate) struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) q_bias: Option<Vec<f32>>,
    pub(crate) k_bias: Option<Vec<f32>>,
    pub(crate) v_bias: Option<Vec<f32>>,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    pub(crate) wq: String,
    pub(crate) wk: String,
    pub(crate) wv: String,
    pub(crate) wo: String,
    pub(crate) w_gate: String,
    pub(crate) w_up: String,
    pub(crate) w_down: String,
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
    output_weight: String,
    weights: Vec<WeightSpec>,
}

fn dims(k: usize, n: usize) -> [u64; 2] {
    [k as u64, n as u64]
}

impl Model {
    /// Read the configuration and check that every tensor the architecture needs is present with
    /// the right shape. Small tensors are dequantized now; matmul weights are left to the
    /// [`crate::Linear`].
    pub fn load(file: &Arc<GgufFile>) -> Result<Model, ExecError> {
        let gguf: &GgufFile = file;
        let config = ModelConfig::from_gguf(gguf)?;
        let c = &config;
        let embd_name = global(Role::TokenEmbd);
        // Checked now; read row by row later.
        RowTable::new(gguf, &embd_name, &dims(c.n_embd, c.vocab_size))?;

        let mut weights = Vec::new();
        let mut spec = |name: String, k: usize, n: usize| -> Result<String, ExecError> {
            tensor_info(gguf, &name, &dims(k, n))?;
            weights.push(WeightSpec {
                name: name.clone(),
                k,
                n,
            });
            Ok(name)
        };
        let vector = |name: &str, len: usize| dequantize_tensor(gguf, name, &[len as u64]);
        let optional = |name: &str, len: usize| -> Result<Option<Vec<f32>>, ExecError> {
            if gguf.tensor(name).is_some() {
                vector(name, len).map(Some)
            } else {
                Ok(None)
            }
        };

        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let t = |role: Role| tensor_name(role, i).expect("roles in the table have names");
            let (q_bias, k_bias, v_bias) = match c.arch {
                // llama.cpp loads qwen2's q/k/v biases as required tensors.
                Arch::Qwen2 => (
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
                Arch::Qwen3 => (None, None, None),
            };
            let (q_norm, k_norm) = match c.arch {
                Arch::Qwen3 => (
                    Some(vector(&t(Role::AttnQNorm), c.head_dim_k)?),
                    Some(vector(&t(Role::AttnKNorm), c.head_dim_k)?),
                ),
                Arch::Llama | Arch::Qwen2 => (None, None),
            };
            layers.push(Layer {
                attn_norm: vector(&t(Role::AttnNorm), c.n_embd)?,
                ffn_norm: vector(&t(Role::FfnNorm), c.n_embd)?,
                q_bias,
                k_bias,
                v_bias,
                q_norm,
                k_norm,
                wq: spec(t(Role::AttnQ), c.n_embd, c.q_dim())?,
                wk: spec(t(Role::AttnK), c.n_embd, c.k_dim())?,
                wv: spec(t(Role::AttnV), c.n_embd, c.v_dim())?,
                wo: spec(t(Role::AttnOutput), c.attn_out_dim(), c.n_embd)?,
                w_gate: spec(t(Role::FfnGate), c.n_embd, c.n_ff)?,
                w_up: spec(t(Role::FfnUp), c.n_embd, c.n_ff)?,
                w_down: spec(t(Role::FfnDown), c.n_ff, c.n_embd)?,
            });
        }
        let output_norm = vector(&global(Role::OutputNorm), c.n_embd)?;
        // Tied embeddings: without output.weight the embedding table is the output projection.
        let output_name = match global(Role::Output) {
            name if gguf.tensor(&name).is_some() => name,
            _ => embd_name.clone(),
        };
        let output_weight = spec(output_name, c.n_embd, c.vocab_size)?;

        let rope = Rope::new(c.arch.rope_style(), c.n_rot, c.rope_base, c.rope_freq_scale);
        Ok(Model {
            config,
            rope,
            gguf: Arc::clone(file),
            embedding_name: embd_name,
            layers,
            output_norm,
            output_weight,
            weights,
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
        let layers = self.layers[..n_layer].to_vec();
        let mut used: Vec<&str> = layers
            .iter()
            .flat_map(|l| {
                [
                    l.wq.as_str(),
                    l.wk.as_str(),
                    l.wv.as_str(),
                    l.wo.as_str(),
                    l.w_gate.as_str(),
                    l.w_up.as_str(),
                    l.w_down.as_str(),
                ]
            })
            .collect();
        used.push(&self.output_weight);
        let weights = self
            .weights
            .iter()
            .filter(|w| used.contains(&w.name.as_str()))
            .cloned()
            .collect();
        let mut config = self.config.clone();
        config.n_layer = n_layer;
        Ok(Model {
            gguf: Arc::clone(&self.gguf),
            embedding_name: self.embedding_name.clone(),
            config,
            rope: self.rope.clone(),
            layers,
            output_norm: self.output_norm.clone(),
            output_weight: self.output_weight.clone(),
            weights,
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

    /// Name of the output projection (`output.weight`, or `token_embd.weight` when tied).
    pub fn output_weight(&self) -> &str {
        &self.output_weight
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
