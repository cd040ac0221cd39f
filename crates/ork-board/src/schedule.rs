//! The planned schedule as an event stream, without running: what `ork plan --project` replays,
//! and what the calibration replays for the published models' shapes. It produces the events a
//! run of ork's executor and prefetcher produces, in the same order: per pass, per block, the
//! attention norm, q/k/v (one quantization), attention, the output projection, the FFN norm,
//! gate/up (one quantization), down; then the output projection of the last row and sampling.
//! A streamed plan's prefetcher loads weight `g` once compute has started weight `g − slots`.

use std::sync::Arc;

use ork_manifest::{Role, WeightId, WeightNames};

use crate::events::{Event, HostKind, Loader, ModelWeight, WeightType};
use crate::BoardError;

/// One matmul weight of the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeWeight {
    /// Its id in its model's name table ([`ModelShape::names`]).
    pub id: WeightId,
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
    /// The name table its weights' ids index: the model's manifest's, or for a model known by
    /// its dimensions alone [`shape_names`]'s.
    pub names: Arc<WeightNames>,
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
    /// Per block, the keys a sliding-window (local) layer's query sees, itself included; a
    /// block without an entry, or with `None`, is a global layer (Gemma 3 interleaves both).
    pub windows: Vec<Option<usize>>,
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

/// The name table of a model known by its shape alone, the one place such a model's weights get
/// ids: per block `n_layer` the roles `block`, then each of `n_expert` experts' gate, up and down,
/// then the output projection; keyed, with their roles and layers, by the manifest's table as a
/// GGUF of that shape names them (`blk.0.attn_q.weight`, `blk.0.ffn_gate_exps.weight#5`,
/// `output.weight`).
pub fn shape_names(n_layer: usize, block: &[Role], n_expert: usize) -> WeightNames {
    const EXPERT: [Role; 3] = [Role::ExpertGate, Role::ExpertUp, Role::ExpertDown];
    let layers = 0..u32::try_from(n_layer).expect("a shape's blocks fit a u32");
    let experts = u32::try_from(n_expert).expect("a shape's experts fit a u32");
    WeightNames::from_roles(
        layers
            .flat_map(|l| {
                let dense = block.iter().map(move |&r| (r, Some(l), None));
                let expert = (0..experts).flat_map(move |x| EXPERT.map(|r| (r, Some(l), Some(x))));
                dense.chain(expert)
            })
            .chain(std::iter::once((Role::Output, None, None))),
    )
}

/// The id of `role` in block `layer` (`expert`) of a table [`shape_names`] made.
pub(crate) fn shape_id(
    names: &WeightNames,
    role: Role,
    layer: Option<usize>,
    expert: Option<usize>,
) -> WeightId {
    names
        .find(role, layer.map(|l| l as u32), expert.map(|x| x as u32))
        .expect("shape_names lists every weight of the shape")
}

impl ShapeWeight {
    /// A `K × N` weight of type `ty` in domain 0, split by `chip`'s limits.
    pub fn new(
        id: WeightId,
        k: usize,
        n: usize,
        ty: WeightType,
        chip: &crate::Chip,
        pinned: bool,
    ) -> ShapeWeight {
        ShapeWeight {
            id,
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

/// A block's attention weights (q, k, v, output) for width `d` and `n_head` / `n_head_kv`
/// heads of `head_dim`, made by `w` (role, K, N).
pub(crate) fn attention_weights(
    d: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    w: impl Fn(Role, usize, usize) -> ShapeWeight,
) -> [ShapeWeight; 4] {
    let (q, kv) = (n_head * head_dim, n_head_kv * head_dim);
    [
        w(Role::AttnQ, d, q),
        w(Role::AttnK, d, kv),
        w(Role::AttnV, d, kv),
        w(Role::AttnOutput, q, d),
    ]
}

impl ModelShape {
    /// The shape of `dims` with weights of type `ty` in domain 0, split by `chip`'s limits,
    /// named by [`shape_names`].
    pub fn from_dims(dims: &Dims, ty: WeightType, chip: &crate::Chip) -> ModelShape {
        let names = Arc::new(shape_names(dims.n_layer, &ork_manifest::DENSE, 0));
        let w = |layer: Option<usize>, role: Role, k: usize, n: usize| {
            let id = shape_id(&names, role, layer, None);
            ShapeWeight::new(id, k, n, ty, chip, false)
        };
        let (d, ffn) = (dims.d_model, dims.ffn);
        let blocks = (0..dims.n_layer)
            .map(|i| {
                let b = |role, k, n| w(Some(i), role, k, n);
                let [q, k, v, o] =
                    attention_weights(d, dims.n_head, dims.n_head_kv, dims.head_dim, b);
                [
                    q,
                    k,
                    v,
                    o,
                    b(Role::FfnGate, d, ffn),
                    b(Role::FfnUp, d, ffn),
                    b(Role::FfnDown, ffn, d),
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
            output: w(None, Role::Output, d, dims.vocab),
            windows: Vec::new(),
            names,
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
    let passes: Vec<(usize, usize)> = (0..plan.gen_tokens.max(1))
        .map(|p| {
            if p == 0 {
                (plan.prompt_tokens, 0)
            } else {
                (1, plan.prompt_tokens + p - 1)
            }
        })
        .collect();
    schedule_passes(shape, plan, &passes)
}

/// Decode passes [`schedule_sampled`] replays one by one; a plan with more replays this many,
/// spread over its decode contexts, so a plan's memory does not grow with its token count.
pub const DECODE_PASSES_REPLAYED: usize = 512;

/// The passes of `plan` as (rows, context), with the decode steps each stands for: the prefill
/// and every decode pass once (the passes of [`schedule()`]) up to [`DECODE_PASSES_REPLAYED`]
/// decode passes; beyond, the decode steps are cut into that many runs of consecutive contexts
/// and each run is replayed as one pass at its middle context, standing for the run's steps. A
/// decode pass's cost is its context's attention (linear in the context, or constant for a
/// sliding-window layer) plus the same weights every pass, so the middle pass times the run's
/// length is the run's cost (`sampled_decode_matches_the_full_replay` bounds the difference).
pub fn sampled_passes(plan: &Plan) -> (Vec<(usize, usize)>, Vec<f64>) {
    let steps = plan.gen_tokens.saturating_sub(1);
    let mut passes = vec![(plan.prompt_tokens, 0)];
    let mut weights = vec![1.0];
    let runs = steps.min(DECODE_PASSES_REPLAYED);
    for j in 0..runs {
        let (start, end) = (j * steps / runs, (j + 1) * steps / runs);
        passes.push((1, plan.prompt_tokens + start + (end - start - 1) / 2));
        weights.push((end - start) as f64);
    }
    (passes, weights)
}

/// [`schedule()`] on [`sampled_passes`]: the events, and per pass the decode steps it stands
/// for (give them to [`crate::Timeline::weigh_passes`] after the replay). With at most
/// [`DECODE_PASSES_REPLAYED`] decode passes the events are [`schedule()`]'s and every weight 1.
pub fn schedule_sampled(
    shape: &ModelShape,
    plan: &Plan,
) -> Result<(Vec<Event>, Vec<f64>), BoardError> {
    if plan.prompt_tokens == 0 {
        return Err(BoardError::Stream("a prompt of 0 tokens".into()));
    }
    let (passes, weights) = sampled_passes(plan);
    Ok((schedule_passes(shape, plan, &passes)?, weights))
}

/// As [`schedule()`], for the passes `passes` (rows, context) in order (`plan`'s token counts
/// unused): a speculative verifier's passes of `k + 1` rows through one weight cache.
pub(crate) fn schedule_passes(
    shape: &ModelShape,
    plan: &Plan,
    passes: &[(usize, usize)],
) -> Result<Vec<Event>, BoardError> {
    let order: Vec<&ShapeWeight> = shape.weights().collect();
    let mut out = Vec::new();
    if plan.resident {
        let mut loads = Loads::new(plan.budget_bytes);
        for w in &order {
            out.push(loads.event(w, Loader::Prefetch, 0));
        }
    }
    let total = order.len() * passes.len();
    // A streamed plan's loads come from a simulation of ork's weight cache (see `Cache`).
    let mut cache = Cache::new(plan.budget_bytes, &shape.names);
    let mut started = 0u64; // matmuls emitted
    for &(m, context) in passes {
        out.push(Event::Pass { tokens: m, context });
        let mut matmul = |out: &mut Vec<Event>,
                          cache: &mut Cache,
                          w: &ShapeWeight,
                          rows: usize,
                          quantized: bool|
         -> Result<(), BoardError> {
            // Compute announces weight `g`; the prefetch thread brings in the `slots` weights
            // after it (in plan order), stopping at the first it has no room for; compute then
            // uses `g`: a hit, or a load on the compute path. The prefetches are written after
            // the matmul: on the board they start once compute started it.
            let mut prefetched = Vec::new();
            if !plan.resident {
                let g = started as usize;
                for ahead in (g + 1..=g + plan.slots).take_while(|&a| a < total) {
                    let next = order[ahead % order.len()];
                    match cache.request(next, Loader::Prefetch, Some(w.id))? {
                        Request::Hit => {}
                        Request::Loaded(created) => prefetched.push(load(next, created)),
                        Request::NoRoom => break,
                    }
                }
                if let Request::Loaded(created) = cache.request(w, Loader::Compute, None)? {
                    out.push(load(w, created)(Loader::Compute, started));
                }
            }
            out.push(Event::Matmul {
                weight: ModelWeight::target(w.id),
                m: rows,
                k: w.k,
                n: w.n,
                ty: w.ty,
                bytes: w.bytes,
                domain: w.domain,
                calls: w.calls,
                quantized,
            });
            out.extend(
                prefetched
                    .into_iter()
                    .map(|l| l(Loader::Prefetch, started + 1)),
            );
            started += 1;
            Ok(())
        };
        for (ib, b) in shape.blocks.iter().enumerate() {
            let window = shape.windows.get(ib).copied().flatten();
            out.push(HostKind::norm(m, shape.d_model));
            for (i, w) in b[..3].iter().enumerate() {
                matmul(&mut out, &mut cache, w, m, i == 0)?;
            }
            out.push(HostKind::attention(
                m,
                context,
                window,
                shape.n_head,
                shape.n_head_kv,
                shape.head_dim,
                plan.kv_bytes,
            ));
            matmul(&mut out, &mut cache, &b[3], m, true)?;
            out.push(HostKind::norm(m, shape.d_model));
            matmul(&mut out, &mut cache, &b[4], m, true)?;
            matmul(&mut out, &mut cache, &b[5], m, false)?;
            matmul(&mut out, &mut cache, &b[6], m, true)?;
        }
        matmul(&mut out, &mut cache, &shape.output, 1, true)?;
        out.push(HostKind::sample(1, shape.vocab));
    }
    Ok(out)
}

/// The load of `w` into a new buffer (`created`) or a spare, once told who and after how many
/// matmuls.
fn load(w: &ShapeWeight, created: bool) -> impl Fn(Loader, u64) -> Event + '_ {
    move |by, after| Event::Load {
        weight: ModelWeight::target(w.id),
        bytes: w.bytes,
        domain: w.domain,
        created,
        by,
        after,
    }
}

/// What a request to [`Cache`] did.
enum Request {
    /// The weight was resident.
    Hit,
    /// It was loaded, into a new device buffer (`true`) or a spare one.
    Loaded(bool),
    /// A prefetch found no room it may make.
    NoRoom,
}

/// One weight in [`Cache`].
struct Slot {
    bytes: u64,
    domain: u32,
    last_use: u64,
    pinned: bool,
    /// Prefetched (or asked for by the prefetcher) and not used yet: the prefetcher may not
    /// evict it.
    wanted: bool,
}

/// How far down the LRU order an eviction looks for a victim whose buffer the incoming weight
/// can reuse (ork-residency's `REUSE_WINDOW`).
const REUSE_WINDOW: usize = 8;

/// ork's weight cache (`ork-residency`'s `WeightCache` with the `Lru` policy), as a sequential
/// simulation: a byte budget per domain; pinned weights load on first use and stay; a load
/// takes a spare buffer of its size if there is one, else frees spares of other sizes, else
/// evicts the least recently used weight it may evict — preferring, among the first
/// [`REUSE_WINDOW`] in LRU order, one whose buffer it can reuse — whose buffer becomes a spare.
/// The prefetcher may not evict a weight it asked for that compute has not used yet; compute
/// evicts those only when nothing else is evictable. Which weights survive a pass (a large
/// weight the reuse preference spares, what the pins leave room for) decides which loads the
/// run makes, so the plan's stream has the run's loads.
struct Cache<'n> {
    budget: u64,
    /// The names of the weights, for errors.
    names: &'n WeightNames,
    used: std::collections::HashMap<u32, u64>,
    slots: std::collections::HashMap<WeightId, Slot>,
    /// (domain, bytes) of buffers of evicted weights, oldest first (their bytes stay used).
    spares: Vec<(u32, u64)>,
    tick: u64,
}

impl<'n> Cache<'n> {
    fn new(budget: u64, names: &'n WeightNames) -> Cache<'n> {
        Cache {
            budget,
            names,
            used: Default::default(),
            slots: Default::default(),
            spares: Vec::new(),
            tick: 0,
        }
    }

    /// `by` asks for `w`; `leased` is the weight compute holds meanwhile (not evictable).
    fn request(
        &mut self,
        w: &ShapeWeight,
        by: Loader,
        leased: Option<WeightId>,
    ) -> Result<Request, BoardError> {
        self.tick += 1;
        if let Some(s) = self.slots.get_mut(&w.id) {
            match by {
                Loader::Compute => {
                    s.last_use = self.tick;
                    s.wanted = false;
                }
                Loader::Prefetch => s.wanted = !s.pinned,
            }
            return Ok(Request::Hit);
        }
        let (d, size) = (w.domain, w.bytes);
        if size > self.budget {
            return Err(BoardError::Stream(format!(
                "weight '{}' ({size} bytes) exceeds the budget of {} bytes",
                self.names.key(w.id),
                self.budget
            )));
        }
        let mut reuse = self.take_spare(d, size);
        while self.used.get(&d).copied().unwrap_or(0) + size > self.budget {
            if let Some(i) = self.spares.iter().position(|s| s.0 == d) {
                let (_, b) = self.spares.remove(i);
                *self.used.entry(d).or_default() -= b;
                continue;
            }
            if self.evict(d, by, leased, (!reuse).then_some(size)) {
                if !reuse {
                    reuse = self.take_spare(d, size);
                }
                continue;
            }
            return match by {
                Loader::Prefetch => Ok(Request::NoRoom),
                Loader::Compute => Err(BoardError::Stream(format!(
                    "no room for weight '{}' in a budget of {} bytes (pinned weights fill it)",
                    self.names.key(w.id),
                    self.budget
                ))),
            };
        }
        *self.used.entry(d).or_default() += size;
        self.slots.insert(
            w.id,
            Slot {
                bytes: size,
                domain: d,
                last_use: self.tick,
                pinned: w.pinned,
                wanted: by == Loader::Prefetch && !w.pinned,
            },
        );
        Ok(Request::Loaded(!reuse))
    }

    /// Take a spare buffer of exactly `size` bytes in `d` (its bytes are booked again by the
    /// caller): whether there was one.
    fn take_spare(&mut self, d: u32, size: u64) -> bool {
        match self.spares.iter().position(|s| *s == (d, size)) {
            Some(i) => {
                self.spares.swap_remove(i);
                *self.used.entry(d).or_default() -= size;
                true
            }
            None => false,
        }
    }

    /// Evict one weight of `d` that `by` may evict (least recently used; with `reuse_size`, one
    /// of that size among the first [`REUSE_WINDOW`]); its buffer becomes a spare.
    fn evict(
        &mut self,
        d: u32,
        by: Loader,
        leased: Option<WeightId>,
        reuse_size: Option<u64>,
    ) -> bool {
        let mut evictable: Vec<(&WeightId, &Slot)> = self
            .slots
            .iter()
            .filter(|(id, s)| {
                s.domain == d
                    && !s.pinned
                    && leased != Some(**id)
                    && !(by == Loader::Prefetch && s.wanted)
            })
            .collect();
        if evictable.iter().any(|(_, s)| !s.wanted) {
            evictable.retain(|(_, s)| !s.wanted);
        }
        evictable.sort_by_key(|(_, s)| s.last_use);
        let Some(first) = evictable.first() else {
            return false;
        };
        let pick = *reuse_size
            .and_then(|size| {
                evictable
                    .iter()
                    .take(REUSE_WINDOW)
                    .find(|(_, s)| s.bytes == size)
            })
            .unwrap_or(first)
            .0;
        let slot = self.slots.remove(&pick).expect("picked from the slots");
        self.spares.push((d, slot.bytes));
        true
    }
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
        load(w, created)(by, after)
    }
}
