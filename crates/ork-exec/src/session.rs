//! One conversation with a model: the KV cache and the forward pass.
use crate::linear::Linear;
use crate::model::Model;
use crate::ops::{attention, rms_norm, AttentionShape};
use crate::ExecError;
use std::sync::Arc;

/// A running sequence: a KV cache over one model, and the [`Linear`] that does its matmuls.
///
/// Tokens are appended with [`Session::prefill`] (a batch, causal within itself and attending to
/// everything cached before) and [`Session::decode`] (one token).
///
/// A session owns what it runs on: it holds `Arc`s of the model and of the matmul backend, so it
/// is `Send + 'static` and can be handed to another thread or an async task; the model and
/// backend live as long as any session using them.
pub struct Session {
    model: Arc<Model>,
    linear: Arc<dyn Linear>,
    context: usize,
    /// Per layer: `len × k_dim` keys (after RoPE) and `len × v_dim` values.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

/// Which positions of a forward pass produce logits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    Last,
    All,
}

impl Session {
    /// A session limited to the model's trained context length.
    pub fn new(model: Arc<Model>, linear: Arc<dyn Linear>) -> Session {
        let context = model.config().context_length;
        let n_layer = model.config().n_layer;
        Session {
            model,
            linear,
            context,
            keys: vec![Vec::new(); n_layer],
            values: vec![Vec::new(); n_layer],
            len: 0,
        }
    }

    /// A session with an explicit context length (e.g. `--ctx`); it may exceed the trained one.
    pub fn with_context(
        model: Arc<Model>,
        linear: Arc<dyn Linear>,
        context: usize,
    ) -> Result<Session, ExecError> {
        if context == 0 {
            return Err(ExecError::InvalidContext {
                context,
                what: "must be at least 1".to_owned(),
            });
        }
        let mut s = Session::new(model, linear);
        s.context = context;
        Ok(s)
    }

    /// The context length in force.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Number of positions in the KV cache (the position of the next token).
    pub fn position(&self) -> usize {
        self.len
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The matmul backend.
    pub fn linear(&self) -> &Arc<dyn Linear> {
        &self.linear
    }

    /// Forget every cached position.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Drop cached positions from `len` on.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        let c = self.model.config();
        for k in &mut self.keys {
            k.truncate(len * c.k_dim());
        }
        for v in &mut self.values {
            v.truncate(len * c.v_dim());
        }
        self.len = len;
    }

    /// Run `tokens` as one causal batch; returns the logits (`vocab` values) of the last token.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ExecError> {
        self.forward(tokens, Logits::Last)
    }

    /// Run one token; returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<Vec<f32>, ExecError> {
        self.forward(&[token], Logits::Last)
    }

    /// Run `tokens` as one causal batch; returns the logits of every position
    /// (`tokens.len() × vocab`, row-major), as perplexity needs.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ExecError> {
        self.forward(tokens, Logits::All)
    }

    fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ExecError> {
        if tokens.is_empty() {
            return Err(ExecError::EmptyPrompt);
        }
        let needed = self.len + tokens.len();
        if needed > self.context {
            return Err(ExecError::ContextOverflow {
                needed,
                context: self.context,
            });
        }
        let start = self.len;
        // The forward pass runs on a worker of the current rayon pool, so its parallel
        // operators and the device's matmul tasks fork onto that pool directly; called from a
        // thread outside it, each of them would inject a job and block on a latch instead
        // (hundreds of cross-thread wake-ups per decoded token).
        let result = if rayon::current_thread_index().is_some() {
            self.forward_inner(tokens, logits)
        } else {
            rayon::scope(|_| self.forward_inner(tokens, logits))
        };
        match result {
            Ok(out) => {
                self.len = start + tokens.len();
                Ok(out)
            }
            Err(e) => {
                // Keep the cache consistent: drop whatever layers appended before the failure.
                self.truncate(start);
                Err(e)
            }
        }
    }

    fn forward_inner(&mut self, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ExecError> {
        let model = Arc::clone(&self.model);
        let c = model.config();
        let m = tokens.len();
        let d = c.n_embd;
        let mut x = vec![0.0f32; m * d];
        model.embed(tokens, &mut x)?;
        let angles: Vec<_> = (0..m).map(|i| model.rope.angles(self.len + i)).collect();

        let mut h = vec![0.0f32; m * d];
        let mut q = vec![0.0f32; m * c.q_dim()];
        let mut k = vec![0.0f32; m * c.k_dim()];
        let mut v = vec![0.0f32; m * c.v_dim()];
        let mut attn = vec![0.0f32; m * c.attn_out_dim()];
        let mut proj = vec![0.0f32; m * d];
        let shape = AttentionShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
        };

        for (il, layer) in model.layers.iter().enumerate() {
            // Attention block.
            h.copy_from_slice(&x);
            rms_norm(&mut h, &layer.attn_norm, c.rms_eps);
            self.project(&layer.wq, &h, m, &mut q, layer.q_bias.as_deref())?;
            self.project(&layer.wk, &h, m, &mut k, layer.k_bias.as_deref())?;
            self.project(&layer.wv, &h, m, &mut v, layer.v_bias.as_deref())?;
            if let Some(w) = &layer.q_norm {
                rms_norm(&mut q, w, c.rms_eps);
            }
            if let Some(w) = &layer.k_norm {
                rms_norm(&mut k, w, c.rms_eps);
            }
            for (i, a) in angles.iter().enumerate() {
                model
                    .rope
                    .apply(&mut q[i * c.q_dim()..][..c.q_dim()], c.head_dim_k, a);
                model
                    .rope
                    .apply(&mut k[i * c.k_dim()..][..c.k_dim()], c.head_dim_k, a);
            }
            self.keys[il].extend_from_slice(&k);
            self.values[il].extend_from_slice(&v);
            attention(shape, &q, &self.keys[il], &self.values[il], m, &mut attn);
            self.linear.matmul(&layer.wo, &attn, m, &mut proj)?;
            add(&mut x, &proj);

            // Feed-forward block.
            h.copy_from_slice(&x);
            rms_norm(&mut h, &layer.ffn_norm, c.rms_eps);
            let next = model.layers.get(il + 1).map(|l| &l.ffn);
            layer
                .ffn
                .forward(self.linear.as_ref(), &h, m, &mut proj, next)?;
            add(&mut x, &proj);
        }

        let rows = match logits {
            Logits::All => &mut x[..],
            Logits::Last => &mut x[(m - 1) * d..],
        };
        let n_rows = rows.len() / d;
        rms_norm(rows, &model.output_norm, c.rms_eps);
        let mut out = vec![0.0f32; n_rows * c.vocab_size];
        self.linear
            .matmul(model.output_weight(), rows, n_rows, &mut out)?;
        Ok(out)
    }

    fn project(
        &self,
        weight: &str,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        bias: Option<&[f32]>,
    ) -> Result<(), ExecError> {
        self.linear.matmul(weight, x, m, y)?;
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(b.len()) {
                add(row, b);
            }
        }
        Ok(())
    }
}

fn add(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}
