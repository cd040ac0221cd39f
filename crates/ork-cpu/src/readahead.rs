//! [`ExpertReads`]: MoE experts read in place, ahead of compute and kept hot (docs/moe.md,
//! "The CPU engine: experts from the page cache").
//!
//! - **Readahead.** The executor announces the experts a block's router chose, and the ones it
//!   predicts for the next block ([`ork_exec::Linear::upcoming`]). Each expert's byte range —
//!   exactly its slice of its tensor — is asked of the kernel (`posix_fadvise(WILLNEED)` on
//!   the file) unless `mincore` finds it in the page cache already:
//!   - the announcing block's own experts at once, from the announcing thread (compute needs
//!     them now; queueing the reads takes ~0.4 ms per 2 MiB, and a fault would read 4 KiB);
//!   - the next block's other tensors (attention, norms, router; after the last block, those
//!     outside blocks) and its predicted experts, from a background thread, the predicted ones
//!     up to the bytes the announcing block routes (the top-k guesses) and at most
//!     a sixteenth of the memory limit ([`memory_limit`]); a newer announcement makes it drop
//!     what is left (it is stale). A full queue drops the hint: compute faults the pages in
//!     itself if they are not there.
//!
//!   Every tensor of the file is marked `MADV_RANDOM` in the map ([`crate::lock::advise_random`]),
//!   so a fault reads its page and not the kernel's read-around window, which on a disk with a
//!   large `read_ahead_kb` reads neighbouring (unrouted) experts and, under a memory limit,
//!   evicts the routed ones.
//! - **Cold experts let go**, when the file does not fit what the memory limit ([`memory_limit`])
//!   leaves after `room = min(1 GiB, limit / 8)` for the system and the process's anonymous
//!   memory when the reader is built (`RssAnon`) ([`keep_budget`]). Every [`REPIN_EVERY`]
//!   announcements the most-routed experts that fit `keep_bytes` are ranked "kept": what is left
//!   after room and anonymous memory, less the dense tensors (every tensor that is not an
//!   expert's: read every token and never released, so they stay in the page cache) and twice
//!   what one block's routing reads (the largest block's expert bytes × top-k ÷ experts: the
//!   computing block's experts and the next one's, read ahead). An expert used by the previous
//!   announcement that is neither kept nor announced again is released from the page cache at
//!   once (`MADV_PAGEOUT`, [`crate::lock::page_out`]), so under a limit a once-used expert evicts
//!   no hot one (least-recently-used eviction alone keeps the last ~limit bytes read, which a
//!   decode cycling through more experts than fit reuses none of). Half the limit, the earlier
//!   budget, kept 8.6 GB of Qwen3-30B-A3B's 16.3 GB of experts on a 16 GiB board (~47 % of the
//!   routed bytes from storage every token under uniform routing); this keeps 15.2 GB less the
//!   process's anonymous memory (93 % of the experts with none, 90 % with 512 MiB).
//! - **Hot experts.** Every expert matmul counts the token rows routed to it. With a pin budget
//!   (`--pin-mb`), the background thread keeps the most-routed experts that fit locked in RAM
//!   (`mlock`, [`crate::lock`]), re-ranked every [`REPIN_EVERY`] announcements; the rest come
//!   from storage. A refused lock (no `CAP_IPC_LOCK` and `RLIMIT_MEMLOCK` too small) is kept
//!   and reported ([`ExpertReadStats::pin_error`]).
//!
//! Nothing here changes a result: the matmuls read the same mapped bytes either way.

use std::fs::File;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ork_gguf::{GgufFile, TensorInfo};

use crate::CpuError;

/// What the expert reader (`ExpertReads`) does (`ork run --no-prefetch`, `--pin-mb`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertReadOptions {
    /// Read announced experts ahead into the page cache.
    pub readahead: bool,
    /// Bytes of the most-routed experts to keep locked in RAM (0: none).
    pub pin_bytes: u64,
}

impl Default for ExpertReadOptions {
    /// Readahead on, nothing pinned.
    fn default() -> ExpertReadOptions {
        ExpertReadOptions {
            readahead: true,
            pin_bytes: 0,
        }
    }
}

/// Announcements (one per MoE block pass) between two re-rankings of the hot experts.
pub const REPIN_EVERY: u64 = 32;
/// Jobs the background thread may have queued before hints are dropped.
const QUEUE: usize = 256;

/// The expert figures of the CPU engine so far (`ork run --json`: `cpu_experts`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ExpertReadStats {
    /// Expert weight matmuls computed (an expert's gate, up and down count one each).
    pub expert_matmuls: u64,
    /// Token rows routed through those matmuls.
    pub routed_rows: u64,
    /// Router skew: per expert tensor, the most-routed expert's rows over the mean of its
    /// experts' rows, averaged over the tensors that ran (1 is uniform routing, `n_expert` is
    /// one expert taking every token); `None` before any expert ran.
    pub router_skew: Option<f64>,
    /// Whether announced experts were read ahead.
    pub readahead: bool,
    /// Bytes handed to the kernel to read ahead.
    pub readahead_bytes: u64,
    /// Announced bytes not read because they were in the page cache already (`mincore`).
    pub readahead_resident_bytes: u64,
    /// Announced bytes of later blocks not read because a newer announcement came first.
    pub readahead_stale_bytes: u64,
    /// Bytes an announcement may read ahead for later blocks (from the memory limit).
    pub readahead_window_bytes: u64,
    /// Bytes of experts released from the page cache after their block ran.
    pub released_bytes: u64,
    /// Whether experts are released after use at all (the file does not fit the memory limit
    /// less the room for the system and the process's anonymous memory).
    pub release_cold: bool,
    /// Bytes of the most-routed experts left in the page cache after use (see the module docs).
    pub keep_bytes: u64,
    /// Hints dropped because the readahead thread was behind.
    pub readahead_dropped: u64,
    /// The pin budget (`--pin-mb`), bytes.
    pub pin_budget_bytes: u64,
    /// Expert bytes locked in RAM now.
    pub pinned_bytes: u64,
    /// Expert matmuls whose weight was locked in RAM when it ran.
    pub pinned_matmuls: u64,
    /// Why locking failed, if it did (the first refusal).
    pub pin_error: Option<String>,
}

/// One expert weight: its bytes in the map and the tensor it is a slice of.
#[derive(Debug)]
struct Slice {
    view: TensorInfo,
    /// Index of its tensor among the expert tensors (for the skew).
    tensor: usize,
    /// The block it belongs to (`blk.N.` of its name; without one, its tensor): an
    /// announcement's first block is the one computing now, the rest is read ahead.
    block: usize,
}

/// The block `blk.N.…` of an expert tensor's name.
fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Counters the background thread writes.
#[derive(Debug, Default)]
struct Shared {
    advised: AtomicU64,
    resident: AtomicU64,
    stale: AtomicU64,
    released: AtomicU64,
    dropped: AtomicU64,
    pinned_bytes: AtomicU64,
    pin_error: Mutex<Option<String>>,
    /// The latest announcement's number: a read-ahead job of an older one is abandoned.
    generation: AtomicU64,
}

/// What reads slices into the page cache, from the announcing thread or the background one.
#[derive(Debug)]
struct Reader {
    gguf: Arc<GgufFile>,
    /// The file opened again for `posix_fadvise` (`None` for an in-memory file or one that
    /// cannot be reopened: readahead hints are then dropped).
    file: Option<File>,
    slices: Arc<[Slice]>,
    shared: Arc<Shared>,
    /// Per block, its tensors other than the experts' (attention, norms, router, shared expert).
    dense: Vec<Vec<TensorInfo>>,
    /// Tensors outside the blocks (embeddings, output head).
    globals: Vec<TensorInfo>,
}

impl Reader {
    /// Ask the kernel to read `slices` (in this order) into the page cache, skipping those
    /// already there; with `generation`, stop as soon as a newer announcement was made.
    fn read(&self, slices: &[usize], generation: Option<u64>) {
        let Some(file) = &self.file else {
            return;
        };
        for (n, &i) in slices.iter().enumerate() {
            if generation.is_some_and(|g| self.shared.generation.load(Ordering::Relaxed) != g) {
                let rest: u64 = slices[n..].iter().map(|&j| self.slices[j].view.size).sum();
                self.shared.stale.fetch_add(rest, Ordering::Relaxed);
                return;
            }
            self.read_view(file, &self.slices[i].view);
        }
    }

    /// Read one tensor (or slice) unless it is resident.
    fn read_view(&self, file: &File, view: &TensorInfo) {
        let data = self.gguf.tensor_data(view);
        if crate::lock::resident(data, view.offset).unwrap_or(false) {
            self.shared.resident.fetch_add(view.size, Ordering::Relaxed);
            return;
        }
        if let Some(len) = NonZeroU64::new(view.size) {
            let advice = rustix::fs::Advice::WillNeed;
            if rustix::fs::fadvise(file, view.offset, Some(len), advice).is_ok() {
                self.shared.advised.fetch_add(view.size, Ordering::Relaxed);
            }
        }
    }

    /// Read the dense tensors of `block` (and, after the last block, those outside blocks).
    fn read_dense(&self, block: usize) {
        let Some(file) = &self.file else {
            return;
        };
        for view in self.dense.get(block).into_iter().flatten() {
            self.read_view(file, view);
        }
        if block + 1 >= self.dense.len() {
            for view in &self.globals {
                self.read_view(file, view);
            }
        }
    }
}

impl Reader {
    /// Reclaim `slices`' pages now (see [`crate::lock::page_out`]).
    fn release(&self, slices: &[usize]) {
        for &i in slices {
            let view = &self.slices[i].view;
            if crate::lock::page_out(self.gguf.tensor_data(view)).is_ok() {
                self.shared.released.fetch_add(view.size, Ordering::Relaxed);
            }
        }
    }
}

enum Job {
    /// Read `ahead` into the page cache (for announcement number `generation`), then let
    /// `release` go.
    Advise {
        generation: u64,
        ahead: Vec<usize>,
        dense: Option<usize>,
        release: Vec<usize>,
    },
    /// Keep exactly these slices locked.
    Pin(Vec<bool>),
    /// Answer once every job before this one is done.
    Flush(SyncSender<()>),
}

/// Readahead and hot-expert pinning of one model's expert slices (see the module docs).
#[derive(Debug)]
pub(crate) struct ExpertReads {
    options: ExpertReadOptions,
    slices: Arc<[Slice]>,
    tensors: usize,
    routed: Vec<AtomicU64>,
    pinned: Arc<[AtomicBool]>,
    matmuls: AtomicU64,
    pinned_matmuls: AtomicU64,
    announcements: AtomicU64,
    shared: Arc<Shared>,
    reader: Arc<Reader>,
    /// Bytes an announcement may read ahead for later blocks ([`window_bytes`]).
    window: u64,
    /// Bytes of the most-routed experts left in the page cache after use
    /// ([`KeepBudget::keep_bytes`]); the others are released once their block has run.
    keep_bytes: u64,
    /// Whether cold experts are released at all ([`KeepBudget::must_release`]).
    release_cold: bool,
    /// The experts kept after use (re-ranked every [`REPIN_EVERY`] announcements).
    keep: Mutex<Vec<bool>>,
    /// The previous announcement's slices: released at the next one unless kept or announced
    /// again.
    previous: Mutex<Vec<usize>>,
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ExpertReads {
    /// Serve the expert `views` (each an expert's slice of a 3-D tensor, named
    /// `TENSOR#EXPERT`) of `gguf`.
    ///
    /// # Errors
    /// [`CpuError::PinAboveRam`] for a pin budget above the machine's RAM;
    /// [`CpuError::Pool`] if the thread cannot start.
    pub(crate) fn new(
        gguf: &Arc<GgufFile>,
        views: Vec<TensorInfo>,
        options: ExpertReadOptions,
    ) -> Result<ExpertReads, CpuError> {
        if options.pin_bytes > 0 {
            let ram = crate::topology::ram_bytes().map_err(|source| CpuError::Pool {
                what: "reading the RAM size (/proc/meminfo) for --pin-mb".into(),
                source,
            })?;
            if options.pin_bytes > ram {
                return Err(CpuError::PinAboveRam {
                    pin_bytes: options.pin_bytes,
                    ram_bytes: ram,
                });
            }
        }
        let (slices, tensors) = slices_of(views);
        let n = slices.len();
        let pinned: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(false)).collect();
        let shared = Arc::new(Shared::default());
        let limit = memory_limit();
        let (dense, globals) = dense_tensors(gguf, &slices);
        let budget = keep_budget(&Footprint {
            limit,
            anon: anon_bytes(),
            file_bytes: gguf.file_len(),
            dense_bytes: dense.iter().flatten().chain(&globals).map(|t| t.size).sum(),
            routed_block_bytes: routed_block_bytes(gguf, &slices)?,
        });
        if options.readahead {
            // A fault reads only its page (no read-around of the neighbouring, unrouted
            // experts): every tensor is read ahead, exactly, before it is used (a refusal
            // leaves the kernel's read-around; it is only a hint).
            let views = slices.iter().map(|s| &s.view);
            for v in views.chain(dense.iter().flatten()).chain(&globals) {
                let _ = crate::lock::advise_random(gguf.tensor_data(v), v.offset);
            }
        }
        let reader = Arc::new(Reader {
            gguf: Arc::clone(gguf),
            file: ork_io::open_regular(gguf.path()).ok(),
            slices: Arc::clone(&slices),
            shared: Arc::clone(&shared),
            dense,
            globals,
        });
        let wanted = n > 0 && (options.readahead || options.pin_bytes > 0);
        let (tx, thread) = if wanted {
            let (tx, rx) = sync_channel(QUEUE);
            let worker = Worker {
                reader: Arc::clone(&reader),
                pinned: Arc::clone(&pinned),
            };
            let thread = std::thread::Builder::new()
                .name("ork-expert-reads".into())
                .spawn(move || worker.run(rx))
                .map_err(|source| CpuError::Pool {
                    what: "starting the expert readahead thread".into(),
                    source,
                })?;
            (Some(tx), Some(thread))
        } else {
            (None, None)
        };
        Ok(ExpertReads {
            options,
            routed: (0..n).map(|_| AtomicU64::new(0)).collect(),
            slices,
            tensors,
            pinned,
            matmuls: AtomicU64::new(0),
            pinned_matmuls: AtomicU64::new(0),
            announcements: AtomicU64::new(0),
            shared,
            reader,
            window: limit / 16,
            keep_bytes: budget.keep_bytes,
            release_cold: budget.must_release,
            // Nothing is released before the first ranking.
            keep: Mutex::new(vec![true; n]),
            previous: Mutex::new(Vec::new()),
            tx,
            thread,
        })
    }

    /// Count a matmul of expert slice `slice` over `rows` token rows.
    pub(crate) fn computed(&self, slice: usize, rows: usize) {
        self.matmuls.fetch_add(1, Ordering::Relaxed);
        self.routed[slice].fetch_add(rows as u64, Ordering::Relaxed);
        if self.pinned[slice].load(Ordering::Relaxed) {
            self.pinned_matmuls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The executor announced these expert slices (in compute order): read them ahead, and
    /// every [`REPIN_EVERY`] announcements re-rank the hot experts.
    pub(crate) fn announce(&self, slices: Vec<usize>) {
        let Some(tx) = &self.tx else {
            return;
        };
        if self.options.readahead && !slices.is_empty() {
            self.read_ahead(tx, &slices);
        }
        let n = self.announcements.fetch_add(1, Ordering::Relaxed) + 1;
        if self.options.pin_bytes > 0 && n.is_multiple_of(REPIN_EVERY) {
            self.send(tx, Job::Pin(self.hottest(self.options.pin_bytes)));
        }
    }

    /// Read an announcement's slices: those of its first block (computing now) from this
    /// thread, at once, unless already in the page cache; those of later blocks (predicted), up
    /// to [`ExpertReads::window`] bytes in announcement order, from the background thread,
    /// which abandons them once a newer announcement is made.
    fn read_ahead(&self, tx: &SyncSender<Job>, slices: &[usize]) {
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let block = self.slices[slices[0]].block;
        let now = slices
            .iter()
            .position(|&i| self.slices[i].block != block)
            .unwrap_or(slices.len());
        let mut ahead = Vec::new();
        let routed: u64 = slices[..now]
            .iter()
            .map(|&i| self.slices[i].view.size)
            .sum();
        let mut room = self.window.min(routed);
        for &i in &slices[now..] {
            let size = self.slices[i].view.size;
            if size > room {
                break;
            }
            room -= size;
            ahead.push(i);
        }
        let release = self.release_list(slices, generation);
        self.reader.read(&slices[..now], None);
        self.send(
            tx,
            Job::Advise {
                generation,
                ahead,
                dense: block.checked_add(1),
                release,
            },
        );
    }

    /// The previous announcement's slices that are neither kept nor announced again (`slices`),
    /// re-ranking the kept ones every [`REPIN_EVERY`] announcements.
    fn release_list(&self, slices: &[usize], generation: u64) -> Vec<usize> {
        if !self.release_cold {
            return Vec::new();
        }
        let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        if generation.is_multiple_of(REPIN_EVERY) {
            *keep = self.hottest(self.keep_bytes);
        }
        let mut previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        let release = previous
            .iter()
            .copied()
            .filter(|&i| {
                !keep[i] && !self.pinned[i].load(Ordering::Relaxed) && !slices.contains(&i)
            })
            .collect();
        *previous = slices.to_vec();
        release
    }

    /// Wait until the background thread has done every job queued so far.
    pub(crate) fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done, wait) = sync_channel(1);
            if tx.send(Job::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    fn send(&self, tx: &SyncSender<Job>, job: Job) {
        if let Err(TrySendError::Full(_)) = tx.try_send(job) {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The most-routed slices that fit `budget` bytes (ties: file order), as a mask.
    fn hottest(&self, budget: u64) -> Vec<bool> {
        let counts: Vec<u64> = self
            .routed
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        let mut want = vec![false; counts.len()];
        let mut room = budget;
        for i in order {
            let size = self.slices[i].view.size;
            if size <= room {
                room -= size;
                want[i] = true;
            }
        }
        want
    }

    /// The figures so far.
    pub(crate) fn stats(&self) -> ExpertReadStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExpertReadStats {
            expert_matmuls: load(&self.matmuls),
            routed_rows: self.routed.iter().map(load).sum(),
            router_skew: self.skew(),
            readahead: self.options.readahead,
            readahead_bytes: load(&self.shared.advised),
            readahead_resident_bytes: load(&self.shared.resident),
            readahead_stale_bytes: load(&self.shared.stale),
            readahead_window_bytes: self.window,
            released_bytes: load(&self.shared.released),
            release_cold: self.release_cold,
            keep_bytes: self.keep_bytes,
            readahead_dropped: load(&self.shared.dropped),
            pin_budget_bytes: self.options.pin_bytes,
            pinned_bytes: load(&self.shared.pinned_bytes),
            pinned_matmuls: load(&self.pinned_matmuls),
            pin_error: self
                .shared
                .pin_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// See [`ExpertReadStats::router_skew`].
    fn skew(&self) -> Option<f64> {
        let mut per_tensor = vec![(0u64, 0u64, 0u64); self.tensors];
        for (s, c) in self.slices.iter().zip(&self.routed) {
            let c = c.load(Ordering::Relaxed);
            let t = &mut per_tensor[s.tensor];
            *t = (t.0 + c, t.1.max(c), t.2 + 1);
        }
        let ran: Vec<f64> = per_tensor
            .iter()
            .filter(|(sum, _, _)| *sum > 0)
            .map(|&(sum, max, n)| max as f64 * n as f64 / sum as f64)
            .collect();
        (!ran.is_empty()).then(|| ran.iter().sum::<f64>() / ran.len() as f64)
    }
}

impl Drop for ExpertReads {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The background thread's state.
struct Worker {
    reader: Arc<Reader>,
    pinned: Arc<[AtomicBool]>,
}

impl Worker {
    fn run(self, rx: Receiver<Job>) {
        let mut locked = vec![false; self.reader.slices.len()];
        for job in rx {
            match job {
                Job::Advise {
                    generation,
                    ahead,
                    dense,
                    release,
                } => {
                    if let Some(b) = dense {
                        self.reader.read_dense(b);
                    }
                    self.reader.read(&ahead, Some(generation));
                    self.reader.release(&release);
                }
                Job::Pin(want) => self.pin(&mut locked, &want),
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        // The map outlives this thread (`self.reader.gguf`), and unmapping it would unlock the
        // pages anyway; unlock so the RAM is free as soon as the engine is dropped.
        let none = vec![false; locked.len()];
        self.pin(&mut locked, &none);
    }

    /// Unlock what is no longer wanted, then lock what is (until the first refusal, which is
    /// recorded: the next ranking tries again).
    fn pin(&self, locked: &mut [bool], want: &[bool]) {
        let Reader {
            gguf,
            slices,
            shared,
            ..
        } = &*self.reader;
        for (i, s) in slices.iter().enumerate() {
            if locked[i] && !want[i] && crate::lock::unlock(gguf.tensor_data(&s.view)).is_ok() {
                locked[i] = false;
                self.pinned[i].store(false, Ordering::Relaxed);
                shared
                    .pinned_bytes
                    .fetch_sub(s.view.size, Ordering::Relaxed);
            }
        }
        for (i, s) in slices.iter().enumerate() {
            if locked[i] || !want[i] {
                continue;
            }
            if let Err(e) = crate::lock::lock(gguf.tensor_data(&s.view)) {
                let mut first = shared.pin_error.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| {
                    format!(
                        "mlock of {} ({} bytes) refused: {e} (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK room)",
                        s.view.name, s.view.size
                    )
                });
                return;
            }
            locked[i] = true;
            self.pinned[i].store(true, Ordering::Relaxed);
            shared
                .pinned_bytes
                .fetch_add(s.view.size, Ordering::Relaxed);
        }
    }
}

/// What [`keep_budget`] weighs: bytes, all of them.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    /// The memory the process may fill ([`memory_limit`]).
    limit: u64,
    /// The process's anonymous memory when the expert reader is built ([`anon_bytes`]).
    anon: u64,
    /// The GGUF file.
    file_bytes: u64,
    /// Every tensor that is not an expert tensor, in blocks and outside them: read every token
    /// and never released, so they stay in the page cache.
    dense_bytes: u64,
    /// What one block's routing reads ([`routed_block_bytes`]).
    routed_block_bytes: u64,
}

/// Whether cold experts are released after use, and how many expert bytes stay cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeepBudget {
    /// The file does not fit what the limit leaves: release the experts that are not kept.
    must_release: bool,
    /// Bytes of the most-routed experts left in the page cache after use.
    keep_bytes: u64,
}

/// The expert bytes the page cache can hold under `f.limit` (module docs, "Cold experts let
/// go"). `room = min(1 GiB, limit / 8)` is left to the system; what is left after it and the
/// process's anonymous memory holds the file whole (nothing released: a file that fits is read
/// from storage once, as without ork), or else the dense tensors, the routed experts of the
/// computing block and of the one read ahead, and `keep_bytes` of the most-routed experts.
/// Every subtraction saturates at 0.
fn keep_budget(f: &Footprint) -> KeepBudget {
    let room = (1u64 << 30).min(f.limit / 8);
    let free = f.limit.saturating_sub(room).saturating_sub(f.anon);
    KeepBudget {
        must_release: f.file_bytes > free,
        keep_bytes: free
            .saturating_sub(f.dense_bytes)
            .saturating_sub(f.routed_block_bytes.saturating_mul(2)),
    }
}

/// The expert bytes one block's routing reads: the largest block's expert bytes × top-k ÷
/// the expert count (`{arch}.expert_used_count`, `{arch}.expert_count`, as the executor reads
/// them: [`ork_exec::ModelConfig`]); 0 without experts.
///
/// # Errors
/// [`CpuError::Routing`] if the file has expert slices but no readable routing.
fn routed_block_bytes(gguf: &GgufFile, slices: &[Slice]) -> Result<u64, CpuError> {
    if slices.is_empty() {
        return Ok(0);
    }
    let routing = |what: String| CpuError::Routing {
        path: gguf.path().to_path_buf(),
        what,
    };
    let config = ork_exec::ModelConfig::from_gguf(gguf).map_err(|e| routing(e.to_string()))?;
    let moe = config
        .moe
        .ok_or_else(|| routing("expert tensors in a model without experts".into()))?;
    let mut per_block: Vec<(usize, u64)> = Vec::new();
    for s in slices {
        match per_block.iter_mut().find(|(b, _)| *b == s.block) {
            Some((_, bytes)) => *bytes += s.view.size,
            None => per_block.push((s.block, s.view.size)),
        }
    }
    let largest = per_block.iter().map(|&(_, b)| b).max().unwrap_or(0);
    Ok(share(
        largest,
        moe.n_expert_used as u64,
        moe.n_expert as u64,
    ))
}

/// `bytes × used ÷ of`, rounded up, without overflow (`bytes` when `of` is 0).
fn share(bytes: u64, used: u64, of: u64) -> u64 {
    if of == 0 {
        return bytes;
    }
    let v = (u128::from(bytes) * u128::from(used)).div_ceil(u128::from(of));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The process's anonymous resident memory (`RssAnon` of `/proc/self/status`); 0 if it cannot
/// be read.
fn anon_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| crate::topology::kb_field(&t, "RssAnon"))
        .unwrap_or(0)
}

/// The memory the process may fill: its memory cgroup's limit (v2 `memory.max` or v1
/// `memory.limit_in_bytes`) or the RAM, whichever is smaller; 256 MiB when neither can be read.
fn memory_limit() -> u64 {
    [crate::topology::ram_bytes().ok(), cgroup_limit()]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(256 << 20)
}

/// The memory limit of this process's memory cgroup, if it has one (v2 `memory.max`, v1
/// `memory.limit_in_bytes`; "max" or v1's huge "no limit" value is none).
fn cgroup_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if id == "0" && controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        let limit = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&l| l < 1 << 60);
        if limit.is_some() {
            return limit;
        }
    }
    None
}

/// The file's tensors other than the expert tensors `slices` are cut from: per block
/// (`blk.N.`), and outside blocks.
fn dense_tensors(gguf: &GgufFile, slices: &[Slice]) -> (Vec<Vec<TensorInfo>>, Vec<TensorInfo>) {
    let expert_tensors: Vec<&str> = slices
        .iter()
        .filter_map(|s| s.view.name.split('#').next())
        .collect();
    let mut dense: Vec<Vec<TensorInfo>> = Vec::new();
    let mut globals = Vec::new();
    for t in gguf.tensors() {
        if expert_tensors.contains(&t.name.as_str()) {
            continue;
        }
        match block_of(&t.name) {
            Some(b) => {
                if dense.len() <= b {
                    dense.resize(b + 1, Vec::new());
                }
                dense[b].push(t.clone());
            }
            None => globals.push(t.clone()),
        }
    }
    (dense, globals)
}

/// The expert slices `views`, each with its tensor's index, and the number of tensors.
fn slices_of(views: Vec<TensorInfo>) -> (Arc<[Slice]>, usize) {
    let mut names: Vec<String> = Vec::new();
    let slices = views
        .into_iter()
        .map(|view| {
            let base = view.name.split('#').next().unwrap_or_default().to_owned();
            let tensor = match names.iter().position(|n| *n == base) {
                Some(i) => i,
                None => {
                    names.push(base);
                    names.len() - 1
                }
            };
            let block = block_of(&view.name).unwrap_or(usize::MAX - tensor);
            Slice {
                view,
                tensor,
                block,
            }
        })
        .collect();
    (slices, names.len())
}

#[cfg(test)]
mod tests {
    use super::{keep_budget, share, Footprint, KeepBudget};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn footprint(limit: u64, file_bytes: u64) -> Footprint {
        Footprint {
            limit,
            anon: 0,
            file_bytes,
            dense_bytes: 0,
            routed_block_bytes: 0,
        }
    }

    /// The board clock (`ork_board::cpu::cache_hits`) models this budget: on a 16 GiB board
    /// (room 1 GiB, the clock's reserve) Qwen3-30B-A3B Q4_K_M's shape keeps the same share of
    /// its experts both ways.
    #[test]
    fn the_board_clock_models_this_budget() {
        use ork_board::cpu::{cache_hits, FileType};
        use ork_board::cpu_fit::QWEN3_30B_A3B;
        let shape = QWEN3_30B_A3B.shape(FileType::Q4_K, FileType::Q6_K);
        let bytes = |expert: bool| -> u64 {
            let of = |w: &&ork_board::cpu::CpuWeight| (w.experts > 1) == expert;
            shape.weights.iter().filter(of).map(|w| w.bytes()).sum()
        };
        let (experts, dense) = (bytes(true), bytes(false) + shape.other_bytes);
        let f = Footprint {
            limit: 16 * GIB,
            anon: 0,
            file_bytes: experts + dense,
            dense_bytes: dense,
            routed_block_bytes: (experts / 48 * 8).div_ceil(128),
        };
        let b = keep_budget(&f);
        assert!(b.must_release);
        let clock = cache_hits(&shape, (15 * GIB) as f64);
        let kept = b.keep_bytes as f64 / experts as f64;
        assert!((kept - clock.experts).abs() < 1e-6, "{kept} {clock:?}");
        assert!(kept > 0.9 && clock.dense == 1.0, "{kept} {clock:?}");
    }

    #[test]
    fn cold_experts_are_released_only_when_the_file_does_not_fit() {
        let release = |f: Footprint| keep_budget(&f).must_release;
        // scripts/moe-readahead.sh: a 426 MiB model under a 192 MiB cgroup.
        assert!(release(footprint(192 * MIB, 426 * MIB)));
        // A 13.3 GB file on a 16 GB board stays in the page cache whole (room: 1 GiB).
        assert!(!release(footprint(16_000_000_000, 13_300_000_000)));
        assert!(release(footprint(16_000_000_000, 15_000_000_000)));
        // Room is an eighth below 8 GiB: a 3.4 GiB file fits 4 GiB less 512 MiB.
        assert!(!release(footprint(4 * GIB, 3400 * MIB)));
        assert!(release(footprint(4 * GIB, 3600 * MIB)));
        // The process's own memory counts against the limit.
        let with_anon = Footprint {
            anon: 600 * MIB,
            ..footprint(4 * GIB, 3000 * MIB)
        };
        assert!(release(with_anon));
        assert!(!release(footprint(0, 0)));
    }

    #[test]
    fn qwen3_30b_on_a_16_gib_board_keeps_nine_tenths_of_its_experts() {
        // Qwen3-30B-A3B Q4_K_M: 17.3 GB, 0.82 GB of it not experts; 48 blocks of 128
        // experts, top-8.
        let experts: u64 = 16_300_000_000;
        let block = experts / 48;
        let budget = keep_budget(&Footprint {
            limit: 16 * GIB,
            anon: 500 * MIB,
            file_bytes: 17_300_000_000,
            dense_bytes: 820_000_000,
            routed_block_bytes: share(block, 8, 128),
        });
        let expected = 16 * GIB - GIB - 500 * MIB - 820_000_000 - 2 * share(block, 8, 128);
        assert_eq!(
            budget,
            KeepBudget {
                must_release: true,
                keep_bytes: expected
            }
        );
        // Half the limit kept 8.6 GB (53 % of the experts); this keeps over 90 %.
        assert!(budget.keep_bytes * 10 > experts * 9, "{budget:?}");
    }

    #[test]
    fn the_budget_saturates_at_zero() {
        let tight = Footprint {
            limit: 192 * MIB,
            anon: 150 * MIB,
            file_bytes: 426 * MIB,
            dense_bytes: 40 * MIB,
            routed_block_bytes: 4 * MIB,
        };
        assert_eq!(
            keep_budget(&tight),
            KeepBudget {
                must_release: true,
                keep_bytes: 0
            }
        );
        let huge = Footprint {
            anon: u64::MAX,
            routed_block_bytes: u64::MAX,
            ..tight
        };
        assert_eq!(keep_budget(&huge).keep_bytes, 0);
        // The CI fixture: 192 MiB less 24 MiB of room, 30 MiB of process, 60 MiB dense and
        // two blocks' routed experts of 3 MiB each.
        let ci = Footprint {
            anon: 30 * MIB,
            dense_bytes: 60 * MIB,
            routed_block_bytes: 3 * MIB,
            ..tight
        };
        assert_eq!(keep_budget(&ci).keep_bytes, (192 - 24 - 30 - 60 - 6) * MIB);
    }

    #[test]
    fn the_anonymous_memory_is_read_from_a_status_line() {
        let status = "VmRSS:\t  120 kB\nRssAnonX:\t 9 kB\nRssAnon:\t   64 kB\nRssFile: 56 kB\n";
        assert_eq!(crate::topology::kb_field(status, "RssAnon"), Some(64 << 10));
        assert_eq!(crate::topology::kb_field(status, "RssShmem"), None);
        assert_eq!(crate::topology::kb_field("RssAnon: 12 MB", "RssAnon"), None);
        // This process has some.
        assert!(super::anon_bytes() > 0);
    }

    #[test]
    fn a_block_routes_its_top_k_share_rounded_up() {
        assert_eq!(share(128, 8, 128), 8);
        assert_eq!(share(10, 2, 8), 3);
        assert_eq!(share(u64::MAX, 8, 8), u64::MAX);
        assert_eq!(share(u64::MAX, 9, 8), u64::MAX);
        assert_eq!(share(7, 1, 0), 7);
    }
}
