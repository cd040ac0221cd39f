//! The prefetch thread: while the device computes with weight *i*, it fills the slots for the
//! weights that come next.
//!
//! What comes next is a [`ScheduleSource`]'s answer. [`PlanOrder`] is the model's matmul order
//! for one forward pass; passes repeat (prefill, then every decoded token), so it wraps around.
//! [`Announced`] serves the weights the executor announced ([`Prefetcher::announce`]: a router's
//! expert choice, a draft's batch) before its inner source's order. The compute path reports its
//! position with [`Prefetcher::advance`]; the thread then fetches up to `slots` weights ahead
//! (every announced weight and then `slots`, with [`Announced`]), as long as the cache can make
//! room without evicting a weight it prefetched for the latest announcement that has not been
//! used yet. With `cores + 1` slots every core has a ready weight and one is always loading.
//!
//! The thread is a `std::thread` fed by a channel, outside the rayon pool that computes, and it
//! is the only worker of a rayon pool of its own ([`spawn_loader`]): a fetch that must pack a
//! weight packs it with ork-pack's parallel kernel, and that work must not be queued on the
//! compute pool, whose workers may all be blocked waiting for that very weight (a deadlock: a
//! resident first pass packing from the GGUF hung a test run this way before the loaders had
//! pools of their own).
//! A failed prefetch (an error, or a panic inside the fetch) drops its slot and wakes anyone
//! waiting for that weight; the compute path then fetches the weight itself, so the error it
//! reports (naming the tensor) is its own, and a transient failure costs only time. A dead
//! thread likewise only means the compute path fetches everything on demand.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use ork_manifest::WeightId;

use crate::cache::WeightCache;

/// Where the prefetcher's lookahead comes from: which weights compute uses next.
///
/// The prefetch thread owns the source and asks it, after every message, for the weights ahead
/// of compute ([`ScheduleSource::ahead`]) until it has `slots` of them in the cache. The source
/// only names weights (by their ids in the cache, [`WeightCache::id`]); the thread fetches them,
/// so a wrong guess costs time and budget, never a wrong result.
pub trait ScheduleSource: Send {
    /// Compute is about to use weight `id`. Returns how many entries the lookahead moved by (the
    /// entry that was `ahead(i)` is now `ahead(i - moved)`), so the thread does not ask the
    /// cache again for those it already handled; [`usize::MAX`] when the lookahead changed in
    /// another way (the thread then walks it from the start: asking for a resident weight is
    /// cheap).
    fn advance(&mut self, id: WeightId) -> usize;

    /// The executor announced `ids` as the weights it uses next, in order (a router's expert
    /// choice, a draft's batch). The default ignores them.
    fn announce(&mut self, ids: Vec<WeightId>) {
        let _ = ids;
    }

    /// The `i`-th weight after the one compute is at (`0` is the next), or `None` past what the
    /// source knows.
    fn ahead(&self, i: usize) -> Option<WeightId>;

    /// How many entries of the lookahead the thread brings in, given `slots` (the default).
    fn reach(&self, slots: usize) -> usize {
        slots
    }
}

/// The static plan order: the model's matmul weights in execution order, wrapping around from
/// the last to the first (the next pass). Weights not in the schedule leave it where it is.
#[derive(Debug, Clone)]
pub struct PlanOrder {
    schedule: Vec<WeightId>,
    positions: HashMap<WeightId, usize>,
    cursor: Option<usize>,
}

impl PlanOrder {
    /// The order `schedule` (weight ids in execution order).
    pub fn new(schedule: Vec<WeightId>) -> Self {
        let positions = schedule.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        PlanOrder {
            schedule,
            positions,
            cursor: None,
        }
    }
}

impl ScheduleSource for PlanOrder {
    fn advance(&mut self, id: WeightId) -> usize {
        let Some(&pos) = self.positions.get(&id) else {
            return 0;
        };
        let len = self.schedule.len();
        let moved = self.cursor.map_or(0, |old| (pos + len - old) % len);
        self.cursor = Some(pos);
        moved
    }

    fn ahead(&self, i: usize) -> Option<WeightId> {
        let cur = self.cursor?;
        let len = self.schedule.len();
        // Never the current weight again (the schedule wraps after len - 1 others).
        (i + 1 < len).then(|| self.schedule[(cur + 1 + i) % len])
    }
}

/// Announced weights first, then `inner`'s order: the executor feeds the prefetcher as it goes
/// ([`Prefetcher::announce`]). A new announcement replaces what is left of the previous one;
/// compute using an announced weight drops it and every announced weight before it. Without
/// announcements it is exactly `inner`.
#[derive(Debug, Clone)]
pub struct Announced<S> {
    queue: VecDeque<WeightId>,
    inner: S,
}

impl<S: ScheduleSource> Announced<S> {
    /// Nothing announced yet: `inner`'s order.
    pub fn new(inner: S) -> Self {
        Announced {
            queue: VecDeque::new(),
            inner,
        }
    }
}

impl<S: ScheduleSource> ScheduleSource for Announced<S> {
    fn advance(&mut self, id: WeightId) -> usize {
        let inner = self.inner.advance(id);
        if self.queue.is_empty() {
            return inner;
        }
        match self.queue.iter().position(|&n| n == id) {
            Some(i) => {
                self.queue.drain(..=i);
                // The announced part moved by i + 1, the inner part by its own step.
                if self.queue.is_empty() {
                    usize::MAX
                } else {
                    i + 1
                }
            }
            None => usize::MAX,
        }
    }

    fn announce(&mut self, ids: Vec<WeightId>) {
        self.queue = ids.into();
    }

    /// Every announced weight (as far as the cache has room: the executor announced them
    /// because they are needed soon, and the sooner a load starts the less compute waits),
    /// then `slots` of the inner order.
    fn reach(&self, slots: usize) -> usize {
        self.queue.len() + slots
    }

    fn ahead(&self, i: usize) -> Option<WeightId> {
        match self.queue.get(i) {
            Some(&n) => Some(n),
            None => self.inner.ahead(i - self.queue.len()),
        }
    }
}

enum Msg {
    /// The compute path is about to use this weight.
    At(WeightId),
    /// The executor announced these weights as the next it uses.
    Announce(Vec<WeightId>),
    Stop,
}

/// Handle of the prefetch thread; dropping it stops and joins the thread.
pub struct Prefetcher {
    tx: Sender<Msg>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("alive", &self.is_alive())
            .finish_non_exhaustive()
    }
}

impl Prefetcher {
    /// Start the thread over `cache` following `schedule` (weight ids in execution order,
    /// [`PlanOrder`]) with announcements served first ([`Announced`]), `slots` weights of
    /// lookahead (at least 1).
    pub fn start(cache: Arc<WeightCache>, schedule: Vec<WeightId>, slots: usize) -> Self {
        Self::with_source(
            cache,
            Box::new(Announced::new(PlanOrder::new(schedule))),
            slots,
        )
    }

    /// Start the thread over `cache` following `source`, `slots` weights of lookahead (at
    /// least 1).
    pub fn with_source(
        cache: Arc<WeightCache>,
        source: Box<dyn ScheduleSource>,
        slots: usize,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let slots = slots.max(1);
        let handle = spawn_loader("ork-prefetch", move || run(&cache, source, slots, &rx));
        Prefetcher { tx, handle }
    }

    /// Tell the thread the compute path is about to use weight `id`.
    pub fn advance(&self, id: WeightId) {
        // A dead thread is not an error: compute then fetches on demand.
        let _ = self.tx.send(Msg::At(id));
    }

    /// Tell the thread the executor uses `ids` next, in this order.
    pub fn announce(&self, ids: Vec<WeightId>) {
        let _ = self.tx.send(Msg::Announce(ids));
    }

    /// Whether the thread is still running.
    pub fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(h) = self.handle.take() {
            // A panicked thread has already dropped the slot it was filling; nothing more to do.
            let _ = h.join();
        }
    }
}

fn run(cache: &WeightCache, mut source: Box<dyn ScheduleSource>, slots: usize, rx: &Receiver<Msg>) {
    // Lookahead entries already handled, and whether the cache had no room (then wait until
    // compute moves on).
    let mut next = 0usize;
    let mut blocked = false;
    loop {
        let idle = next >= source.reach(slots) || blocked || source.ahead(next).is_none();
        // Block for a message when there is nothing to do, else just drain what is queued.
        let msg = if idle {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        } else {
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        };
        if let Some(first) = msg {
            // Apply every message queued so far before fetching anything: when compute runs
            // ahead of this thread, fetching for a stale position would load weights compute
            // has already passed (and evict the ones it needs next).
            let mut msg = first;
            loop {
                match msg {
                    Msg::Stop => return,
                    Msg::At(id) => {
                        next = next.saturating_sub(source.advance(id));
                    }
                    Msg::Announce(ids) => {
                        cache.next_generation();
                        source.announce(ids);
                        next = 0;
                    }
                }
                blocked = false;
                msg = match rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                };
            }
            continue;
        }
        let Some(id) = source.ahead(next) else {
            continue;
        };
        match cache.prefetch(id) {
            Ok(true) => next += 1,
            // No room yet: wait for the compute path to move on.
            Ok(false) => blocked = true,
            // The slot was dropped; compute will fetch (and report) it itself. Move on.
            Err(_) => next += 1,
        }
    }
}

/// The first pass of a resident plan: a thread that loads every weight once, in execution
/// order, as fast as it can, then ends.
///
/// Without it, a resident run loads each weight on its first use, on the compute path, while the
/// other cores wait; with it, compute finds the weights of its first pass already loaded or
/// loading (it then waits for that load, or fetches a weight the thread has not reached itself).
/// Every weight fits (the plan is resident), so nothing is evicted and nothing need follow
/// compute's position: the thread ends after one pass, and later passes cost it nothing.
pub struct Warmup {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Warmup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmup")
            .field(
                "running",
                &self.handle.as_ref().is_some_and(|h| !h.is_finished()),
            )
            .finish()
    }
}

impl Warmup {
    /// Start loading `schedule` (weight ids in execution order) into `cache`.
    pub fn start(cache: Arc<WeightCache>, schedule: Vec<WeightId>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = spawn_loader("ork-warmup", move || {
            for &id in &schedule {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                // No room or an error: compute fetches the weight itself and reports it.
                let _ = cache.prefetch(id);
            }
        });
        Warmup { stop, handle }
    }

    /// Wait until the thread has ended (every weight loaded, or given up).
    pub fn join(mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Warmup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            // A panicked load has already dropped its slot; nothing more to do.
            let _ = h.join();
        }
    }
}

/// Run `f` on a new thread named `name` that is the single worker of a rayon pool of its own, so
/// that the parallel work `f` starts (packing a weight) runs on that thread and never waits for
/// the compute pool's workers (module docs). `None` when the OS refuses the thread; when rayon
/// cannot make the thread a pool's worker, `f` does not run at all (compute then fetches every
/// weight itself), rather than risk queueing its work on the compute pool.
fn spawn_loader(name: &str, f: impl FnOnce() + Send + 'static) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .use_current_thread()
                .build();
            if let Ok(pool) = pool {
                // This thread is the pool's worker, so `install` runs `f` right here.
                pool.install(f);
            }
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: usize) -> PlanOrder {
        PlanOrder::new((0..n as u32).map(WeightId::from_test_index).collect())
    }

    /// Weight `i` of the test plan, named `wI` in the expectations below.
    fn w(name: &str) -> WeightId {
        WeightId::from_test_index(name[1..].parse().expect("a name wI"))
    }

    fn lookahead(s: &dyn ScheduleSource, k: usize) -> Vec<String> {
        (0..k)
            .map_while(|i| s.ahead(i).map(|id| format!("w{}", id.index())))
            .collect()
    }

    #[test]
    fn plan_order_wraps_and_reports_how_far_it_moved() {
        let mut p = plan(4);
        assert_eq!(p.ahead(0), None, "nothing known before compute starts");
        assert_eq!(p.advance(w("w0")), 0);
        assert_eq!(lookahead(&p, 9), ["w1", "w2", "w3"]);
        assert_eq!(p.advance(w("w2")), 2);
        assert_eq!(lookahead(&p, 9), ["w3", "w0", "w1"]);
        assert_eq!(p.advance(w("w1")), 3, "wrapped to the next pass");
        assert_eq!(p.advance(WeightId::from_test_index(99)), 0);
        assert_eq!(lookahead(&p, 1), ["w2"]);
    }

    #[test]
    fn announced_weights_come_first_then_the_inner_order() {
        let mut a = Announced::new(plan(5));
        assert_eq!(a.advance(w("w0")), 0);
        assert_eq!(lookahead(&a, 2), ["w1", "w2"]);
        a.announce(vec![w("w4"), w("w3")]);
        assert_eq!(lookahead(&a, 4), ["w4", "w3", "w1", "w2"]);
        assert_eq!(a.advance(w("w4")), 1);
        assert_eq!(lookahead(&a, 2), ["w3", "w0"]);
        assert_eq!(a.advance(w("w3")), usize::MAX, "announcements used up");
        assert_eq!(lookahead(&a, 2), ["w4", "w0"]);
        assert_eq!(
            a.reach(2),
            2,
            "nothing announced left: `slots` of the inner order"
        );
        // A new announcement replaces what is left of the old one.
        a.announce(vec![w("w1"), w("w2")]);
        a.announce(vec![w("w0")]);
        assert_eq!(lookahead(&a, 2), ["w0", "w4"]);
        // The thread brings in every announced weight, then `slots` of the inner order.
        assert_eq!(a.reach(2), 1 + 2);
    }
}
