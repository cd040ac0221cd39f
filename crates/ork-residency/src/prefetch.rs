//! The prefetch thread: while the device computes with weight *i*, it fills the slots for the
//! weights that follow in the execution schedule.
//!
//! The schedule is the model's matmul order for one forward pass; passes repeat (prefill, then
//! every decoded token), so the schedule wraps around. The compute path reports its position
//! with [`Prefetcher::advance`]; the thread then fetches up to `slots` weights ahead, as long as
//! the cache can make room without evicting a weight it prefetched that has not been used yet.
//! With `cores + 1` slots every core has a ready weight and one is always loading.
//!
//! The thread is a plain `std::thread` fed by a channel, outside the rayon pool that computes.
//! A failed prefetch (an error, or a panic inside the fetch) drops its slot and wakes anyone
//! waiting for that weight; the compute path then fetches the weight itself, so the error it
//! reports (naming the tensor) is its own, and a transient failure costs only time. A dead
//! thread likewise only means the compute path fetches everything on demand.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::cache::WeightCache;

enum Msg {
    /// The compute path is about to use schedule position `pos`.
    At(usize),
    Stop,
}

/// Handle of the prefetch thread; dropping it stops and joins the thread.
pub struct Prefetcher {
    tx: Sender<Msg>,
    positions: HashMap<String, usize>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("schedule_len", &self.positions.len())
            .finish_non_exhaustive()
    }
}

impl Prefetcher {
    /// Start the thread over `cache` with `schedule` (weight names in execution order) and
    /// `slots` weights of lookahead (at least 1).
    pub fn start(cache: Arc<WeightCache>, schedule: Vec<String>, slots: usize) -> Self {
        let positions = schedule
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let (tx, rx) = mpsc::channel();
        let slots = slots.max(1);
        let handle = std::thread::Builder::new()
            .name("ork-prefetch".into())
            .spawn(move || run(&cache, &schedule, slots, &rx))
            .ok();
        Prefetcher {
            tx,
            positions,
            handle,
        }
    }

    /// Tell the thread the compute path is about to use `name` (unknown names are ignored).
    pub fn advance(&self, name: &str) {
        if let Some(&pos) = self.positions.get(name) {
            // A dead thread is not an error: compute then fetches on demand.
            let _ = self.tx.send(Msg::At(pos));
        }
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

fn run(cache: &WeightCache, schedule: &[String], slots: usize, rx: &Receiver<Msg>) {
    if schedule.is_empty() {
        return;
    }
    let len = schedule.len();
    // Next position to fetch, and how far ahead of the compute cursor we may go.
    let mut cursor: Option<usize> = None;
    let mut next = 0usize; // offset ahead of the cursor already handled
    let mut blocked = false; // the cache had no room: wait until compute moves on
    let slots = slots.min(len.saturating_sub(1)).max(1);
    loop {
        // Block for a message when there is nothing to do, else just drain what is queued.
        let msg = if cursor.is_none() || next >= slots || blocked {
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
            // Apply every position queued so far before fetching anything: when compute runs
            // ahead of this thread, fetching for a stale cursor would load weights compute has
            // already passed (and evict the ones it needs next).
            let mut msg = first;
            loop {
                match msg {
                    Msg::Stop => return,
                    Msg::At(pos) => {
                        if let Some(old) = cursor {
                            let moved = (pos + len - old) % len;
                            next = next.saturating_sub(moved);
                        } else {
                            next = 0;
                        }
                        cursor = Some(pos);
                        blocked = false;
                    }
                }
                msg = match rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                };
            }
            continue;
        }
        let Some(cur) = cursor else { continue };
        let name = &schedule[(cur + 1 + next) % len];
        match cache.prefetch(name) {
            Ok(true) => next += 1,
            // No room yet: wait for the compute path to move on.
            Ok(false) => blocked = true,
            // The slot was dropped; compute will fetch (and report) it itself. Move on.
            Err(_) => next += 1,
        }
    }
}
