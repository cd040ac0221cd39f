//! The replay: a run's events become tasks on simulated resources — the compute thread (host
//! operations, and each NPU call it submits and waits for), the copy thread (the prefetcher's
//! loads) — with the dependencies the executor and prefetcher have: a matmul waits for the load
//! of its weight; a prefetch load starts no earlier than compute reached the matmul it followed in
//! the run; a load on the compute path blocks compute. Tasks that move bytes share the DDR
//! bandwidth: while an NPU read, a copy and a host operation overlap, each gets its demand's share
//! of it. Time advances from one task boundary to the next (a fluid simulation).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::events::{Event, Loader, ModelWeight, WeightType};
use crate::params::Board;
use crate::BoardError;

impl Timeline {
    /// Let pass `i` stand for `weights[i]` passes like it ([`crate::schedule::schedule_sampled`]):
    /// its duration (from the end of the pass before), its breakdown and its storage reads are
    /// multiplied by its weight, and the later passes' ends move by the difference. All weights
    /// 1: unchanged.
    pub fn weigh_passes(&mut self, weights: &[f64]) {
        if weights.iter().all(|&w| w == 1.0) {
            return;
        }
        let (mut before, mut weighed_before) = (0.0, 0.0);
        for (p, &w) in self.passes.iter_mut().zip(weights) {
            let duration = p.end_s - before;
            before = p.end_s;
            weighed_before += w * duration;
            p.end_s = weighed_before;
            p.breakdown = p.breakdown.scaled(1.0 / w);
            self.storage_bytes += (w - 1.0) * p.storage_bytes;
            p.storage_bytes *= w;
        }
    }
}

/// How to treat the run's loads.
#[derive(Clone, Copy, Debug)]
pub struct ReplayOptions {
    /// Weights the plan keeps are loaded before the clock starts (reported as
    /// [`Timeline::load_s`]), as a resident runtime loads its model before the first prompt:
    /// the first load of a weight loaded exactly once, or loaded in fewer passes than use it
    /// (the cache kept it between some of them; its later loads, after an eviction, stay on the
    /// clock). A weight loaded for every pass that uses it is streamed: all its loads are on the
    /// clock.
    pub preload: bool,
    /// Bytes of device buffers (weights and KV) held in RAM, which the page cache cannot use.
    pub device_bytes: f64,
    /// A prefetch thread with this many slots ran: every load goes to the copy thread and may
    /// start once compute has started the matmul `slots` before the one that uses the weight
    /// (or earlier, if it did in the run). A run on the emulator records which loads the
    /// prefetcher won against compute at the emulator's speeds; on the board that race has
    /// other odds, so the prefetcher's rule decides, not the recorded loader. `None`: the
    /// loaders as recorded.
    pub prefetch_slots: Option<usize>,
}

/// Where the compute thread's time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// NPU computing or reading weights, with compute waiting for it.
    pub npu_s: f64,
    /// Fixed per-call costs of matmuls (submit, job start, completion).
    pub submit_s: f64,
    /// IOMMU domain switches.
    pub domain_switch_s: f64,
    /// Host operations (attention, norms, quantizing activations, sampling).
    pub host_s: f64,
    /// Compute waiting for a weight: on-demand loads and prefetches not finished in time.
    pub copy_stall_s: f64,
}

impl Breakdown {
    pub(crate) fn add(&mut self, o: &Breakdown) {
        self.npu_s += o.npu_s;
        self.submit_s += o.submit_s;
        self.domain_switch_s += o.domain_switch_s;
        self.host_s += o.host_s;
        self.copy_stall_s += o.copy_stall_s;
    }

    /// Every category divided by `d`.
    pub fn scaled(&self, d: f64) -> Breakdown {
        Breakdown {
            npu_s: self.npu_s / d,
            submit_s: self.submit_s / d,
            domain_switch_s: self.domain_switch_s / d,
            host_s: self.host_s / d,
            copy_stall_s: self.copy_stall_s / d,
        }
    }

    /// The sum of the categories.
    pub fn total(&self) -> f64 {
        self.npu_s + self.submit_s + self.domain_switch_s + self.host_s + self.copy_stall_s
    }
}

/// One forward pass on the simulated board.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PassTime {
    /// Tokens appended.
    pub tokens: usize,
    /// Positions in the KV cache before it.
    pub context: usize,
    /// When its last compute task ended (seconds since the clock started).
    pub end_s: f64,
    /// Where its compute time went.
    pub breakdown: Breakdown,
    /// Bytes read from storage by its loads during the clock.
    pub storage_bytes: f64,
}

/// The replayed run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Loading the resident weights before the clock started (one copy thread).
    pub load_s: f64,
    /// The passes in order.
    pub passes: Vec<PassTime>,
    /// Bytes read from storage during the clock (page-cache misses).
    pub storage_bytes: f64,
    /// Device buffers created during the clock.
    pub buffers_created: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cat {
    Host,
    Npu,
    Switch,
    Load,
}

#[derive(Clone, Debug)]
struct Task {
    actor: usize,
    cat: Cat,
    /// Seconds that use no DDR bandwidth (fixed costs, storage reads), run first.
    fixed: f64,
    /// DDR bytes moved after the fixed part.
    bytes: f64,
    /// The rate the task moves them at on an idle bus.
    rate: f64,
    /// A task that must have finished first.
    dep: Option<usize>,
    /// A task that must have started first.
    after: Option<usize>,
    pass: Option<usize>,
}

const COMPUTE: usize = 0;
const COPY: usize = 1;

/// A page cache of the pack's blobs: least recently used out.
struct PageCache {
    capacity: f64,
    used: f64,
    tick: u64,
    entries: HashMap<ModelWeight, (u64, f64)>,
}

impl PageCache {
    /// Read `bytes` of weight `w`'s blob: true on a hit.
    fn read(&mut self, w: ModelWeight, bytes: f64) -> bool {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.entries.get_mut(&w) {
            e.0 = tick;
            return true;
        }
        if bytes > self.capacity {
            return false;
        }
        while self.used + bytes > self.capacity {
            let victim = self
                .entries
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| *k)
                .expect("used > 0 means an entry");
            let (_, b) = self.entries.remove(&victim).expect("just found");
            self.used -= b;
        }
        self.entries.insert(w, (tick, bytes));
        self.used += bytes;
        false
    }
}

/// Replay `events` on `board`, the page cache warm as if the same run had just run.
pub fn replay(
    events: &[Event],
    board: &Board,
    opts: ReplayOptions,
) -> Result<Timeline, BoardError> {
    replay_warm(events, board, opts, None)
}

/// Replay `events` on `board`, the page cache warmed by reading `warm` (weight, bytes) in
/// order instead (`None`: the run's own loads, as [`replay()`]). A plan whose working set is
/// larger than one run's loads (a mixture of experts' pack) gives its steady state here.
pub fn replay_warm(
    events: &[Event],
    board: &Board,
    opts: ReplayOptions,
    warm: Option<&[(ModelWeight, u64)]>,
) -> Result<Timeline, BoardError> {
    board.validate()?;
    let usage = Usage::of(events);
    let mut page_cache = warm_page_cache(events, board, &opts, warm);
    let mut build = Build {
        board,
        opts,
        usage,
        next_use: next_uses(events),
        page_cache: &mut page_cache,
        timeline: Timeline::default(),
        tasks: Vec::new(),
        matmul_task: Vec::new(),
        last_load: HashMap::new(),
        first_load: Default::default(),
        last_domain: None,
        leader: 0,
        pass: None,
    };
    for (index, e) in events.iter().enumerate() {
        build.event(index, e)?;
    }
    let Build {
        tasks,
        mut timeline,
        ..
    } = build;
    simulate(&tasks, board.chip.ddr_bw, &mut timeline)?;
    check_finite(&timeline)?;
    Ok(timeline)
}

/// How often each weight is loaded, and in how many passes a matmul uses it.
struct Usage {
    loads_of: HashMap<ModelWeight, usize>,
    /// Passes that use each weight (a matmul of it), counted once per pass: (count, last pass).
    used_in: HashMap<ModelWeight, (usize, usize)>,
}

impl Usage {
    fn of(events: &[Event]) -> Usage {
        let mut u = Usage {
            loads_of: HashMap::new(),
            used_in: HashMap::new(),
        };
        let mut pass_no = 0usize;
        for e in events {
            match e {
                Event::Load { weight, .. } => *u.loads_of.entry(*weight).or_default() += 1,
                Event::Pass { .. } => pass_no += 1,
                Event::Matmul { weight, .. } => {
                    let c = u.used_in.entry(*weight).or_insert((0, usize::MAX));
                    if c.1 != pass_no {
                        *c = (c.0 + 1, pass_no);
                    }
                }
                Event::Host { .. } => {}
            }
        }
        u
    }

    /// The plan keeps `w`: loaded once, or in fewer passes than use it.
    fn kept(&self, w: ModelWeight) -> bool {
        let loads = self.loads_of.get(&w).copied().unwrap_or(0);
        loads == 1 || loads < self.used_in.get(&w).map_or(0, |u| u.0)
    }
}

/// The page cache as the replay starts: warmed by `warm`, or as if the same run had just run
/// (its last-used blobs are cached).
fn warm_page_cache(
    events: &[Event],
    board: &Board,
    opts: &ReplayOptions,
    warm: Option<&[(ModelWeight, u64)]>,
) -> PageCache {
    let mut page_cache = PageCache {
        capacity: (board.ram_bytes - board.reserved_bytes - opts.device_bytes).max(0.0),
        used: 0.0,
        tick: 0,
        entries: HashMap::new(),
    };
    match warm {
        Some(list) => {
            for (weight, bytes) in list {
                page_cache.read(*weight, *bytes as f64);
            }
        }
        None => {
            for e in events {
                if let Event::Load { weight, bytes, .. } = e {
                    page_cache.read(*weight, *bytes as f64);
                }
            }
        }
    }
    page_cache
}

/// For each load, the number of the next matmul that uses its weight.
fn next_uses(events: &[Event]) -> Vec<Option<u64>> {
    let mut next_use: Vec<Option<u64>> = vec![None; events.len()];
    let total = events
        .iter()
        .filter(|e| matches!(e, Event::Matmul { .. }))
        .count() as u64;
    let mut number = total;
    let mut seen: HashMap<ModelWeight, u64> = HashMap::new();
    for (i, e) in events.iter().enumerate().rev() {
        match e {
            Event::Matmul { weight, .. } => {
                number -= 1;
                seen.insert(*weight, number);
            }
            Event::Load { weight, .. } => next_use[i] = seen.get(weight).copied(),
            _ => {}
        }
    }
    next_use
}

/// The events turned into tasks, one at a time.
struct Build<'a, 'p> {
    board: &'a Board,
    opts: ReplayOptions,
    usage: Usage,
    next_use: Vec<Option<u64>>,
    page_cache: &'p mut PageCache,
    timeline: Timeline,
    tasks: Vec<Task>,
    /// Per matmul, the task its loads wait for (its batch's first).
    matmul_task: Vec<usize>,
    last_load: HashMap<ModelWeight, usize>,
    first_load: std::collections::HashSet<ModelWeight>,
    last_domain: Option<u32>,
    leader: usize,
    pass: Option<usize>,
}

impl Build<'_, '_> {
    fn event(&mut self, index: usize, e: &Event) -> Result<(), BoardError> {
        match e {
            Event::Pass { tokens, context } => {
                self.timeline.passes.push(PassTime {
                    tokens: *tokens,
                    context: *context,
                    ..PassTime::default()
                });
                self.pass = Some(self.timeline.passes.len() - 1);
            }
            Event::Load {
                weight,
                bytes,
                created,
                by,
                after,
                ..
            } => self.load(index, *weight, *bytes, *created, (*by, *after))?,
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
            } => {
                let dims = (*m as f64, *k as f64, *n as f64);
                self.matmul(*weight, dims, (*ty, *bytes, *domain, *calls), *quantized);
            }
            Event::Host { flops, bytes, .. } => {
                let t = host_task(&self.board.chip, *flops, *bytes, self.pass);
                self.tasks.push(t);
            }
        }
        Ok(())
    }

    /// A load of `weight` (`bytes`, into a new buffer if `created`) by `by` after `after`
    /// matmuls: before the clock (preloaded), or a task of the copy or the compute thread.
    fn load(
        &mut self,
        index: usize,
        weight: ModelWeight,
        bytes: u64,
        created: bool,
        (by, after): (Loader, u64),
    ) -> Result<(), BoardError> {
        let (board, chip) = (self.board, &self.board.chip);
        let b = bytes as f64;
        let hit = self.page_cache.read(weight, b);
        let mut fixed = b * chip.sync_s_per_byte;
        if created {
            fixed += chip.alloc_s + b * chip.map_s_per_byte;
        }
        if !hit {
            fixed += b / board.storage_read_bw;
        }
        if self.opts.preload && self.first_load.insert(weight) && self.usage.kept(weight) {
            self.timeline.load_s += fixed + b / chip.memcpy_bw;
            return Ok(());
        }
        if created {
            self.timeline.buffers_created += 1;
        }
        if !hit {
            self.timeline.storage_bytes += b;
            if let Some(p) = self.pass {
                self.timeline.passes[p].storage_bytes += b;
            }
        }
        let (by, after) = match (self.opts.prefetch_slots, self.next_use[index]) {
            (Some(slots), Some(g)) => {
                let rule = (g + 1).saturating_sub(slots as u64);
                (Loader::Prefetch, rule.min(after))
            }
            _ => (by, after),
        };
        let (actor, after) = match by {
            Loader::Compute => (COMPUTE, None),
            Loader::Prefetch => (COPY, self.started_task(weight, after)?),
        };
        self.last_load.insert(weight, self.tasks.len());
        self.tasks.push(Task {
            actor,
            cat: Cat::Load,
            fixed,
            // A copy reads and writes every byte.
            bytes: 2.0 * b,
            rate: 2.0 * chip.memcpy_bw,
            dep: None,
            after,
            pass: self.pass,
        });
        Ok(())
    }

    /// The task a prefetch load of `weight` that follows matmul `after` waits to start.
    fn started_task(&self, weight: ModelWeight, after: u64) -> Result<Option<usize>, BoardError> {
        (after as usize)
            .checked_sub(1)
            .map(|i| {
                self.matmul_task.get(i).copied().ok_or_else(|| {
                    BoardError::Stream(format!(
                        "load of {weight} follows matmul {after}, but only {} were recorded \
                         before it",
                        self.matmul_task.len()
                    ))
                })
            })
            .transpose()
    }

    /// A matmul of `weight` (`m × k × n`; its type, device bytes, domain and calls): its
    /// activations' quantization, a domain switch, the NPU's task.
    fn matmul(
        &mut self,
        weight: ModelWeight,
        (m, k, n): (f64, f64, f64),
        (ty, bytes, domain, calls): (WeightType, u64, u32, u32),
        quantized: bool,
    ) {
        let chip = &self.board.chip;
        // The executor announces a batch's weights (q/k/v, gate/up) to the prefetcher together,
        // when the batch starts: a load waiting for any of them waits for the batch's first
        // matmul.
        if quantized || self.matmul_task.is_empty() {
            self.leader = self.tasks.len();
        }
        self.matmul_task.push(self.leader);
        if quantized {
            self.tasks
                .push(host_task(chip, 3.0 * m * k, 5.0 * m * k, self.pass));
        }
        if self.last_domain.is_some_and(|d| d != domain) {
            self.tasks.push(Task {
                actor: COMPUTE,
                cat: Cat::Switch,
                fixed: chip.domain_switch_s,
                bytes: 0.0,
                rate: 1.0,
                dep: None,
                after: None,
                pass: self.pass,
            });
        }
        self.last_domain = Some(domain);
        // The NPU reads the weight, the activations once per call, writes f32 outputs.
        let traffic = bytes as f64 + m * k * f64::from(calls) + 4.0 * m * n;
        let compute_s = 2.0 * m * k * n / chip.ops(ty);
        let rate = chip.npu_read_bw.min(traffic / compute_s.max(1e-12));
        self.tasks.push(Task {
            actor: COMPUTE,
            cat: Cat::Npu,
            fixed: f64::from(calls) * chip.call_s,
            bytes: traffic,
            rate,
            dep: self.last_load.get(&weight).copied(),
            after: None,
            pass: self.pass,
        });
    }
}

/// Every time of `timeline` finite and not negative: the parameter ranges make it so; a
/// violation is an error, never a printed `inf`, `NaN` or negative time.
fn check_finite(timeline: &Timeline) -> Result<(), BoardError> {
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    if !ok(timeline.load_s) || !ok(timeline.storage_bytes) {
        return Err(BoardError::Replay(format!(
            "load time {} s or storage bytes {} not finite and non-negative",
            timeline.load_s, timeline.storage_bytes
        )));
    }
    for (i, p) in timeline.passes.iter().enumerate() {
        let b = &p.breakdown;
        let all = [
            p.end_s,
            b.npu_s,
            b.submit_s,
            b.domain_switch_s,
            b.host_s,
            b.copy_stall_s,
        ];
        if !all.into_iter().all(ok) {
            return Err(BoardError::Replay(format!(
                "pass {i} has a time that is not finite and non-negative: end {} s, {b:?}",
                p.end_s
            )));
        }
    }
    Ok(())
}

fn host_task(chip: &crate::Chip, flops: f64, bytes: f64, pass: Option<usize>) -> Task {
    let flop_s = flops / (chip.host_cores * chip.host_core_flops);
    let bytes = bytes.max(1.0);
    Task {
        actor: COMPUTE,
        cat: Cat::Host,
        fixed: chip.host_op_s,
        bytes,
        rate: chip.ddr_bw.min(bytes / flop_s.max(1e-12)),
        dep: None,
        after: None,
        pass,
    }
}

/// A task in progress.
struct Running {
    task: usize,
    fixed: f64,
    bytes: f64,
    start: f64,
}

/// Run the tasks on their actors, in each actor's order, and account the compute thread's time.
fn simulate(tasks: &[Task], ddr_bw: f64, timeline: &mut Timeline) -> Result<(), BoardError> {
    let mut queues: [VecDeque<usize>; 2] = [VecDeque::new(), VecDeque::new()];
    for (i, t) in tasks.iter().enumerate() {
        queues[t.actor].push_back(i);
    }
    let mut started = vec![false; tasks.len()];
    let mut finished = vec![false; tasks.len()];
    let mut running: [Option<Running>; 2] = [None, None];
    // When the compute thread last became idle (a stall runs from then to its next start).
    let mut idle_since = 0.0f64;
    let mut now = 0.0f64;
    // Each step ends at least one task (the one whose end is nearest), or leaves it a rounding
    // residue the next step ends: twice the tasks, plus slack, bounds a finite replay.
    let bound = 4 * tasks.len() + 64;
    let mut steps = 0usize;
    loop {
        steps += 1;
        bounded(steps, bound, tasks.len(), now)?;
        // Start what can start; starting one task can release another actor's.
        let mut changed = true;
        while changed {
            changed = false;
            for a in 0..2 {
                if running[a].is_some() {
                    continue;
                }
                let Some(&t) = queues[a].front() else {
                    continue;
                };
                let task = &tasks[t];
                let ready =
                    task.dep.is_none_or(|d| finished[d]) && task.after.is_none_or(|s| started[s]);
                if !ready {
                    continue;
                }
                queues[a].pop_front();
                started[t] = true;
                if a == COMPUTE {
                    if let Some(p) = task.pass {
                        timeline.passes[p].breakdown.copy_stall_s += now - idle_since;
                    }
                }
                running[a] = Some(Running {
                    task: t,
                    fixed: task.fixed,
                    bytes: task.bytes,
                    start: now,
                });
                changed = true;
            }
        }
        if running.iter().all(Option::is_none) {
            if queues.iter().all(VecDeque::is_empty) {
                break;
            }
            return Err(BoardError::Stream(
                "the event stream's dependencies form a cycle (a matmul waits for a load that \
                 waits for a later matmul)"
                    .into(),
            ));
        }
        let (share, step) = next_step(tasks, &running, ddr_bw, now)?;
        now += step;
        for slot in running.iter_mut() {
            let Some(r) = slot else { continue };
            if r.fixed > 0.0 {
                r.fixed -= step;
                if r.fixed <= 1e-15 * now.max(1.0) {
                    r.fixed = 0.0;
                }
            } else {
                r.bytes -= tasks[r.task].rate * share * step;
            }
            if r.fixed <= 0.0 && r.bytes <= 1e-6 {
                let task = &tasks[r.task];
                finished[r.task] = true;
                if task.actor == COMPUTE {
                    idle_since = now;
                    if let Some(p) = task.pass {
                        account(task, now - r.start, now, &mut timeline.passes[p]);
                    }
                }
                *slot = None;
            }
        }
    }
    Ok(())
}

/// The running tasks' shares of the bus (those moving bytes share it by demand) and the time to
/// the nearest end of a task or of its fixed part.
fn next_step(
    tasks: &[Task],
    running: &[Option<Running>; 2],
    ddr_bw: f64,
    now: f64,
) -> Result<(f64, f64), BoardError> {
    let demand: f64 = running
        .iter()
        .flatten()
        .filter(|r| r.fixed <= 0.0)
        .map(|r| tasks[r.task].rate)
        .sum();
    let share = if demand > ddr_bw {
        ddr_bw / demand
    } else {
        1.0
    };
    let step = running
        .iter()
        .flatten()
        .map(|r| {
            if r.fixed > 0.0 {
                r.fixed
            } else {
                r.bytes / (tasks[r.task].rate * share)
            }
        })
        .fold(f64::INFINITY, f64::min);
    if !step.is_finite() || step < 0.0 {
        return Err(BoardError::Replay(format!(
            "a step of {step} s at {now} s (a rate or time out of range)"
        )));
    }
    Ok((share, step))
}

/// The simulation's step `steps` within `bound` (for `tasks` tasks, at `now`).
fn bounded(steps: usize, bound: usize, tasks: usize, now: f64) -> Result<(), BoardError> {
    if steps > bound {
        return Err(BoardError::Replay(format!(
            "no end after {bound} steps for {tasks} tasks (the simulated time stopped advancing \
             at {now} s)"
        )));
    }
    Ok(())
}

/// A compute task of pass `pt` ended at `now` after `dur` seconds: the pass's end and breakdown.
fn account(task: &Task, dur: f64, now: f64, pt: &mut PassTime) {
    pt.end_s = now;
    let mut b = Breakdown::default();
    match task.cat {
        Cat::Host => b.host_s = dur,
        Cat::Switch => b.domain_switch_s = dur,
        Cat::Load => b.copy_stall_s = dur,
        Cat::Npu => {
            b.submit_s = task.fixed;
            // The fixed part runs first, so `dur >= fixed` but for rounding.
            b.npu_s = (dur - task.fixed).max(0.0);
        }
    }
    pt.breakdown.add(&b);
}
