//! The planned schedule as an event stream, without running: what `ork plan --project` replays,
//! and what the calibration replays for the published models' shapes. It produces the events a
//! run of ork's executor and prefetcher produces, in the same order: per pass, per block, the
//! attention norm, q/k/v (one quantization), attention, the output projection, the FFN norm,
//! gate/up (one quantization), down; then the output projection of the last row and sampling.
//! A streamed plan's prefetcher loads weight `g` once compute has started weight `g − slots`.

use crate::events::{Event, HostKind, Loader, WeightType};
use crate::BoardError;

/// One matmul weight of the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeWeight {
    /// Its name.
    pub name: String,
    /// Inner dimension.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// Weight type.
    pub ty: WeightType,
    /// Bytes on the device.
    pub bytes: u64,
    /// Domain it lives in.
    pub domain: u32,
    /// Device calls (chip-sized parts).
    pub calls: u32,
    /// Kept resident by a streamed plan (loaded once, before the prompt).
    pub pinned: bool,
}

/// A dense transformer's shape: per block `q, k, v, o, gate, up, down`, then the output weight.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    /// Model width.
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Per block, its seven weights in execution order.
    pub blocks: Vec<[ShapeWeight; 7]>,
    /// The output projection.
    pub output: ShapeWeight,
}

/// Published dimensions of a llama-shaped model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// Blocks.
    pub n_layer: usize,
    /// Width.
    pub d_model: usize,
    /// FFN width.
    pub ffn: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Vocabulary.
    pub vocab: usize,
}

/// Device bytes of a `K × N` weight of type `ty` with per-output-channel f32 scales (ork's pack).
pub fn weight_bytes(k: usize, n: usize, ty: WeightType) -> u64 {
    let values = (k * n) as u64;
    let data = match ty {
        WeightType::Int8 => values,
        WeightType::Fp16 => 2 * values,
        WeightType::Int4 => values.div_ceil(2),
    };
    data + 4 * n as u64
}

impl ShapeWeight {
    /// A `K × N` weight of type `ty` in domain 0, split by `chip`'s limits.
    pub fn new(
        name: String,
        k: usize,
        n: usize,
        ty: WeightType,
        chip: &crate::Chip,
        pinned: bool,
    ) -> ShapeWeight {
        ShapeWeight {
            name,
            k,
            n,
            ty,
            bytes: weight_bytes(k, n, ty),
            domain: 0,
            calls: chip.calls(k, n, ty),
            pinned,
        }
    }
}

impl ModelShape {
    /// The shape of `dims` with weights of type `ty` in domain 0, split by `chip`'s limits.
    pub fn from_dims(dims: &Dims, ty: WeightType, chip: &crate::Chip) -> ModelShape {
        let w = |name: String, k: usize, n: usize| ShapeWeight::new(name, k, n, ty, chip, false);
        let (d, q, kv) = (
            dims.d_model,
            dims.n_head * dims.head_dim,
            dims.n_head_kv * dims.head_dim,
        );
        let blocks = (0..dims.n_layer)
            .map(|i| {
                [
                    w(format!("blk.{i}.attn_q"), d, q),
                    w(format!("blk.{i}.attn_k"), d, kv),
                    w(format!("blk.{i}.attn_v"), d, kv),
                    w(format!("blk.{i}.attn_output"), q, d),
                    w(format!("blk.{i}.ffn_gate"), d, dims.ffn),
                    w(format!("blk.{i}.ffn_up"), d, dims.ffn),
                    w(format!("blk.{i}.ffn_down"), dims.ffn, d),
                ]
            })
            .collect();
        ModelShape {
            d_model: d,
            n_head: dims.n_head,
            n_head_kv: dims.n_head_kv,
            head_dim: dims.head_dim,
            vocab: dims.vocab,
            blocks,
            output: w("output".into(), d, dims.vocab),
        }
    }

    /// Every weight in execution order.
    pub fn weights(&self) -> impl Iterator<Item = &ShapeWeight> {
        self.blocks
            .iter()
            .flatten()
            .chain(std::iter::once(&self.output))
    }

    /// Device bytes of every weight.
    pub fn total_bytes(&self) -> u64 {
        self.weights().map(|w| w.bytes).sum()
    }
}

/// How the schedule runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Resident (loaded once, before the prompt) or streamed (every weight loaded every pass).
    pub resident: bool,
    /// Prefetch slots of a streamed plan (0: every load on the compute path).
    pub slots: usize,
    /// Weight budget of a streamed plan, bytes (buffers are created until it is full, then
    /// reused).
    pub budget_bytes: u64,
    /// Prompt tokens (one prefill pass).
    pub prompt_tokens: usize,
    /// Generated tokens (the first from the prefill, one decode pass for each of the others).
    pub gen_tokens: usize,
    /// Bytes per KV-cache value (2: f16).
    pub kv_bytes: usize,
}

/// The event stream of running `shape` as `plan` says.
pub fn schedule(shape: &ModelShape, plan: &Plan) -> Result<Vec<Event>, BoardError> {
    if plan.prompt_tokens == 0 {
        return Err(BoardError::Stream("a prompt of 0 tokens".into()));
    }
    let order: Vec<&ShapeWeight> = shape.weights().collect();
    let mut out = Vec::new();
    let mut loads = Loads::new(plan.budget_bytes);
    for w in &order {
        if plan.resident || w.pinned {
            out.push(loads.event(w, Loader::Prefetch, 0));
        }
    }
    let passes = plan.gen_tokens.max(1);
    let mut started = 0u64; // matmuls emitted
    let mut loaded = 0usize; // global index of the next streamed load
    let total = order.len() * passes;
    let load_until = |out: &mut Vec<Event>, loads: &mut Loads, upto: usize, loaded: &mut usize| {
        while *loaded < upto.min(total) {
            let w = order[*loaded % order.len()];
            if w.pinned {
                *loaded += 1;
                continue;
            }
            let (by, after) = if plan.slots == 0 {
                (Loader::Compute, 0)
            } else {
                (
                    Loader::Prefetch,
                    (*loaded + 1).saturating_sub(plan.slots) as u64,
                )
            };
            out.push(loads.event(w, by, after));
            *loaded += 1;
        }
    };
    for p in 0..passes {
        let (m, context) = if p == 0 {
            (plan.prompt_tokens, 0)
        } else {
            (1, plan.prompt_tokens + p - 1)
        };
        out.push(Event::Pass { tokens: m, context });
        let mut matmul = |out: &mut Vec<Event>,
                          loads: &mut Loads,
                          loaded: &mut usize,
                          w: &ShapeWeight,
                          rows: usize,
                          quantized: bool| {
            if !plan.resident {
                // Streamed: the loads the prefetcher has issued by now (slots ahead), and this
                // weight's own load on the compute path if it has not.
                let g = started as usize;
                let ahead = if plan.slots == 0 {
                    g + 1
                } else {
                    g + plan.slots
                };
                load_until(out, loads, ahead.max(g + 1), loaded);
            }
            out.push(Event::Matmul {
                weight: w.name.clone(),
                m: rows,
                k: w.k,
                n: w.n,
                ty: w.ty,
                bytes: w.bytes,
                domain: w.domain,
                calls: w.calls,
                quantized,
            });
            started += 1;
        };
        for b in &shape.blocks {
            out.push(HostKind::norm(m, shape.d_model));
            for (i, w) in b[..3].iter().enumerate() {
                matmul(&mut out, &mut loads, &mut loaded, w, m, i == 0);
            }
            out.push(HostKind::attention(
                m,
                context,
                shape.n_head,
                shape.n_head_kv,
                shape.head_dim,
                plan.kv_bytes,
            ));
            matmul(&mut out, &mut loads, &mut loaded, &b[3], m, true);
            out.push(HostKind::norm(m, shape.d_model));
            matmul(&mut out, &mut loads, &mut loaded, &b[4], m, true);
            matmul(&mut out, &mut loads, &mut loaded, &b[5], m, false);
            matmul(&mut out, &mut loads, &mut loaded, &b[6], m, true);
        }
        matmul(&mut out, &mut loads, &mut loaded, &shape.output, 1, true);
        out.push(HostKind::sample(1, shape.vocab));
    }
    Ok(out)
}

/// Which loads create a buffer: until the budget is full every load does; then a load reuses
/// the buffer of an evicted weight of the same size when one was created before.
pub(crate) struct Loads {
    budget: u64,
    created: u64,
    sizes: std::collections::HashSet<u64>,
}

impl Loads {
    pub(crate) fn new(budget: u64) -> Loads {
        Loads {
            budget,
            created: 0,
            sizes: Default::default(),
        }
    }

    pub(crate) fn event(&mut self, w: &ShapeWeight, by: Loader, after: u64) -> Event {
        let created = self.created + w.bytes <= self.budget || !self.sizes.contains(&w.bytes);
        if created {
            self.created += w.bytes;
            self.sizes.insert(w.bytes);
        }
        Event::Load {
            weight: w.name.clone(),
            bytes: w.bytes,
            domain: w.domain,
            created,
            by,
            after,
        }
    }
}
