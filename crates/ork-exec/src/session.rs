//! One conversation with a model: the KV cache and the forward pass.
use crate::gemma3::post_norm;
use crate::linear::{Linear, Phase};
use crate::model::Model;
use crate::ops::{rms_norm, AttentionShape};
use crate::ExecError;
use std::sync::Arc;

mod kv;
mod persist;
pub use kv::KvType;
use kv::LayerKv;

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
    /// Per layer: the keys (after RoPE) and values of the cached positions it holds (every one,
    /// but for a sliding-window layer only the last ones: [`LayerKv::start`]).
    kv: Vec<LayerKv>,
    kv_type: KvType,
    len: usize,
}

/// Which positions of a forward pass produce logits ([`BatchPart::logits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prompt chunk that does not end its prompt).
    None,
    /// The last token's (`vocab` values).
    Last,
    /// Every token's (`tokens.len() × vocab`, row-major): the verification of drafted tokens.
    All,
}

impl Session {
    /// A session limited to the model's trained context length.
    pub fn new(model: Arc<Model>, linear: Arc<dyn Linear>) -> Session {
        let context = model.config().context_length;
        let kv_type = KvType::default();
        let kv = LayerKv::all(kv_type, &model);
        Session {
            model,
            linear,
            context,
            kv,
            kv_type,
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

    /// This session with a cache of `kv_type` values; anything cached is dropped.
    pub fn with_kv_type(mut self, kv_type: KvType) -> Session {
        self.kv = LayerKv::all(kv_type, &self.model);
        self.kv_type = kv_type;
        self.len = 0;
        self
    }

    /// What the KV cache stores.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes the KV cache holds now: keys and values of every position held (a sliding-window
    /// layer holds only its last ones, docs/kv-cache.md).
    pub fn kv_bytes(&self) -> usize {
        let values: usize = self
            .kv
            .iter()
            .map(|l| l.keys.values() + l.values.values())
            .sum();
        values * self.kv_type.bytes()
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

    /// The shortest length other than 0 that [`Session::fork`] and [`Session::truncate`] can
    /// keep: 0 while every layer holds every position. A sliding-window layer drops positions
    /// older than its window (docs/kv-cache.md, "Sliding-window layers"), so that a prefix of
    /// `len` positions can be continued only while the keys its next position sees
    /// (`len - window + 1 ..`) are held. Right after a pass it is never more than the position
    /// before that pass, nor more than `position()` − min(window, 64).
    pub fn min_prefix(&self) -> usize {
        self.kv.iter().map(LayerKv::min_prefix).max().unwrap_or(0)
    }

    /// Whether [`Session::fork`] and [`Session::truncate`] can keep the first `len` positions
    /// (`len` beyond [`Session::position`] meaning all of them): `len` is 0, or at least
    /// [`Session::min_prefix`].
    pub fn can_fork(&self, len: usize) -> bool {
        let len = len.min(self.len);
        len == 0 || len >= self.min_prefix()
    }

    /// A new session holding a copy of this one's first `len` cached positions (at most all of
    /// them): a shared prefix another sequence continues from. Same model, matmul backend,
    /// context and cache type. A sliding-window layer copies only the last `window - 1`
    /// positions, which is all that the positions after `len` will read.
    ///
    /// # Errors
    /// [`ExecError::PrefixDropped`] unless [`Session::can_fork`]`(len)`.
    pub fn fork(&self, len: usize) -> Result<Session, ExecError> {
        let len = len.min(self.len);
        self.check_prefix(len)?;
        let c = self.model.config();
        let kv = self
            .kv
            .iter()
            .map(|l| {
                // Positions `from..len` of those held (`l.start..`), the new layer's `start`.
                let (from, start) = match l.window {
                    _ if len == 0 => (l.start, 0),
                    Some(w) => {
                        let from = len.saturating_sub(w - 1).max(l.start);
                        (from, from)
                    }
                    None => (0, 0),
                };
                let (at, to) = (from - l.start, len.max(from) - l.start);
                LayerKv {
                    keys: l.keys.range(at * c.head_dim_k, to * c.head_dim_k),
                    values: l.values.range(at * c.head_dim_v, to * c.head_dim_v),
                    window: l.window,
                    start,
                }
            })
            .collect();
        Ok(Session {
            model: Arc::clone(&self.model),
            linear: Arc::clone(&self.linear),
            context: self.context,
            kv,
            kv_type: self.kv_type,
            len,
        })
    }

    /// [`ExecError::PrefixDropped`] unless [`Session::can_fork`]`(len)`.
    fn check_prefix(&self, len: usize) -> Result<(), ExecError> {
        if self.can_fork(len) {
            Ok(())
        } else {
            Err(ExecError::PrefixDropped {
                len,
                min: self.min_prefix(),
                position: self.len,
            })
        }
    }

    /// Give back the memory the cache reserved beyond its positions (a session kept aside,
    /// e.g. as a reusable prefix, so that [`Session::kv_bytes`] is what it holds).
    pub fn shrink_to_fit(&mut self) {
        for l in &mut self.kv {
            l.keys.shrink();
            l.values.shrink();
        }
    }

    /// Whether this session and `other` compute the same keys and values for the same tokens
    /// — the same model, the same matmul backend, the same cache type, and contexts for which
    /// the RoPE uses the same frequency factors (LongRoPE picks them by the context) — so that
    /// positions cached by one are valid in the other.
    pub fn same_numbers(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.model, &other.model)
            && Arc::ptr_eq(&self.linear, &other.linear)
            && self.kv_type == other.kv_type
            && self.model.rope.uses_long_factors(self.context)
                == other.model.rope.uses_long_factors(other.context)
    }

    /// Forget every cached position.
    pub fn reset(&mut self) {
        self.cut(0);
    }

    /// Drop cached positions from `len` on (`len` beyond [`Session::position`]: none).
    ///
    /// Cutting back into the last pass, or by up to min(window, 64) positions after it, always
    /// works; further back, a session with sliding-window layers may have dropped the keys the
    /// next position would need (see [`Session::min_prefix`]).
    ///
    /// # Errors
    /// [`ExecError::PrefixDropped`] unless [`Session::can_fork`]`(len)`; the session is
    /// unchanged then.
    pub fn truncate(&mut self, len: usize) -> Result<(), ExecError> {
        let len = len.min(self.len);
        self.check_prefix(len)?;
        self.cut(len);
        Ok(())
    }

    /// Keep positions `..len` (`len` ≤ `position()`, and 0 or at least `min_prefix()`).
    fn cut(&mut self, len: usize) {
        let c = self.model.config();
        for l in &mut self.kv {
            l.cut(len, c);
        }
        self.len = len;
    }

    /// Run `tokens` as one causal batch ([`Phase::Prefill`]); returns the logits (`vocab`
    /// values) of the last token.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ExecError> {
        self.forward(tokens, Logits::Last, Phase::Prefill)
    }

    /// Run one token ([`Phase::Decode`]); returns its logits.
    pub fn decode(&mut self, token: u32) -> Result<Vec<f32>, ExecError> {
        self.forward(&[token], Logits::Last, Phase::Decode)
    }

    /// Run `tokens` as one causal batch ([`Phase::Prefill`]: perplexity, and the verification
    /// of drafted tokens); returns the logits of every position (`tokens.len() × vocab`,
    /// row-major).
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ExecError> {
        self.forward(tokens, Logits::All, Phase::Prefill)
    }

    /// Run a tree of tokens as one batch (tree verification in speculative decoding,
    /// `docs/speculative.md`): node `i` is `tokens[i]`, a child of node `parents[i]` (`None`: of
    /// the last cached position); a parent comes before its children. Node `i` sits at position
    /// `position() + depth(i)` and attends to the cached positions and to its own branch, so its
    /// logits are those of decoding its branch token by token. Returns the logits of every node
    /// (`tokens.len() × vocab`). The cache grows by every node, in `tokens` order; keep one
    /// branch with [`Session::keep_branch`]. A verification: [`Phase::Prefill`].
    ///
    /// # Errors
    /// [`ExecError::InvalidTree`] when `parents` does not describe such a tree of `tokens`, and
    /// as [`Session::forward_all`].
    pub fn forward_tree(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
    ) -> Result<Vec<f32>, ExecError> {
        if parents.len() != tokens.len() {
            return Err(ExecError::InvalidTree {
                what: format!("{} parents for {} tokens", parents.len(), tokens.len()),
            });
        }
        if let Some(i) = parents
            .iter()
            .enumerate()
            .position(|(i, p)| p.is_some_and(|p| p >= i))
        {
            return Err(ExecError::InvalidTree {
                what: format!(
                    "node {i}'s parent {} does not come before it",
                    parents[i].unwrap_or_default()
                ),
            });
        }
        let mut parts = [Part {
            session: self,
            tokens,
            logits: Logits::All,
            tree: Some(parents),
        }];
        let mut out = forward_parts(&mut parts, Phase::Prefill)?;
        Ok(out.pop().flatten().unwrap_or_default())
    }

    /// After [`Session::forward_tree`] appended a tree at position `base`, keep the branch
    /// `nodes` (tree node indices, root first, each the child of the one before) at positions
    /// `base..base + nodes.len()` and drop every other node.
    ///
    /// # Errors
    /// [`ExecError::InvalidTree`] unless `nodes` are increasing indices of cached positions after
    /// `base`; the cache is unchanged then.
    pub fn keep_branch(&mut self, base: usize, nodes: &[usize]) -> Result<(), ExecError> {
        let increasing = nodes.windows(2).all(|w| w[0] < w[1]);
        let last = nodes.last().map_or(base, |&n| base + n + 1);
        if !increasing || last > self.len || base > self.len {
            return Err(ExecError::InvalidTree {
                what: format!(
                    "keep nodes {nodes:?} after position {base} of a cache of {}",
                    self.len
                ),
            });
        }
        // The positions before the tree must still be held (always so for the last pass).
        if base < self.min_prefix() {
            return Err(ExecError::PrefixDropped {
                len: base,
                min: self.min_prefix(),
                position: self.len,
            });
        }
        let c = self.model.config();
        for (j, &n) in nodes.iter().enumerate() {
            let (from, to) = (base + n, base + j);
            if from == to {
                continue;
            }
            for l in &mut self.kv {
                let (from, to) = (from - l.start, to - l.start);
                l.keys.copy_position(from, to, c.head_dim_k);
                l.values.copy_position(from, to, c.head_dim_v);
            }
        }
        self.cut(base + nodes.len());
        Ok(())
    }

    /// One batched step over several sessions of the same model and matmul backend (continuous
    /// batching): every matmul runs once with `M` = the parts' tokens together, attention and
    /// RoPE per part against its own KV cache and positions. A part is one decode token, a
    /// prefill chunk, or a verification of drafted tokens (the last token and the drafts, with
    /// [`Logits::All`]). Returns, per part, the logits it asked for.
    ///
    /// Each part's results are those of running it alone ([`Session::prefill`] /
    /// [`Session::decode`]): every operator works row by row (the device quantizes activations
    /// per token), so the rows of other parts do not change a part's numbers.
    ///
    /// With a backend of one engine per phase ([`Linear::for_phase`]), the parts of each
    /// [`BatchPart::phase`] run as one pass on that phase's engine (decode parts first); with
    /// one engine, all parts run as one pass.
    ///
    /// # Errors
    /// [`ExecError::BatchMismatch`] for parts on different models or backends,
    /// [`ExecError::EmptyPrompt`] for a part without tokens, [`ExecError::ContextOverflow`] for
    /// a part beyond its context; a failure while running leaves every session as it was.
    pub fn step(parts: &mut [BatchPart<'_, '_>]) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
        let split = parts.first().is_some_and(|p| {
            let l = &p.session.linear;
            !same_engine(l.for_phase(Phase::Prefill), l.for_phase(Phase::Decode))
        });
        if !split {
            let mut all: Vec<Part<'_, '_>> = parts.iter_mut().map(Part::from).collect();
            return forward_parts(&mut all, Phase::Decode);
        }
        let n = parts.len();
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
        // Positions before this step, to roll back the first phase's parts if the second fails.
        let before: Vec<usize> = parts.iter().map(|p| p.session.len).collect();
        let mut done: Vec<usize> = Vec::with_capacity(n);
        for phase in [Phase::Decode, Phase::Prefill] {
            let index: Vec<usize> = (0..n).filter(|&i| parts[i].phase == phase).collect();
            if index.is_empty() {
                continue;
            }
            let mut group: Vec<Part<'_, '_>> = parts
                .iter_mut()
                .filter(|p| p.phase == phase)
                .map(Part::from)
                .collect();
            match forward_parts(&mut group, phase) {
                Ok(logits) => {
                    for (&i, l) in index.iter().zip(logits) {
                        out[i] = l;
                    }
                    done.extend(index);
                }
                Err(e) => {
                    for i in done {
                        parts[i].session.cut(before[i]);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        logits: Logits,
        phase: Phase,
    ) -> Result<Vec<f32>, ExecError> {
        let mut parts = [Part {
            session: self,
            tokens,
            logits,
            tree: None,
        }];
        let mut out = forward_parts(&mut parts, phase)?;
        Ok(out.pop().flatten().unwrap_or_default())
    }
}

/// Whether two phases' engines ([`Linear::for_phase`]) are the same one.
fn same_engine(a: Option<&dyn Linear>, b: Option<&dyn Linear>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => std::ptr::addr_eq(a as *const dyn Linear, b as *const dyn Linear),
        _ => false,
    }
}

/// One sequence's share of a batched step ([`Session::step`]).
pub struct BatchPart<'s, 't> {
    /// The sequence; its KV cache grows by `tokens`.
    pub session: &'s mut Session,
    /// One token for a decode step, or a chunk of a prompt.
    pub tokens: &'t [u32],
    /// Which logits to compute: the last token's, none (a prefill chunk that does not end its
    /// prompt, which saves the output matmul's rows), or every token's (a verification of
    /// drafted tokens, `Phase::Prefill`).
    pub logits: Logits,
    /// Which phase `tokens` are: a prompt chunk ([`Phase::Prefill`]) or the next token of a
    /// sequence past its prompt ([`Phase::Decode`]). A backend of one engine per phase runs
    /// the part on that phase's engine.
    pub phase: Phase,
}

impl<'s, 't> From<&'s mut BatchPart<'_, 't>> for Part<'s, 't> {
    fn from(p: &'s mut BatchPart<'_, 't>) -> Self {
        Part {
            session: &mut *p.session,
            tokens: p.tokens,
            logits: p.logits,
            tree: None,
        }
    }
}

/// A part of a forward pass: a session, the tokens it appends and the logits it wants.
struct Part<'s, 't> {
    session: &'s mut Session,
    tokens: &'t [u32],
    logits: Logits,
    /// A tree of tokens ([`Session::forward_tree`]): each token's parent in `tokens`.
    tree: Option<&'t [Option<usize>]>,
}

/// Check the parts, run them as one forward pass, and commit (or roll back) their caches.
/// The matmuls run on the backend's engine for `phase` ([`Linear::for_phase`]).
fn forward_parts(
    parts: &mut [Part<'_, '_>],
    phase: Phase,
) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
    let Some(first) = parts.first() else {
        return Ok(Vec::new());
    };
    let model = Arc::clone(&first.session.model);
    let linear = Arc::clone(&first.session.linear);
    for (i, p) in parts.iter().enumerate() {
        if !Arc::ptr_eq(&p.session.model, &model) || !Arc::ptr_eq(&p.session.linear, &linear) {
            return Err(ExecError::BatchMismatch { part: i });
        }
        if p.tokens.is_empty() {
            return Err(ExecError::EmptyPrompt);
        }
        let needed = p.session.len + p.tokens.len();
        if needed > p.session.context {
            return Err(ExecError::ContextOverflow {
                needed,
                context: p.session.context,
            });
        }
    }
    // The pass runs where the engine wants it (`Linear::run_pass`): on a worker of its
    // threads, so that its parallel operators and the matmul tasks fork onto them directly.
    let linear: &dyn Linear = linear.for_phase(phase).unwrap_or(&*linear);
    let mut result = None;
    linear.run_pass(&mut || result = Some(forward_inner(&model, linear, parts)));
    // An engine that did not run it (none here does) leaves it to this thread.
    let result = match result {
        Some(r) => r,
        None => forward_inner(&model, linear, parts),
    };
    match result {
        Ok(out) => {
            for p in parts.iter_mut() {
                let s = &mut *p.session;
                let base = s.len;
                s.len += p.tokens.len();
                // Sliding-window layers drop what they no longer need, but keep this pass (it
                // may be rolled back: a rejected draft, a tree's other branches).
                let c = s.model.config();
                for l in &mut s.kv {
                    l.drop_old(base, s.len, c);
                }
            }
            Ok(out)
        }
        Err(e) => {
            // Keep the caches consistent: drop whatever layers appended before the failure.
            for p in parts.iter_mut() {
                let len = p.session.len;
                p.session.cut(len);
            }
            Err(e)
        }
    }
}

fn forward_inner(
    model: &Model,
    linear: &dyn Linear,
    parts: &mut [Part<'_, '_>],
) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
    let c = model.config();
    let m: usize = parts.iter().map(|p| p.tokens.len()).sum();
    let d = c.n_embd;
    let mut x = vec![0.0f32; m * d];
    let positions = embed_parts(model, parts, &mut x)?;
    let angles: Vec<_> = positions
        .iter()
        .map(|&(p, context)| model.rope.angles(p, context))
        .collect();
    // gemma3: the embedding scale, and the local layers' own RoPE.
    let gemma3 = model.gemma3.as_ref();
    let local_angles: Vec<_> = gemma3.map_or(Vec::new(), |g| {
        g.scale_embeddings(&mut x);
        positions
            .iter()
            .map(|&(p, context)| g.rope_local.angles(p, context))
            .collect()
    });

    linear.record(ork_board::Event::Pass {
        tokens: m,
        context: parts[0].session.len,
    });
    let mut h = vec![0.0f32; m * d];
    let mut q = vec![0.0f32; m * c.q_dim()];
    let mut k = vec![0.0f32; m * c.k_dim()];
    let mut v = vec![0.0f32; m * c.v_dim()];
    let mut attn = vec![0.0f32; m * c.attn_out_dim()];
    let mut proj = vec![0.0f32; m * d];
    let (qd, kd) = (c.q_dim(), c.k_dim());

    for (il, layer) in model.layers.iter().enumerate() {
        // Attention block.
        h.copy_from_slice(&x);
        linear.record(ork_board::HostKind::norm(m, d));
        rms_norm(&mut h, &layer.attn_norm, c.rms_eps);
        layer.qkv.forward(linear, &h, m, [&mut q, &mut k, &mut v])?;
        add_bias(&mut q, layer.q_bias.as_deref());
        add_bias(&mut k, layer.k_bias.as_deref());
        add_bias(&mut v, layer.v_bias.as_deref());
        if let Some(w) = &layer.q_norm {
            rms_norm(&mut q, w, c.rms_eps);
        }
        if let Some(w) = &layer.k_norm {
            rms_norm(&mut k, w, c.rms_eps);
        }
        let angles = if layer.window.is_some() {
            &local_angles
        } else {
            &angles
        };
        for (i, a) in angles.iter().enumerate() {
            model.rope.apply(&mut q[i * qd..][..qd], c.head_dim_k, a);
            model.rope.apply(&mut k[i * kd..][..kd], c.head_dim_k, a);
        }
        if let Some(g) = gemma3 {
            g.scale_queries(&mut q);
        }
        // Each part attends over its own cache, its rows being the newest positions.
        attend_parts(model, linear, parts, il, [&q, &k, &v], &mut attn)?;
        linear.matmul(layer.wo, &attn, m, &mut proj)?;
        let post = layer.post_norms.as_ref();
        post_norm(&mut proj, post.map(|p| &p.attn[..]), c.rms_eps);
        add(&mut x, &proj);

        // Feed-forward block.
        h.copy_from_slice(&x);
        linear.record(ork_board::HostKind::norm(m, d));
        rms_norm(&mut h, &layer.ffn_norm, c.rms_eps);
        let next = model.layers.get(il + 1).map(|l| &l.ffn);
        layer.ffn.forward(linear, &h, m, &mut proj, next)?;
        post_norm(&mut proj, post.map(|p| &p.ffn[..]), c.rms_eps);
        add(&mut x, &proj);
    }

    output_logits(model, linear, parts, &x)
}

/// Embed every part's tokens into `x` (their rows in order); each row's (position, context):
/// a chain's rows follow its cache, a tree's rows sit at their depth below it.
fn embed_parts(
    model: &Model,
    parts: &[Part<'_, '_>],
    x: &mut [f32],
) -> Result<Vec<(usize, usize)>, ExecError> {
    let d = model.config().n_embd;
    let m: usize = parts.iter().map(|p| p.tokens.len()).sum();
    let mut positions = Vec::with_capacity(m);
    let mut row = 0;
    for p in parts.iter() {
        let n = p.tokens.len();
        model.embed(p.tokens, &mut x[row * d..(row + n) * d])?;
        match p.tree {
            None => positions.extend((0..n).map(|i| (p.session.len + i, p.session.context))),
            Some(parents) => {
                let mut depth: Vec<usize> = Vec::with_capacity(n);
                for par in parents {
                    let d = par.map_or(0, |q| depth[q] + 1);
                    depth.push(d);
                    positions.push((p.session.len + d, p.session.context));
                }
            }
        }
        row += n;
    }
    Ok(positions)
}

/// Layer `il`'s attention for every part: its rows of `k`/`v` appended to its own cache, its
/// rows of `q` attending over it into its rows of `attn`.
fn attend_parts(
    model: &Model,
    linear: &dyn Linear,
    parts: &mut [Part<'_, '_>],
    il: usize,
    [q, k, v]: [&[f32]; 3],
    attn: &mut [f32],
) -> Result<(), ExecError> {
    let c = model.config();
    let layer = &model.layers[il];
    let (qd, kd, vd, ad) = (c.q_dim(), c.k_dim(), c.v_dim(), c.attn_out_dim());
    let shape = AttentionShape {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim_k: c.head_dim_k,
        head_dim_v: c.head_dim_v,
    };
    let mut row = 0;
    for p in parts.iter_mut() {
        let (n, s) = (p.tokens.len(), &mut *p.session);
        let l = &mut s.kv[il];
        let range = |what: &'static str| {
            move |value| ExecError::KvRange {
                layer: il,
                what,
                value,
            }
        };
        l.keys
            .append(&k[row * kd..(row + n) * kd], c.head_dim_k)
            .map_err(range("key"))?;
        l.values
            .append(&v[row * vd..(row + n) * vd], c.head_dim_v)
            .map_err(range("value"))?;
        let (q_rows, out_rows) = (
            &q[row * qd..(row + n) * qd],
            &mut attn[row * ad..(row + n) * ad],
        );
        let window = layer.window.unwrap_or(usize::MAX);
        // A sliding-window layer holds positions `start..`: every key the batch's first row
        // sees (`len - window + 1 ..`), so attention over what is held, by offsets from its
        // end, is attention over every position.
        debug_assert!(l.start == 0 || l.start + window - 1 <= s.len);
        l.attend(shape, q_rows, n, p.tree, window, out_rows);
        linear.record(ork_board::HostKind::attention(
            n,
            s.len,
            layer.window,
            c.n_head,
            c.n_head_kv,
            c.head_dim_k,
            s.kv_type.bytes(),
        ));
        row += n;
    }
    Ok(())
}

/// The logits of the rows that produce them, the rows gathered so that the output matmul runs
/// once; one entry per part (`None` for a part that asked for none).
fn output_logits(
    model: &Model,
    linear: &dyn Linear,
    parts: &[Part<'_, '_>],
    x: &[f32],
) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
    let c = model.config();
    let d = c.n_embd;
    let gemma3 = model.gemma3.as_ref();
    let mut rows = Vec::new();
    let mut counts = Vec::with_capacity(parts.len());
    let mut row = 0;
    for p in parts.iter() {
        let n = p.tokens.len();
        let (from, count) = match p.logits {
            Logits::None => (row + n, 0),
            Logits::Last => (row + n - 1, 1),
            Logits::All => (row, n),
        };
        rows.extend_from_slice(&x[from * d..(from + count) * d]);
        counts.push(count);
        row += n;
    }
    let n_rows = rows.len() / d;
    let mut out = vec![0.0f32; n_rows * c.vocab_size];
    if n_rows > 0 {
        rms_norm(&mut rows, &model.output_norm, c.rms_eps);
        linear.matmul(model.output_weight(), &rows, n_rows, &mut out)?;
        if let Some(g) = gemma3 {
            g.cap_logits(&mut out);
        }
        linear.record(ork_board::HostKind::sample(n_rows, c.vocab_size));
    }
    let mut logits = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (p, count) in parts.iter().zip(counts) {
        logits.push((p.logits != Logits::None).then(|| {
            let part = out[at * c.vocab_size..(at + count) * c.vocab_size].to_vec();
            at += count;
            part
        }));
    }
    Ok(logits)
}

/// Add `bias` (one row) to every row of `y`.
fn add_bias(y: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(b.len()) {
            add(row, b);
        }
    }
}

fn add(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}
