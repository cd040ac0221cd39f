//! The event stream a run produces, as the layers that see each event record it: the residency
//! layer records matmuls and loads, the executor records host operations and forward passes.
//! [`crate::replay()`] plays the stream back on a board's simulated resources.
//!
//! Events key weights by id ([`ModelWeight`]: the model's or its draft's, and the id in that
//! model's name table); the names are printed from the tables beside the stream
//! ([`EventNames`]).

use std::fmt;
use std::sync::Mutex;

use ork_manifest::{WeightId, WeightNames};
use serde::{Deserialize, Serialize};

/// Which of a run's models a weight belongs to: each numbers its weights from 0 in its own
/// name table, so a stream with both (a speculative schedule's draft beside its verifier) tells
/// them apart by this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Model {
    /// The model the run serves (the verifier of a speculative run).
    Target,
    /// A draft model beside it (its own weights, or a self draft's copy of the model's first
    /// blocks).
    Draft,
}

/// A weight of a run: its model and its id in that model's name table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelWeight {
    /// Whose weight.
    pub model: Model,
    /// Its id in that model's table.
    pub id: WeightId,
}

impl ModelWeight {
    /// Weight `id` of the target model.
    pub fn target(id: WeightId) -> ModelWeight {
        ModelWeight {
            model: Model::Target,
            id,
        }
    }
}

impl fmt::Display for ModelWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.model {
            Model::Target => write!(f, "weight {}", self.id),
            Model::Draft => write!(f, "draft weight {}", self.id),
        }
    }
}

/// The name tables beside an event stream, for printing it (the stream keys weights by id).
#[derive(Clone, Copy, Debug)]
pub struct EventNames<'a> {
    /// The target model's table.
    pub target: &'a WeightNames,
    /// The draft's, if the stream has one.
    pub draft: Option<&'a WeightNames>,
}

impl EventNames<'_> {
    /// The name of `w`: its key, `draft.`-prefixed for a draft's weight (`draft.` and the id when
    /// there is no draft table).
    pub fn name(&self, w: ModelWeight) -> String {
        match (w.model, self.draft) {
            (Model::Target, _) => self.target.key(w.id).to_owned(),
            (Model::Draft, Some(d)) => format!("draft.{}", d.key(w.id)),
            (Model::Draft, None) => format!("draft.{}", w.id),
        }
    }

    /// `events` with their weights named, for a dump (`ORK_BOARD_EVENTS`).
    pub fn named(&self, events: &[Event]) -> Vec<Event<String>> {
        events
            .iter()
            .map(|e| e.map_weight(|w| self.name(w)))
            .collect()
    }
}

/// The weight type of a matmul on the NPU (the activations' type follows from the chip's type
/// pair: int8 weights take int8 activations on the RK3588; fp16 × int4 is RK3576's w4a16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightType {
    /// int8 weights (w8a8, or w8a16 on the RK3576).
    Int8,
    /// fp16 weights.
    Fp16,
    /// int4 weights (w4a16 on the RK3576, w4a4 on the RK3588).
    Int4,
}

/// Who brought a weight in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Loader {
    /// The compute path, on demand: compute waits for the whole load.
    Compute,
    /// The prefetch thread (or the resident plan's first-pass loader), beside compute.
    Prefetch,
}

/// What a host operation is (for the breakdown; its cost comes from its bytes and flops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostKind {
    /// Attention over the KV cache (with RoPE and the KV append).
    Attention,
    /// An RMS norm (and the residual add beside it).
    Norm,
    /// The logits' norm and sampling over the vocabulary.
    Sample,
}

/// One event of a run, in the order the run produced it. Its weights are `W`: a [`ModelWeight`],
/// or a name once printed ([`EventNames::named`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event<W = ModelWeight> {
    /// A forward pass begins: `tokens` rows, the KV cache holding `context` positions before it.
    Pass {
        /// Tokens appended by the pass (the matmuls' M).
        tokens: usize,
        /// Positions already in the KV cache.
        context: usize,
    },
    /// A weight was brought onto the device.
    Load {
        /// The weight.
        weight: W,
        /// Bytes copied into the device buffer.
        bytes: u64,
        /// The IOMMU domain of the buffer.
        domain: u32,
        /// A new device buffer was allocated and mapped (else a spare of the same size was reused).
        created: bool,
        /// Who loaded it.
        by: Loader,
        /// How many [`Event::Matmul`]s compute had started when the load began: a prefetch load
        /// cannot start on the board before compute reached the same point.
        after: u64,
    },
    /// A matmul on the NPU: `y[M, N] = x[M, K] · W[N, K]ᵀ`.
    Matmul {
        /// The weight.
        weight: W,
        /// Rows (tokens).
        m: usize,
        /// Inner dimension.
        k: usize,
        /// Output columns.
        n: usize,
        /// Weight type.
        ty: WeightType,
        /// Bytes of the weight on the device (what the NPU reads).
        bytes: u64,
        /// The IOMMU domain it runs in.
        domain: u32,
        /// Device calls it took (chip-sized parts).
        calls: u32,
        /// The activations were quantized (or converted) for this matmul; `false` when it shares
        /// the quantization of the matmul before it (one batch of q/k/v or gate/up).
        quantized: bool,
    },
    /// Work on the host CPU between matmuls.
    Host {
        /// What it is.
        kind: HostKind,
        /// Floating-point operations.
        flops: f64,
        /// Bytes read and written.
        bytes: f64,
    },
}

impl<W> Event<W> {
    /// The event with its weight (if any) mapped by `f`.
    pub fn map_weight<V>(&self, f: impl FnOnce(W) -> V) -> Event<V>
    where
        W: Clone,
    {
        match self.clone() {
            Event::Pass { tokens, context } => Event::Pass { tokens, context },
            Event::Load {
                weight,
                bytes,
                domain,
                created,
                by,
                after,
            } => Event::Load {
                weight: f(weight),
                bytes,
                domain,
                created,
                by,
                after,
            },
            Event::Matmul {
                weight,
                m,
                k,
                n,
                ty,
                bytes,
                domain,
                calls,
                quantized,
            } => Event::Matmul {
                weight: f(weight),
                m,
                k,
                n,
                ty,
                bytes,
                domain,
                calls,
                quantized,
            },
            Event::Host { kind, flops, bytes } => Event::Host { kind, flops, bytes },
        }
    }
}

impl HostKind {
    /// Attention of `m` new rows over `context + m` positions in a layer whose query sees
    /// `window` keys, itself included (`None`: a global layer; causal within the new rows is
    /// counted as full: an upper bound), `n_head` query heads of `head_dim`, `n_head_kv` KV
    /// heads whose cache holds `kv_bytes` bytes per value (2 for f16). The executor records and
    /// the planned schedule charges attention through this one function. The NPU clock's fit
    /// (`fit.rs`) replays this count against rkllm's rows, and fits best with it (loss 0.006;
    /// 0.019 counted causally): the CPU engine's clock counts ork's own causal keys instead
    /// ([`HostKind::keys_seen`], `cpu::attention_s`).
    pub fn attention(
        m: usize,
        context: usize,
        window: Option<usize>,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        kv_bytes: usize,
    ) -> Event {
        // Each row reads at most its window; the pass reads the window's older keys and its own.
        let per_row = window.map_or(context + m, |w| w.min(context + m)) as f64;
        let read = (Self::attended_context(context, window) + m) as f64;
        let (m, h, hd) = (m as f64, n_head as f64, head_dim as f64);
        // q·k and p·v: two multiply-adds per key, head dimension and query head.
        let flops = 4.0 * m * per_row * h * hd;
        // The cache is read once per pass (K and V), the queries and outputs in f32.
        let bytes = 2.0 * read * (n_head_kv * head_dim * kv_bytes) as f64 + 8.0 * m * h * hd;
        Event::Host {
            kind: HostKind::Attention,
            flops,
            bytes,
        }
    }

    /// Keys the `m` rows at positions `context..context + m` see in all, causally, in a layer
    /// whose query sees `window` keys, itself included (`None`: global): row `i` sees
    /// `min(window, context + i + 1)`.
    pub fn keys_seen(m: usize, context: usize, window: Option<usize>) -> usize {
        let first = context + 1;
        // Rows before the window binds see `first + i` keys; the rest see `window`.
        let (rising, w) = match window {
            Some(w) => ((w + 1).saturating_sub(first).min(m), w),
            None => (m, 0),
        };
        rising * first + rising * rising.saturating_sub(1) / 2 + (m - rising) * w
    }

    /// The context a pass of new rows attends beside themselves in a layer whose query sees
    /// `window` keys, itself included (`None`: a global layer): the rows at positions
    /// `context..context + m` read positions `context − (window − 1)..context + m` at most, so
    /// a sliding-window layer's cost stops growing with the conversation.
    pub fn attended_context(context: usize, window: Option<usize>) -> usize {
        window.map_or(context, |w| context.min(w.saturating_sub(1)))
    }

    /// An RMS norm of `m` rows of `d` values, with the residual add beside it.
    pub fn norm(m: usize, d: usize) -> Event {
        let v = (m * d) as f64;
        Event::Host {
            kind: HostKind::Norm,
            flops: 5.0 * v,
            bytes: 16.0 * v,
        }
    }

    /// The output norm and sampling over `rows × vocab` logits.
    pub fn sample(rows: usize, vocab: usize) -> Event {
        let v = (rows * vocab) as f64;
        Event::Host {
            kind: HostKind::Sample,
            flops: 4.0 * v,
            bytes: 8.0 * v,
        }
    }
}

/// A thread-safe recorder of a run's events; the layers that see events push into it.
#[derive(Debug, Default)]
pub struct Recorder {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: Vec<Event>,
    matmuls: u64,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record `event`.
    pub fn push(&self, event: Event) {
        let mut g = self.lock();
        if matches!(event, Event::Matmul { .. }) {
            g.matmuls += 1;
        }
        g.events.push(event);
    }

    /// Matmuls recorded so far (a load's [`Event::Load::after`]).
    pub fn matmuls(&self) -> u64 {
        self.lock().matmuls
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Forget the events so far (a warm-up that should not be projected).
    pub fn clear(&self) {
        *self.lock() = Inner::default();
    }
}
