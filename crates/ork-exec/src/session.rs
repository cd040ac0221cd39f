//! One conversation with a model: the KV cache and the forward pass.
use crate::linear::Linear;
use crate::model::Model;
use crate::ops::{attention, attention_tree, rms_norm, AttentionShape, KvValue};
use crate::ExecError;
use half::f16;
use half::slice::HalfFloatSliceExt;
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
    /// Per layer: the keys (after RoPE) and values of every cached position.
    kv: Vec<LayerKv>,
    kv_type: KvType,
    len: usize,
}

/// What a session's KV cache stores (`docs/kv-cache.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// IEEE half precision, rounded to nearest (llama.cpp's default cache type): half the bytes
    /// of f32 to hold and to read at every token.
    #[default]
    F16,
    /// f32: the values as computed, for exact comparisons with an f32 reference.
    F32,
}

impl KvType {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
}

/// One layer's keys or values: per key/value head, `len × head_dim` values, position after
/// position, so that attention reads a head's rows as one stream (`docs/kv-cache.md`).
#[derive(Clone)]
enum Heads {
    F16(Vec<Vec<f16>>),
    F32(Vec<Vec<f32>>),
}

impl Heads {
    fn new(kind: KvType, n_kv: usize) -> Heads {
        match kind {
            KvType::F16 => Heads::F16(vec![Vec::new(); n_kv]),
            KvType::F32 => Heads::F32(vec![Vec::new(); n_kv]),
        }
    }

    /// Append `rows` (`n × (n_kv·d)`, position-major as the projections give them).
    ///
    /// # Errors
    /// A finite value too large for f16 (|x| ≥ 65520, which rounds to infinity): the first
    /// such value. The caller rolls the cache back.
    fn append(&mut self, rows: &[f32], d: usize) -> Result<(), f32> {
        fn each<T>(
            heads: &mut [Vec<T>],
            rows: &[f32],
            d: usize,
            put: impl Fn(&mut Vec<T>, &[f32]) -> Result<(), f32>,
        ) -> Result<(), f32> {
            let width = (heads.len() * d).max(1);
            for row in rows.chunks_exact(width) {
                for (head, x) in heads.iter_mut().zip(row.chunks_exact(d.max(1))) {
                    put(head, x)?;
                }
            }
            Ok(())
        }
        match self {
            Heads::F16(h) => each(h, rows, d, |head, x| {
                let at = head.len();
                head.resize(at + x.len(), f16::ZERO);
                head[at..].convert_from_f32_slice(x);
                match head[at..]
                    .iter()
                    .zip(x)
                    .find(|(h, x)| h.is_infinite() && x.is_finite())
                {
                    Some((_, &x)) => Err(x),
                    None => Ok(()),
                }
            }),
            Heads::F32(h) => each(h, rows, d, |head, x| {
                head.extend_from_slice(x);
                Ok(())
            }),
        }
    }

    /// Values held, over every head.
    fn values(&self) -> usize {
        match self {
            Heads::F16(h) => h.iter().map(Vec::len).sum(),
            Heads::F32(h) => h.iter().map(Vec::len).sum(),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Heads::F16(h) => h.iter_mut().for_each(|h| h.truncate(len)),
            Heads::F32(h) => h.iter_mut().for_each(|h| h.truncate(len)),
        }
    }

    /// Give back the memory reserved beyond the values held.
    fn shrink(&mut self) {
        match self {
            Heads::F16(h) => h.iter_mut().for_each(Vec::shrink_to_fit),
            Heads::F32(h) => h.iter_mut().for_each(Vec::shrink_to_fit),
        }
    }

    /// The first `len` values of every head, copied.
    fn prefix(&self, len: usize) -> Heads {
        fn each<T: Clone>(h: &[Vec<T>], len: usize) -> Vec<Vec<T>> {
            h.iter().map(|h| h[..len.min(h.len())].to_vec()).collect()
        }
        match self {
            Heads::F16(h) => Heads::F16(each(h, len)),
            Heads::F32(h) => Heads::F32(each(h, len)),
        }
    }

    /// Copy the `d` values at position `from` over those at position `to`.
    fn copy_position(&mut self, from: usize, to: usize, d: usize) {
        match self {
            Heads::F16(h) => h
                .iter_mut()
                .for_each(|h| h.copy_within(from * d..(from + 1) * d, to * d)),
            Heads::F32(h) => h
                .iter_mut()
                .for_each(|h| h.copy_within(from * d..(from + 1) * d, to * d)),
        }
    }
}

/// One layer's KV cache.
#[derive(Clone)]
struct LayerKv {
    keys: Heads,
    values: Heads,
}

impl LayerKv {
    fn new(kind: KvType, c: &crate::config::ModelConfig) -> LayerKv {
        LayerKv {
            keys: Heads::new(kind, c.n_head_kv),
            values: Heads::new(kind, c.n_head_kv),
        }
    }

    /// Attention of the last rows (`tree`: the nodes of a tree) over this layer's cache.
    fn attend(
        &self,
        shape: AttentionShape,
        q: &[f32],
        m: usize,
        tree: Option<&[Option<usize>]>,
        out: &mut [f32],
    ) {
        fn run<T: KvValue>(
            shape: AttentionShape,
            q: &[f32],
            k: &[Vec<T>],
            v: &[Vec<T>],
            m: usize,
            tree: Option<&[Option<usize>]>,
            out: &mut [f32],
        ) {
            let k: Vec<&[T]> = k.iter().map(Vec::as_slice).collect();
            let v: Vec<&[T]> = v.iter().map(Vec::as_slice).collect();
            match tree {
                None => attention(shape, q, &k, &v, m, out),
                Some(parents) => attention_tree(shape, q, &k, &v, parents, out),
            }
        }
        match (&self.keys, &self.values) {
            (Heads::F16(k), Heads::F16(v)) => run(shape, q, k, v, m, tree, out),
            (Heads::F32(k), Heads::F32(v)) => run(shape, q, k, v, m, tree, out),
            // Both are made together by `LayerKv::new`, of one type.
            _ => unreachable!("keys and values of one layer have one type"),
        }
    }
}

/// Which positions of a forward pass produce logits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    None,
    Last,
    All,
}

impl Session {
    /// A session limited to the model's trained context length.
    pub fn new(model: Arc<Model>, linear: Arc<dyn Linear>) -> Session {
        let context = model.config().context_length;
        let kv_type = KvType::default();
        let kv = vec![LayerKv::new(kv_type, model.config()); model.config().n_layer];
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
        let c = self.model.config();
        self.kv = vec![LayerKv::new(kv_type, c); c.n_layer];
        self.kv_type = kv_type;
        self.len = 0;
        self
    }

    /// What the KV cache stores.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes the KV cache holds now: keys and values of every cached position.
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

    /// A new session holding a copy of this one's first `len` cached positions (at most all of
    /// them): a shared prefix another sequence continues from. Same model, matmul backend,
    /// context and cache type.
    pub fn fork(&self, len: usize) -> Session {
        let len = len.min(self.len);
        let c = self.model.config();
        Session {
            model: Arc::clone(&self.model),
            linear: Arc::clone(&self.linear),
            context: self.context,
            kv: self
                .kv
                .iter()
                .map(|l| LayerKv {
                    keys: l.keys.prefix(len * c.head_dim_k),
                    values: l.values.prefix(len * c.head_dim_v),
                })
                .collect(),
            kv_type: self.kv_type,
            len,
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
    /// — the same model, the same matmul backend and the same cache type — so that positions
    /// cached by one are valid in the other.
    pub fn same_numbers(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.model, &other.model)
            && Arc::ptr_eq(&self.linear, &other.linear)
            && self.kv_type == other.kv_type
    }

    /// Forget every cached position.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Drop cached positions from `len` on.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        let c = self.model.config();
        for l in &mut self.kv {
            l.keys.truncate(len * c.head_dim_k);
            l.values.truncate(len * c.head_dim_v);
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

    /// Run a tree of tokens as one batch (tree verification in speculative decoding,
    /// `docs/speculative.md`): node `i` is `tokens[i]`, a child of node `parents[i]` (`None`: of
    /// the last cached position); a parent comes before its children. Node `i` sits at position
    /// `position() + depth(i)` and attends to the cached positions and to its own branch, so its
    /// logits are those of decoding its branch token by token. Returns the logits of every node
    /// (`tokens.len() × vocab`). The cache grows by every node, in `tokens` order; keep one
    /// branch with [`Session::keep_branch`].
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
        let mut out = forward_parts(&mut parts)?;
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
        let c = self.model.config();
        for (j, &n) in nodes.iter().enumerate() {
            let (from, to) = (base + n, base + j);
            if from == to {
                continue;
            }
            for l in &mut self.kv {
                l.keys.copy_position(from, to, c.head_dim_k);
                l.values.copy_position(from, to, c.head_dim_v);
            }
        }
        self.truncate(base + nodes.len());
        Ok(())
    }

    /// One batched step over several sessions of the same model and matmul backend (continuous
    /// batching): every matmul runs once with `M` = the parts' tokens together, attention and
    /// RoPE per part against its own KV cache and positions. A part is one decode token or a
    /// prefill chunk. Returns, per part, the logits of its last token when it asked for them.
    ///
    /// Each part's results are those of running it alone ([`Session::prefill`] /
    /// [`Session::decode`]): every operator works row by row (the device quantizes activations
    /// per token), so the rows of other parts do not change a part's numbers.
    ///
    /// # Errors
    /// [`ExecError::BatchMismatch`] for parts on different models or backends,
    /// [`ExecError::EmptyPrompt`] for a part without tokens, [`ExecError::ContextOverflow`] for
    /// a part beyond its context; a failure while running leaves every session as it was.
    pub fn step(parts: &mut [BatchPart<'_, '_>]) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
        let mut parts: Vec<Part<'_, '_>> = parts
            .iter_mut()
            .map(|p| Part {
                session: &mut *p.session,
                tokens: p.tokens,
                logits: if p.logits { Logits::Last } else { Logits::None },
                tree: None,
            })
            .collect();
        forward_parts(&mut parts)
    }

    fn forward(&mut self, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ExecError> {
        let mut parts = [Part {
            session: self,
            tokens,
            logits,
            tree: None,
        }];
        let mut out = forward_parts(&mut parts)?;
        Ok(out.pop().flatten().unwrap_or_default())
    }
}

/// One sequence's share of a batched step ([`Session::step`]).
pub struct BatchPart<'s, 't> {
    /// The sequence; its KV cache grows by `tokens`.
    pub session: &'s mut Session,
    /// One token for a decode step, or a chunk of a prompt.
    pub tokens: &'t [u32],
    /// Compute the logits of the last token (a prefill chunk that does not end its prompt
    /// needs none, which saves the output matmul's rows).
    pub logits: bool,
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
fn forward_parts(parts: &mut [Part<'_, '_>]) -> Result<Vec<Option<Vec<f32>>>, ExecError> {
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
    // The forward pass runs on a worker of the current rayon pool, so its parallel
    // operators and the device's matmul tasks fork onto that pool directly; called from a
    // thread outside it, each of them would inject a job and block on a latch instead
    // (hundreds of cross-thread wake-ups per decoded token).
    let result = if rayon::current_thread_index().is_some() {
        forward_inner(&model, &*linear, parts)
    } else {
        rayon::scope(|_| forward_inner(&model, &*linear, parts))
    };
    match result {
        Ok(out) => {
            for p in parts.iter_mut() {
                p.session.len += p.tokens.len();
            }
            Ok(out)
        }
        Err(e) => {
            // Keep the caches consistent: drop whatever layers appended before the failure.
            for p in parts.iter_mut() {
                let len = p.session.len;
                p.session.truncate(len);
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
    let mut angles = Vec::with_capacity(m);
    let mut row = 0;
    for p in parts.iter() {
        let n = p.tokens.len();
        model.embed(p.tokens, &mut x[row * d..(row + n) * d])?;
        match p.tree {
            None => angles.extend((0..n).map(|i| model.rope.angles(p.session.len + i))),
            Some(parents) => {
                let mut depth: Vec<usize> = Vec::with_capacity(n);
                for par in parents {
                    let d = par.map_or(0, |q| depth[q] + 1);
                    depth.push(d);
                    angles.push(model.rope.angles(p.session.len + d));
                }
            }
        }
        row += n;
    }

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
    let shape = AttentionShape {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim_k: c.head_dim_k,
        head_dim_v: c.head_dim_v,
    };
    let (qd, kd, vd, ad) = (c.q_dim(), c.k_dim(), c.v_dim(), c.attn_out_dim());

    for (il, layer) in model.layers.iter().enumerate() {
        // Attention block.
        h.copy_from_slice(&x);
        linear.record(ork_board::HostKind::norm(m, d));
        rms_norm(&mut h, &layer.attn_norm, c.rms_eps);
        // q, k and v take the same input: one call, so the backend can quantize it once and
        // submit the three together.
        linear.matmul_many(
            &[&layer.wq, &layer.wk, &layer.wv],
            &h,
            m,
            &mut [&mut q, &mut k, &mut v],
        )?;
        add_bias(&mut q, layer.q_bias.as_deref());
        add_bias(&mut k, layer.k_bias.as_deref());
        add_bias(&mut v, layer.v_bias.as_deref());
        if let Some(w) = &layer.q_norm {
            rms_norm(&mut q, w, c.rms_eps);
        }
        if let Some(w) = &layer.k_norm {
            rms_norm(&mut k, w, c.rms_eps);
        }
        for (i, a) in angles.iter().enumerate() {
            model.rope.apply(&mut q[i * qd..][..qd], c.head_dim_k, a);
            model.rope.apply(&mut k[i * kd..][..kd], c.head_dim_k, a);
        }
        // Each part attends over its own cache, its rows being the newest positions.
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
            l.attend(shape, q_rows, n, p.tree, out_rows);
            linear.record(ork_board::HostKind::attention(
                n,
                s.len,
                c.n_head,
                c.n_head_kv,
                c.head_dim_k,
                s.kv_type.bytes(),
            ));
            row += n;
        }
        linear.matmul(&layer.wo, &attn, m, &mut proj)?;
        add(&mut x, &proj);

        // Feed-forward block.
        h.copy_from_slice(&x);
        linear.record(ork_board::HostKind::norm(m, d));
        rms_norm(&mut h, &layer.ffn_norm, c.rms_eps);
        let next = model.layers.get(il + 1).map(|l| &l.ffn);
        layer.ffn.forward(linear, &h, m, &mut proj, next)?;
        add(&mut x, &proj);
    }

    // The rows that produce logits, gathered so the output matmul runs once.
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
