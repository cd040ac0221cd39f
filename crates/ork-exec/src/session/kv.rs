//! A session's KV cache: per layer, the keys and values of the positions it holds, f16 or f32,
//! and for a sliding-window layer only the window and a bounded slack (docs/kv-cache.md).
use crate::model::Model;
use crate::ops::{attention_tree_window, attention_window, AttentionShape, KvValue};
use half::f16;
use half::slice::HalfFloatSliceExt;

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
pub(super) enum Heads {
    F16(Vec<Vec<f16>>),
    F32(Vec<Vec<f32>>),
}

impl Heads {
    pub(super) fn new(kind: KvType, n_kv: usize) -> Heads {
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
    pub(super) fn append(&mut self, rows: &[f32], d: usize) -> Result<(), f32> {
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
    pub(super) fn values(&self) -> usize {
        match self {
            Heads::F16(h) => h.iter().map(Vec::len).sum(),
            Heads::F32(h) => h.iter().map(Vec::len).sum(),
        }
    }

    pub(super) fn truncate(&mut self, len: usize) {
        match self {
            Heads::F16(h) => h.iter_mut().for_each(|h| h.truncate(len)),
            Heads::F32(h) => h.iter_mut().for_each(|h| h.truncate(len)),
        }
    }

    /// Drop the first `n` values of every head (a sliding-window layer's oldest positions). The
    /// memory reserved for a long batch is given back once the head holds a quarter of it.
    pub(super) fn drop_front(&mut self, n: usize) {
        fn each<T>(h: &mut [Vec<T>], n: usize) {
            for h in h {
                h.drain(..n.min(h.len()));
                if h.capacity() > 4 * h.len() {
                    h.shrink_to(2 * h.len());
                }
            }
        }
        match self {
            Heads::F16(h) => each(h, n),
            Heads::F32(h) => each(h, n),
        }
    }

    /// Give back the memory reserved beyond the values held.
    pub(super) fn shrink(&mut self) {
        match self {
            Heads::F16(h) => h.iter_mut().for_each(Vec::shrink_to_fit),
            Heads::F32(h) => h.iter_mut().for_each(Vec::shrink_to_fit),
        }
    }

    /// The values `from..to` of every head, copied.
    pub(super) fn range(&self, from: usize, to: usize) -> Heads {
        fn each<T: Clone>(h: &[Vec<T>], from: usize, to: usize) -> Vec<Vec<T>> {
            h.iter()
                .map(|h| {
                    let to = to.min(h.len());
                    h[from.min(to)..to].to_vec()
                })
                .collect()
        }
        match self {
            Heads::F16(h) => Heads::F16(each(h, from, to)),
            Heads::F32(h) => Heads::F32(each(h, from, to)),
        }
    }

    /// Copy the `d` values at position `from` over those at position `to`.
    pub(super) fn copy_position(&mut self, from: usize, to: usize, d: usize) {
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

/// A sliding-window layer keeps min(window, `ROLLBACK_MAX`) positions beyond what its next
/// position reads, so that the session can always be cut back that many (a draft model's
/// rejected tokens, the tail of a conversation re-rendered differently), besides the whole last
/// pass (docs/kv-cache.md, "Sliding-window layers").
const ROLLBACK_MAX: usize = 64;
/// A sliding-window layer drops its oldest positions only once min(window, `SLACK_MAX`) of them
/// can go, so that moving the held rows to the front of each head's array happens once every that
/// many tokens rather than at every one.
const SLACK_MAX: usize = 64;

/// One layer's KV cache.
#[derive(Clone)]
pub(super) struct LayerKv {
    pub(super) keys: Heads,
    pub(super) values: Heads,
    /// A sliding-window layer's window (`None`: the layer keeps every position).
    pub(super) window: Option<usize>,
    /// The first position held: `keys`/`values` hold positions `start..` of the session (0 for a
    /// layer without a window).
    pub(super) start: usize,
}

impl LayerKv {
    pub(super) fn new(
        kind: KvType,
        c: &crate::config::ModelConfig,
        window: Option<usize>,
    ) -> LayerKv {
        LayerKv {
            keys: Heads::new(kind, c.n_head_kv),
            values: Heads::new(kind, c.n_head_kv),
            window,
            start: 0,
        }
    }

    /// Every layer's cache, empty.
    pub(super) fn all(kind: KvType, model: &Model) -> Vec<LayerKv> {
        let c = model.config();
        model
            .layers
            .iter()
            .map(|l| LayerKv::new(kind, c, l.window))
            .collect()
    }

    /// The shortest length other than 0 that this layer's positions can be cut back to and
    /// still run the next position: one whose window (`len - window + 1 ..`) is held. 0 while
    /// nothing was dropped.
    pub(super) fn min_prefix(&self) -> usize {
        match self.window {
            Some(w) if self.start > 0 => self.start + w - 1,
            _ => 0,
        }
    }

    /// Keep positions `..len` (of those held, `start..len`); `len` is 0 or at least
    /// [`LayerKv::min_prefix`].
    pub(super) fn cut(&mut self, len: usize, c: &crate::config::ModelConfig) {
        if len == 0 {
            self.start = 0;
        }
        debug_assert!(len >= self.start);
        let held = len - self.start;
        self.keys.truncate(held * c.head_dim_k);
        self.values.truncate(held * c.head_dim_v);
    }

    /// After a pass that appended positions `base..len`: drop a sliding-window layer's
    /// positions that neither the next position's window nor a cut back to `base` or to
    /// `len - rollback` needs, once there are at least `slack` of them.
    pub(super) fn drop_old(&mut self, base: usize, len: usize, c: &crate::config::ModelConfig) {
        let Some(w) = self.window else {
            return;
        };
        let (rollback, slack) = (w.min(ROLLBACK_MAX), w.min(SLACK_MAX));
        let keep_from = base.min(len.saturating_sub(rollback)).saturating_sub(w - 1);
        if keep_from >= self.start + slack {
            let n = keep_from - self.start;
            self.keys.drop_front(n * c.head_dim_k);
            self.values.drop_front(n * c.head_dim_v);
            self.start = keep_from;
        }
    }

    /// Attention of the last rows (`tree`: the nodes of a tree) over this layer's cache, within
    /// `window` positions (a sliding-window layer; `usize::MAX` for every earlier one).
    pub(super) fn attend(
        &self,
        shape: AttentionShape,
        q: &[f32],
        m: usize,
        tree: Option<&[Option<usize>]>,
        window: usize,
        out: &mut [f32],
    ) {
        fn run<T: KvValue>(
            shape: AttentionShape,
            q: &[f32],
            (k, v): (&[Vec<T>], &[Vec<T>]),
            m: usize,
            tree: Option<&[Option<usize>]>,
            window: usize,
            out: &mut [f32],
        ) {
            let k: Vec<&[T]> = k.iter().map(Vec::as_slice).collect();
            let v: Vec<&[T]> = v.iter().map(Vec::as_slice).collect();
            match tree {
                None => attention_window(shape, q, &k, &v, m, window, out),
                Some(parents) => attention_tree_window(shape, q, &k, &v, parents, window, out),
            }
        }
        match (&self.keys, &self.values) {
            (Heads::F16(k), Heads::F16(v)) => run(shape, q, (k, v), m, tree, window, out),
            (Heads::F32(k), Heads::F32(v)) => run(shape, q, (k, v), m, tree, window, out),
            // Both are made together by `LayerKv::new`, of one type.
            _ => unreachable!("keys and values of one layer have one type"),
        }
    }
}
