//! The prefix cache on disk (`--prefix-cache-dir`, docs/serve.md "Across restarts"): read
//! before the server listens, written every `--prefix-cache-save-secs` while something changed
//! (so that a power cut loses at most that much) and once more after the drain.
//!
//! A periodic save builds the file's bytes on the scheduler thread — a copy at memory speed —
//! and leaves the disk to a writer thread, so decoding does not wait for an SD card; one write is
//! in flight at most (a change meanwhile waits for the next tick). The final save waits for it
//! and writes on the scheduler thread.
use crate::prefix::PrefixCache;
use crate::scheduler::SchedulerConfig;
use ork_runtime::Engine;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A prefix cache kept on disk.
#[derive(Clone, Debug)]
pub struct Persist {
    /// The file ([`PrefixCache::file_in`]).
    pub path: PathBuf,
    /// The numbers identity of the server's sessions (`Engine::numbers_identity`).
    pub identity: u64,
    /// Files it must never replace (the model, its pack).
    pub inputs: Vec<PathBuf>,
    /// How often a changed cache is written while the server runs (`None`: only when it
    /// stops).
    pub every: Option<Duration>,
}

/// The prefix cache a server of `config` starts with: with `config.persist`, what the file
/// holds (a file that cannot be read is a warning on stderr naming it, and an empty cache).
pub fn load_prefixes(engine: &Engine, config: &SchedulerConfig) -> PrefixCache {
    let mut prefixes = PrefixCache::new(config.prefix_cache_bytes);
    if let Some(p) = &config.persist {
        let fresh = || engine.session_with_context(config.context).ok();
        let t = Instant::now();
        match prefixes.load(&p.path, p.identity, fresh) {
            Ok(l) if l.entries > 0 => eprintln!(
                "ork serve: {} cached prefixes ({} tokens) read from {} in {:.3} s",
                l.kept,
                l.tokens,
                p.path.display(),
                t.elapsed().as_secs_f64()
            ),
            Ok(_) => {}
            Err(e) => eprintln!("warning: prefix cache not read: {e}"),
        }
    }
    prefixes
}

/// Writes the prefix cache while the server runs and when it stops.
pub struct Saver<'p> {
    persist: &'p Persist,
    /// [`PrefixCache::generation`] of the last image handed to a writer.
    saved: u64,
    last: Instant,
    writing: Option<JoinHandle<Result<(), String>>>,
}

fn inputs(p: &Persist) -> Vec<&Path> {
    p.inputs.iter().map(PathBuf::as_path).collect()
}

impl<'p> Saver<'p> {
    /// A saver for `prefixes` as read at start (already on disk).
    pub fn new(persist: &'p Persist, prefixes: &PrefixCache) -> Saver<'p> {
        Saver {
            persist,
            saved: prefixes.generation(),
            last: Instant::now(),
            writing: None,
        }
    }

    /// Start a write of `prefixes` if it changed since the last one, the period has passed and
    /// no write is in flight.
    pub fn tick(&mut self, prefixes: &PrefixCache) {
        let Some(every) = self.persist.every else {
            return;
        };
        if prefixes.generation() == self.saved || self.last.elapsed() < every {
            return;
        }
        if self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        self.reap();
        let image = prefixes.image(self.persist.identity);
        let (path, keep) = (self.persist.path.clone(), self.persist.inputs.clone());
        let spawned = std::thread::Builder::new()
            .name("ork-prefix-save".to_owned())
            .spawn(move || {
                let keep: Vec<&Path> = keep.iter().map(PathBuf::as_path).collect();
                PrefixCache::write(&path, &image, &keep)
            });
        match spawned {
            Ok(h) => self.writing = Some(h),
            Err(e) => eprintln!("warning: prefix cache not written: a writer thread: {e}"),
        }
        self.saved = prefixes.generation();
        self.last = Instant::now();
    }

    /// Wait for the write in flight, warning if it failed.
    fn reap(&mut self) {
        if let Some(w) = self.writing.take() {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("warning: prefix cache not written: {e}"),
                Err(_) => eprintln!("warning: prefix cache not written: its writer panicked"),
            }
        }
    }

    /// After the last request: wait for the write in flight, then write `prefixes` (always:
    /// it also replaces a file that could not be read at start).
    pub fn finish(mut self, prefixes: &PrefixCache) {
        self.reap();
        let p = self.persist;
        let t = Instant::now();
        match prefixes.save(&p.path, p.identity, &inputs(p)) {
            Ok(bytes) => eprintln!(
                "ork serve: {} cached prefixes ({bytes} bytes) written to {} in {:.3} s",
                prefixes.len(),
                p.path.display(),
                t.elapsed().as_secs_f64()
            ),
            Err(e) => eprintln!("warning: prefix cache not written: {e}"),
        }
    }
}
