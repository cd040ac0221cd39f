//! The planned schedule of a mixture-of-experts decoder (Qwen3-MoE-shaped: per block attention,
//! a router over `n_expert` experts, the `top_k` chosen experts' gate/up/down) as an event
//! stream, with an expert cache in device memory and three ways of bringing a missing expert in:
//!
//! - [`ExpertPrefetch::OnDemand`]: the compute thread loads an expert when it reaches it;
//! - [`ExpertPrefetch::Router`]: when a block's router has run, its chosen experts are announced
//!   to the prefetch thread, which loads the missing ones while compute runs the others;
//! - [`ExpertPrefetch::Speculative`]: when a block's router has run, the next block's experts
//!   are also predicted (a fraction `recall` of its true experts, the rest of the prediction
//!   wrong) and loaded; what the prediction missed is loaded when that block's router has run.
//!
//! Routing is drawn uniformly at random from a fixed seed (real routers are skewed, which makes
//! a cache of a given size hit more often than here: these figures are a lower bound for the
//! cache). Dense weights (attention, routers, output) are resident, loaded before the clock; the
//! cache starts full (a warm cache), and is least-recently-used out. The replay, not a formula,
//! turns the stream into time: see `docs/board-model.md`.

use std::collections::HashMap;
use std::sync::Arc;

use ork_manifest::{Role, WeightNames};

use crate::events::{Event, HostKind, Loader, ModelWeight, WeightType};
use crate::schedule::{attention_weights, shape_id, shape_names, weight_bytes, Loads, ShapeWeight};
use crate::{BoardError, Chip};

/// Published dimensions of a Qwen3-MoE-shaped model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeDims {
    /// Blocks.
    pub n_layer: usize,
    /// Width.
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Experts per block.
    pub n_expert: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// One expert's FFN width.
    pub expert_ffn: usize,
    /// Vocabulary.
    pub vocab: usize,
}

impl MoeDims {
    /// Qwen3-30B-A3B (its `config.json`: 48 blocks, hidden 2048, 32 / 4 heads of 128, 128
    /// experts, 8 per token, expert FFN 768, vocabulary 151936).
    pub const QWEN3_30B_A3B: MoeDims = MoeDims {
        n_layer: 48,
        d_model: 2048,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        top_k: 8,
        expert_ffn: 768,
        vocab: 151936,
    };

    /// Device bytes of one expert (gate, up, down) with weights of type `ty`.
    pub fn expert_bytes(&self, ty: WeightType) -> u64 {
        2 * weight_bytes(self.d_model, self.expert_ffn, ty)
            + weight_bytes(self.expert_ffn, self.d_model, ty)
    }

    /// Device bytes of the dense weights (attention, routers, output).
    pub fn dense_bytes(&self, ty: WeightType) -> u64 {
        let (d, q, kv) = (
            self.d_model,
            self.n_head * self.head_dim,
            self.n_head_kv * self.head_dim,
        );
        let block = weight_bytes(d, q, ty)
            + 2 * weight_bytes(d, kv, ty)
            + weight_bytes(q, d, ty)
            + weight_bytes(d, self.n_expert, ty);
        self.n_layer as u64 * block + weight_bytes(d, self.vocab, ty)
    }

    /// Device bytes of the whole pack.
    pub fn total_bytes(&self, ty: WeightType) -> u64 {
        self.dense_bytes(ty) + (self.n_layer * self.n_expert) as u64 * self.expert_bytes(ty)
    }
}

/// How a missing expert is brought in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertPrefetch {
    /// By the compute thread, when it reaches the expert.
    OnDemand,
    /// By the prefetch thread, once the block's router has run.
    Router,
    /// As [`ExpertPrefetch::Router`], and the next block's experts predicted when this block's
    /// router has run, a fraction `recall` (0..=1) of them right.
    Speculative {
        /// Fraction of the next block's true experts the prediction contains.
        recall: f64,
    },
}

/// How the MoE schedule runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoePlan {
    /// Weight type of every matmul.
    pub ty: WeightType,
    /// How missing experts come in.
    pub prefetch: ExpertPrefetch,
    /// Experts the device cache holds, over all blocks (at least `2 × top_k` are kept as
    /// staging buffers whatever this says).
    pub cache_experts: usize,
    /// Prompt tokens (one prefill pass).
    pub prompt_tokens: usize,
    /// Generated tokens (one decode pass for each after the first).
    pub gen_tokens: usize,
    /// Bytes per KV-cache value.
    pub kv_bytes: usize,
    /// Seed of the routing draw.
    pub seed: u64,
}

/// The stream and what the replay needs beside it.
#[derive(Clone, Debug)]
pub struct MoeSchedule {
    /// The events.
    pub events: Vec<Event>,
    /// Device bytes held: dense weights, the expert cache, the KV cache.
    pub device_bytes: u64,
    /// Experts the cache held (after the staging minimum).
    pub cache_experts: usize,
    /// Expert uses in decode passes, and how many of them the cache served.
    pub decode_uses: u64,
    /// Of [`MoeSchedule::decode_uses`], those in the cache when the block's router ran (a
    /// speculative prefetch's right predictions count as hits).
    pub decode_hits: u64,
    /// The page cache's steady state for [`crate::replay_warm`]: the experts the device cache
    /// does not hold, in random order (what uniform routing leaves in an LRU page cache).
    pub warm: Vec<(ModelWeight, u64)>,
    /// The name table of the events' weights ([`crate::shape_names`]: the manifest's keys of a
    /// GGUF of these dims), for printing them.
    pub names: Arc<WeightNames>,
    /// Per pass, the passes it stands for: give them to [`crate::Timeline::weigh_passes`] after
    /// the replay (all 1 up to [`crate::DECODE_PASSES_REPLAYED`] decode passes).
    pub pass_weights: Vec<f64>,
}

/// splitmix64: a fixed, dependency-free draw.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform draw in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `k` distinct values below `n`, in draw order.
    fn choose(&mut self, n: usize, k: usize, not: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(k);
        while out.len() < k.min(n - not.len().min(n)) {
            let e = (self.next() % n as u64) as usize;
            if !out.contains(&e) && !not.contains(&e) {
                out.push(e);
            }
        }
        out
    }
}

/// An LRU set of (block, expert).
struct Cache {
    capacity: usize,
    tick: u64,
    held: HashMap<(usize, usize), u64>,
}

impl Cache {
    fn touch(&mut self, key: (usize, usize)) -> bool {
        self.tick += 1;
        self.held.insert(key, self.tick).is_some()
    }

    /// Refresh `key` if held: true on a hit.
    fn touch_if_held(&mut self, key: (usize, usize)) -> bool {
        self.held.contains_key(&key) && self.touch(key)
    }

    fn contains(&self, key: (usize, usize)) -> bool {
        self.held.contains_key(&key)
    }

    /// Insert `key`, evicting the least recently used beyond capacity.
    fn insert(&mut self, key: (usize, usize)) {
        self.touch(key);
        while self.held.len() > self.capacity {
            let victim = *self
                .held
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k)
                .expect("over capacity means an entry");
            self.held.remove(&victim);
        }
    }
}

/// The event stream of running `dims` as `plan` says on `chip`. Decode passes beyond
/// [`crate::DECODE_PASSES_REPLAYED`] are sampled as [`crate::sampled_passes`] samples them
/// ([`MoeSchedule::pass_weights`]), so a plan's memory and replay time do not grow with its
/// token count.
pub fn moe_schedule(
    dims: &MoeDims,
    plan: &MoePlan,
    chip: &Chip,
) -> Result<MoeSchedule, BoardError> {
    check(dims, plan)?;
    let weights = MoeWeights::new(dims, plan.ty, chip);
    let all = dims.n_layer * dims.n_expert;
    let capacity = plan.cache_experts.clamp(2 * dims.top_k, all);
    let mut run = MoeRun {
        dims,
        plan,
        w: &weights,
        cache: warm_cache(dims, capacity),
        // The warm cache's buffers exist: a load reuses an evicted expert's buffer.
        loads: Loads::new(0),
        rng: Rng(plan.seed),
        out: Vec::new(),
        started: 0,
        decode_uses: 0,
        decode_hits: 0,
    };
    let warm = run.warm_list();
    let (passes, pass_weights) = crate::schedule::sampled_passes(&crate::Plan {
        resident: true,
        slots: 0,
        budget_bytes: 0,
        prompt_tokens: plan.prompt_tokens,
        gen_tokens: plan.gen_tokens,
        kv_bytes: plan.kv_bytes,
    });
    for &(m, context) in &passes {
        run.pass(m, context);
    }
    let kv = dims.n_head_kv * dims.head_dim;
    let context_max = plan.prompt_tokens + plan.gen_tokens;
    let kv_bytes = (2 * dims.n_layer * kv * plan.kv_bytes * context_max) as u64;
    Ok(MoeSchedule {
        events: run.out,
        device_bytes: dims.dense_bytes(plan.ty)
            + capacity as u64 * dims.expert_bytes(plan.ty)
            + kv_bytes,
        cache_experts: capacity,
        decode_uses: run.decode_uses,
        decode_hits: run.decode_hits,
        warm,
        pass_weights,
        names: weights.names,
    })
}

/// `dims` and `plan` can be scheduled: a prompt, `top_k` within the experts, a recall in 0..=1.
fn check(dims: &MoeDims, plan: &MoePlan) -> Result<(), BoardError> {
    if plan.prompt_tokens == 0 {
        return Err(BoardError::Stream("a prompt of 0 tokens".into()));
    }
    if dims.top_k == 0 || dims.top_k > dims.n_expert {
        return Err(BoardError::Stream(format!(
            "top_k {} of {} experts",
            dims.top_k, dims.n_expert
        )));
    }
    if let ExpertPrefetch::Speculative { recall } = plan.prefetch {
        if !(0.0..=1.0).contains(&recall) {
            return Err(BoardError::Stream(format!(
                "recall {recall} is not in 0..=1"
            )));
        }
    }
    Ok(())
}

/// The schedule's weights: per block attention and router, the output, and each expert's.
struct MoeWeights {
    /// Their name table: per block attention and router, then each expert's gate, up, down.
    names: Arc<WeightNames>,
    dense: Vec<[ShapeWeight; 5]>,
    output: ShapeWeight,
    ty: WeightType,
    chip: Chip,
    /// (width, expert FFN width).
    dims: (usize, usize),
}

impl MoeWeights {
    fn new(dims: &MoeDims, ty: WeightType, chip: &Chip) -> MoeWeights {
        const BLOCK: [Role; 5] = [
            Role::AttnQ,
            Role::AttnK,
            Role::AttnV,
            Role::AttnOutput,
            Role::Router,
        ];
        let names = Arc::new(shape_names(dims.n_layer, &BLOCK, dims.n_expert));
        let w = |layer: Option<usize>, role: Role, k: usize, n: usize| {
            let id = shape_id(&names, role, layer, None);
            ShapeWeight::new(id, k, n, ty, chip, true)
        };
        let d = dims.d_model;
        let dense = (0..dims.n_layer)
            .map(|i| {
                let (h, kv, hd) = (dims.n_head, dims.n_head_kv, dims.head_dim);
                let b = |role, k, n| w(Some(i), role, k, n);
                let [q, k, v, o] = attention_weights(d, h, kv, hd, b);
                [q, k, v, o, b(Role::Router, d, dims.n_expert)]
            })
            .collect();
        let output = w(None, Role::Output, d, dims.vocab);
        MoeWeights {
            names,
            dense,
            output,
            ty,
            chip: chip.clone(),
            dims: (d, dims.expert_ffn),
        }
    }

    /// Expert `e` of block `b`: gate, up, down, the manifest's expert slices
    /// (`blk.B.ffn_gate_exps.weight#E`) as the run's own events key them.
    fn expert(&self, b: usize, e: usize) -> [ShapeWeight; 3] {
        let (d, ffn) = self.dims;
        let w = |role, k, n| {
            let id = shape_id(&self.names, role, Some(b), Some(e));
            ShapeWeight::new(id, k, n, self.ty, &self.chip, true)
        };
        [
            w(Role::ExpertGate, d, ffn),
            w(Role::ExpertUp, d, ffn),
            w(Role::ExpertDown, ffn, d),
        ]
    }
}

/// A warm device cache of `capacity` experts: an even share of every block's (routing is
/// uniform).
fn warm_cache(dims: &MoeDims, capacity: usize) -> Cache {
    let mut cache = Cache {
        capacity,
        tick: 0,
        held: HashMap::new(),
    };
    for i in 0..capacity {
        cache.insert((i % dims.n_layer, i / dims.n_layer));
    }
    cache
}

/// The schedule as it is written, pass by pass.
struct MoeRun<'a> {
    dims: &'a MoeDims,
    plan: &'a MoePlan,
    w: &'a MoeWeights,
    cache: Cache,
    loads: Loads,
    rng: Rng,
    out: Vec<Event>,
    started: u64,
    decode_uses: u64,
    decode_hits: u64,
}

impl MoeRun<'_> {
    /// The page cache's steady state: the experts the device cache does not hold, shuffled.
    fn warm_list(&mut self) -> Vec<(ModelWeight, u64)> {
        let dims = self.dims;
        let mut outside: Vec<(usize, usize)> = (0..dims.n_layer)
            .flat_map(|b| (0..dims.n_expert).map(move |e| (b, e)))
            .filter(|k| !self.cache.contains(*k))
            .collect();
        for i in (1..outside.len()).rev() {
            outside.swap(i, (self.rng.next() % (i as u64 + 1)) as usize);
        }
        outside
            .iter()
            .flat_map(|&(b, e)| {
                let experts = self.w.expert(b, e);
                experts.map(|x| (ModelWeight::target(x.id), x.bytes))
            })
            .collect()
    }

    /// Expert `key` into the device cache: a hit refreshes it, a miss loads it by `by` after the
    /// matmuls started so far.
    fn bring(&mut self, key: (usize, usize), by: Loader) {
        if self.cache.touch_if_held(key) {
            return;
        }
        for x in self.w.expert(key.0, key.1).iter() {
            self.out.push(self.loads.event(x, by, self.started));
        }
        self.cache.insert(key);
    }

    /// Each block's experts with their row counts, in first-use order, for `m` rows drawn up
    /// front (the prediction needs the next block's).
    fn route(&mut self, m: usize) -> Vec<Vec<(usize, usize)>> {
        let dims = self.dims;
        let routes: Vec<Vec<Vec<usize>>> = (0..dims.n_layer)
            .map(|_| {
                (0..m)
                    .map(|_| self.rng.choose(dims.n_expert, dims.top_k, &[]))
                    .collect()
            })
            .collect();
        routes
            .iter()
            .map(|rows| {
                let mut u: Vec<(usize, usize)> = Vec::new();
                for &e in rows.iter().flatten() {
                    match u.iter_mut().find(|(x, _)| *x == e) {
                        Some(c) => c.1 += 1,
                        None => u.push((e, 1)),
                    }
                }
                u
            })
            .collect()
    }

    /// One pass of `m` rows at `context`.
    fn pass(&mut self, m: usize, context: usize) {
        self.out.push(Event::Pass { tokens: m, context });
        let used = self.route(m);
        let speculate = match self.plan.prefetch {
            ExpertPrefetch::Speculative { recall } if m == 1 => Some(recall),
            _ => None,
        };
        for b in 0..self.dims.n_layer {
            self.attention(b, m, context);
            self.experts(b, m, &used, speculate);
        }
        matmul(&mut self.out, &mut self.started, &self.w.output, 1, true);
        self.out.push(HostKind::sample(1, self.dims.vocab));
    }

    /// Block `b`'s attention and router for `m` rows at `context`.
    fn attention(&mut self, b: usize, m: usize, context: usize) {
        let (dims, ws) = (self.dims, &self.w.dense[b]);
        let out = &mut self.out;
        out.push(HostKind::norm(m, dims.d_model));
        for (i, x) in ws[..3].iter().enumerate() {
            matmul(out, &mut self.started, x, m, i == 0);
        }
        out.push(HostKind::attention(
            m,
            context,
            None,
            dims.n_head,
            dims.n_head_kv,
            dims.head_dim,
            self.plan.kv_bytes,
        ));
        matmul(out, &mut self.started, &ws[3], m, true);
        out.push(HostKind::norm(m, dims.d_model));
        matmul(out, &mut self.started, &ws[4], m, true);
    }

    /// Block `b`'s experts once its router has run (its matmul started: the top-k on the host is
    /// negligible): the cache's hits counted, the loads the prefetch mode makes, the matmuls.
    fn experts(
        &mut self,
        b: usize,
        m: usize,
        used: &[Vec<(usize, usize)>],
        speculate: Option<f64>,
    ) {
        if m == 1 {
            self.decode_uses += used[b].len() as u64;
            self.decode_hits += used[b]
                .iter()
                .filter(|(e, _)| self.cache.contains((b, *e)))
                .count() as u64;
        }
        let on_demand = self.plan.prefetch == ExpertPrefetch::OnDemand;
        if !on_demand {
            for &(e, _) in &used[b] {
                self.bring((b, e), Loader::Prefetch);
            }
        }
        if let (Some(recall), Some(next)) = (speculate, used.get(b + 1)) {
            // The prediction: `recall` of the next block's experts, the rest wrong.
            let truth: Vec<usize> = next.iter().map(|(e, _)| *e).collect();
            let right = (recall * truth.len() as f64).round() as usize;
            let wrong = self
                .rng
                .choose(self.dims.n_expert, truth.len() - right, &truth);
            for e in truth[..right].iter().chain(&wrong) {
                self.bring((b + 1, *e), Loader::Prefetch);
            }
        }
        for &(e, rows) in &used[b] {
            if on_demand {
                self.bring((b, e), Loader::Compute);
            }
            let [g, u, dn] = self.w.expert(b, e);
            matmul(&mut self.out, &mut self.started, &g, rows, true);
            matmul(&mut self.out, &mut self.started, &u, rows, false);
            matmul(&mut self.out, &mut self.started, &dn, rows, true);
        }
    }
}

fn matmul(out: &mut Vec<Event>, started: &mut u64, x: &ShapeWeight, rows: usize, quantized: bool) {
    out.push(Event::Matmul {
        weight: ModelWeight::target(x.id),
        m: rows,
        k: x.k,
        n: x.n,
        ty: x.ty,
        bytes: x.bytes,
        domain: x.domain,
        calls: x.calls,
        quantized,
    });
    *started += 1;
}
