//! The engine's persistent worker threads, and how a matmul's rows are shared among them.
//!
//! The workers are a rayon pool of their own, started once when the engine opens (never a
//! thread per matmul or per token), each pinned to the chosen cores ([`crate::topology`]). An
//! idle rayon worker spins briefly, then yields, then parks on a condition variable (rayon-core
//! 1.13 `sleep/mod.rs`: 32 rounds before it becomes sleepy), so the matmuls of one decode step,
//! which follow each other within microseconds, find their workers awake.
//!
//! A round ([`CpuPool::run`]) hands out task indices from one atomic counter: every worker takes
//! the next unclaimed task until none is left. The calling thread is one of the round's `T`
//! threads (rayon's in-place scope) and `T − 1` workers join it: one task spawned per helper
//! asks for work, and a
//! task no worker has started yet is taken by whichever finishes first, so a worker whose core
//! is busy with another program (preempted) holds up the round by at most the one task it is
//! computing, never by a share of the matmul fixed in advance.
//!
//! A forward pass runs on one of the workers ([`CpuPool::run_pass`]), so that its rounds spawn
//! onto that worker's own queue and attention's parallel pieces (rayon's `par_iter` inside the
//! pass) land on the same threads. Run from a thread outside the pool, as the executor's default
//! put it on rayon's global pool, every round was injected from another pool and the global
//! pool's idle threads spun beside the engine's own (2 + 2 threads on 2 cores). Workers that
//! spin between rounds for the whole pass instead of parking (tried: "keepers" running
//! `yield_now` until the pass ended) gave no measurable gain on this VM, idle or loaded, and were
//! dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::thread::CpuSet;

use crate::topology::{CoreChoice, CoreSource, CpuOptions, Topology};
use crate::CpuError;

/// The engine's worker threads.
pub struct CpuPool {
    pool: rayon::ThreadPool,
    choice: CoreChoice,
    pinned: bool,
}

impl std::fmt::Debug for CpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPool")
            .field("choice", &self.choice)
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// The CPUs the calling thread may run on (its affinity mask).
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

impl CpuPool {
    /// Start the workers `options` ask for on this machine: the chosen cores of
    /// [`Topology::choose`] over `/sys/devices/system/cpu` and the process's affinity mask.
    ///
    /// # Errors
    /// Settings that cannot be used ([`CpuError::Threads`]), threads that cannot be started, or
    /// (for a core list given) pinned ([`CpuError::Pool`]).
    pub fn new(options: &CpuOptions) -> Result<CpuPool, CpuError> {
        let choice = Topology::system().choose(&allowed_cpus(), options)?;
        CpuPool::start(choice)
    }

    /// Start workers for a choice already made. Each is pinned to `choice.cores`; when that
    /// fails, a core list the user gave is an error, a default choice runs unpinned
    /// ([`CpuPool::pinned`] says which).
    ///
    /// # Errors
    /// As [`CpuPool::new`].
    pub fn start(choice: CoreChoice) -> Result<CpuPool, CpuError> {
        let mut set = CpuSet::new();
        for &c in &choice.cores {
            set.set(c);
        }
        let failed: Arc<Mutex<Option<std::io::Error>>> = Arc::default();
        let seen = Arc::clone(&failed);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(choice.threads)
            .thread_name(|i| format!("ork-cpu-{i}"))
            .start_handler(move |_| {
                if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.into());
                }
            })
            .build()
            .map_err(|e| CpuError::Pool {
                what: format!("starting {} worker threads", choice.threads),
                source: std::io::Error::other(e.to_string()),
            })?;
        // Every worker has run its start handler once it has run a broadcast.
        pool.broadcast(|_| ());
        let error = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(source) = error {
            if choice.source == CoreSource::List {
                return Err(CpuError::Pool {
                    what: format!(
                        "pinning the workers to cpus {}",
                        crate::topology::format_cpu_list(&choice.cores)
                    ),
                    source,
                });
            }
            return Ok(CpuPool {
                pool,
                choice,
                pinned: false,
            });
        }
        Ok(CpuPool {
            pool,
            choice,
            pinned: true,
        })
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.choice.threads
    }

    /// The cores and why they were chosen.
    pub fn choice(&self) -> &CoreChoice {
        &self.choice
    }

    /// Whether the workers are pinned to the chosen cores.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Run `task(i)` for every `i` in `0..tasks` on the workers, each index exactly once,
    /// claimed dynamically (see the module docs); returns when all have run. A panic in a task
    /// is passed on to the caller.
    pub fn run(&self, tasks: usize, task: impl Fn(usize) + Sync) {
        if tasks == 0 {
            return;
        }
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            task(i);
        };
        let helpers = self.threads().min(tasks) - 1;
        // The calling thread takes tasks too (an in-place scope: it does not hand the round to
        // a worker and sleep until it ends), so a round costs one hand-over to `helpers`
        // workers, not a hand-over both ways, and no third thread competes for the cores.
        self.pool.in_place_scope(|s| {
            for _ in 0..helpers {
                s.spawn(|_| work());
            }
            work();
        });
    }

    /// Run `pass` (one forward pass) on one of the workers (directly when the calling thread
    /// is one): its matmul rounds ([`CpuPool::run`] from a worker spawns onto the worker's own
    /// queue) and its parallel operators (attention's pieces, rayon's `par_iter` inside the
    /// pass) fork onto these threads alone. A panic in the pass is passed on to the caller.
    pub fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        self.pool.install(pass);
    }

    /// Run `cpu` on the workers while the calling thread runs `here` (another engine's share of
    /// the same step, `ork_runtime`'s row split): both at once, and this returns once both are
    /// done, with `here`'s result. The caller is not one of the workers, so `cpu` gets every
    /// worker (a [`CpuPool::run`] inside it runs its tasks as it would alone) and `here` keeps
    /// its own thread. A panic in either is passed on to the caller.
    pub fn beside<R>(&self, cpu: impl FnOnce() + Send, here: impl FnOnce() -> R) -> R {
        self.pool.in_place_scope(|s| {
            s.spawn(|_| cpu());
            here()
        })
    }
}
