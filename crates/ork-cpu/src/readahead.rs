//! [`ExpertReads`]: MoE experts read in place, ahead of compute and kept hot (docs/moe.md,
//! "The CPU engine: experts from the page cache").
//!
//! - **Readahead.** The executor announces the experts a block's router chose, and the ones it
//!   predicts for the next block ([`ork_exec::Linear::upcoming`]); each announced expert's
//!   byte range — exactly its slice of its tensor — is handed to a background thread that
//!   asks the kernel to read it into the page cache (`posix_fadvise(WILLNEED)` on the file).
//!   The call returns once the reads are queued, but queueing itself takes time (measured
//!   ~0.4 ms per 2 MiB on the development machine's virtio disk), so the compute threads never
//!   make it. A full queue drops the hint: it is a hint, and compute faults the pages in
//!   itself if they are not there. The expert slices are marked `MADV_RANDOM` in the map
//!   ([`crate::lock::advise_random`]), so such a fault reads its page and not the kernel's
//!   read-around window, which on a disk with a large `read_ahead_kb` reads the neighbouring
//!   (unrouted) experts and, under a memory limit, evicts the routed ones.
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
}

/// Counters the background thread writes.
#[derive(Debug, Default)]
struct Shared {
    advised: AtomicU64,
    dropped: AtomicU64,
    pinned_bytes: AtomicU64,
    pin_error: Mutex<Option<String>>,
}

enum Job {
    /// Read these slices ahead.
    Advise(Vec<usize>),
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
        let mut names: Vec<String> = Vec::new();
        let slices: Arc<[Slice]> = views
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
                Slice { view, tensor }
            })
            .collect();
        let tensors = names.len();
        let n = slices.len();
        let pinned: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(false)).collect();
        let shared = Arc::new(Shared::default());
        if options.readahead {
            // Faults in expert slices read only their page: the readahead below reads exactly
            // the routed slices (a refusal leaves the kernel's read-around; it is only a hint).
            for sl in slices.iter() {
                let _ = crate::lock::advise_random(gguf.tensor_data(&sl.view), sl.view.offset);
            }
        }
        let wanted = n > 0 && (options.readahead || options.pin_bytes > 0);
        let (tx, thread) = if wanted {
            let (tx, rx) = sync_channel(QUEUE);
            let file = ork_io::open_regular(gguf.path()).ok();
            let worker = Worker {
                gguf: Arc::clone(gguf),
                file,
                slices: Arc::clone(&slices),
                pinned: Arc::clone(&pinned),
                shared: Arc::clone(&shared),
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
            self.send(tx, Job::Advise(slices));
        }
        let n = self.announcements.fetch_add(1, Ordering::Relaxed) + 1;
        if self.options.pin_bytes > 0 && n.is_multiple_of(REPIN_EVERY) {
            self.send(tx, Job::Pin(self.hottest()));
        }
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

    /// The most-routed slices that fit the pin budget (ties: file order), as a mask.
    fn hottest(&self) -> Vec<bool> {
        let counts: Vec<u64> = self
            .routed
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        let mut want = vec![false; counts.len()];
        let mut room = self.options.pin_bytes;
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
    gguf: Arc<GgufFile>,
    /// The file opened again for `posix_fadvise` (`None` for an in-memory file or one that
    /// cannot be reopened: readahead hints are then dropped).
    file: Option<File>,
    slices: Arc<[Slice]>,
    pinned: Arc<[AtomicBool]>,
    shared: Arc<Shared>,
}

impl Worker {
    fn run(self, rx: Receiver<Job>) {
        let mut locked = vec![false; self.slices.len()];
        for job in rx {
            match job {
                Job::Advise(slices) => self.advise(&slices),
                Job::Pin(want) => self.pin(&mut locked, &want),
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        // The map outlives this thread (`self.gguf`), and unmapping it would unlock the pages
        // anyway; unlock so the RAM is free as soon as the engine is dropped.
        let none = vec![false; locked.len()];
        self.pin(&mut locked, &none);
    }

    fn advise(&self, slices: &[usize]) {
        let Some(file) = &self.file else {
            return;
        };
        for &i in slices {
            let view = &self.slices[i].view;
            if let Some(len) = NonZeroU64::new(view.size) {
                let advice = rustix::fs::Advice::WillNeed;
                if rustix::fs::fadvise(file, view.offset, Some(len), advice).is_ok() {
                    self.shared.advised.fetch_add(view.size, Ordering::Relaxed);
                }
            }
        }
    }

    /// Unlock what is no longer wanted, then lock what is (until the first refusal, which is
    /// recorded: the next ranking tries again).
    fn pin(&self, locked: &mut [bool], want: &[bool]) {
        for (i, s) in self.slices.iter().enumerate() {
            if locked[i] && !want[i] && crate::lock::unlock(self.gguf.tensor_data(&s.view)).is_ok()
            {
                locked[i] = false;
                self.pinned[i].store(false, Ordering::Relaxed);
                self.shared
                    .pinned_bytes
                    .fetch_sub(s.view.size, Ordering::Relaxed);
            }
        }
        for (i, s) in self.slices.iter().enumerate() {
            if locked[i] || !want[i] {
                continue;
            }
            if let Err(e) = crate::lock::lock(self.gguf.tensor_data(&s.view)) {
                let mut first = self
                    .shared
                    .pin_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
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
            self.shared
                .pinned_bytes
                .fetch_add(s.view.size, Ordering::Relaxed);
        }
    }
}
