//! The prefix cache on disk (`--prefix-cache-dir`, docs/serve.md "Across restarts"): read
//! before the server listens, written every `--prefix-cache-save-secs` while something changed
//! (so that a power cut loses at most that much) and once more after the drain.
//!
//! A periodic save builds the file's bytes on the scheduler thread — a copy at memory speed —
//! and leaves the disk to a writer thread, so decoding does not wait for an SD card; one write is
//! in flight at most (a change meanwhile waits for the next tick). The final save waits for it
//! and writes on the scheduler thread.
use crate::error::ServerError;
use crate::prefix::PrefixCache;
use crate::scheduler::SchedulerConfig;
use ork_runtime::Engine;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    /// The lock that makes this server the file's one writer (`None`: another server holds
    /// it; this one reads the file and never writes it).
    pub lock: Option<Arc<std::fs::File>>,
}

/// Where `engine`'s prefix cache of `context`-position sessions is kept in `dir` (created if
/// missing), what it must never replace, and whether this server may write it (its lock).
/// What would make a write fail later (a link in the file's place, a read-only or nearly full
/// directory) is a warning now.
///
/// # Errors
/// `dir` is not a directory (a file, a dangling link) or cannot be created.
pub(crate) fn persist(
    engine: &Engine,
    dir: &Path,
    context: usize,
    budget: usize,
    every: Option<Duration>,
) -> Result<Persist, ServerError> {
    let bad = |what: String| ServerError::Config {
        setting: "--prefix-cache-dir",
        what: format!("{}: {what}", dir.display()),
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() && !dir.exists() => {
            let to = std::fs::read_link(dir).unwrap_or_default();
            return Err(bad(format!(
                "a symbolic link to {}, which does not exist",
                to.display()
            )));
        }
        Ok(_) if !dir.is_dir() => {
            return Err(bad("a file, not a directory".to_owned()));
        }
        _ => {}
    }
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("cannot be created: {e}")))?;
    let identity = engine.numbers_identity(context, Some(dir));
    let mut inputs = vec![engine.config().model.clone()];
    inputs.extend(engine.pack_path().cloned());
    let path = PrefixCache::file_in(dir, identity);
    let lock = lock(&path);
    if lock.is_some() {
        remove_stale_temporaries(dir, &path);
        let keep: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
        if let Err(e) = PrefixCache::check_writable(&path, &keep) {
            eprintln!("warning: the prefix cache will not be written: {e}");
        }
        warn_about_room(dir, budget);
    }
    Ok(Persist {
        path,
        identity,
        inputs,
        every,
        lock,
    })
}

/// An exclusive lock on `path`'s lock file (`path` + `.lock`), held while the server runs (the
/// kernel drops it when the process ends, however it ends); `None`, with a warning, when
/// another server holds it or it cannot be taken.
fn lock(path: &Path) -> Option<Arc<std::fs::File>> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    // The lock file is never written; O_NOFOLLOW: a link in its place is not opened.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .mode(0o600)
        .open(&lock_path);
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "warning: the prefix cache will not be written: its lock {}: {e}",
                lock_path.display()
            );
            return None;
        }
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Some(Arc::new(file)),
        Err(e) => {
            let why = if e == rustix::io::Errno::WOULDBLOCK {
                "another server on this directory and model holds it; this one reads the file \
                 at start and leaves writing it to that server"
                    .to_owned()
            } else {
                e.to_string()
            };
            eprintln!(
                "warning: the prefix cache {} will not be written: {why}",
                path.display()
            );
            None
        }
    }
}

/// Warn when `dir` cannot take a write: read-only, not writable by this user, or with less room
/// than a full cache of `budget` bytes.
fn warn_about_room(dir: &Path, budget: usize) {
    match ork_io::output::dir_room(dir) {
        Err(e) => eprintln!("warning: the prefix cache will not be written: {e}"),
        Ok(free) if free < budget as u64 => eprintln!(
            "warning: {} has {free} bytes free, less than the prefix cache's {budget}: a full \
             cache will not be written",
            dir.display()
        ),
        Ok(_) => {}
    }
    if let Ok(m) = std::fs::metadata(dir) {
        if m.permissions().mode() & 0o022 != 0 {
            eprintln!(
                "warning: {} is writable by other users: whoever can write it decides what this \
                 server reads as its cached prefixes (docs/serve.md)",
                dir.display()
            );
        }
    }
}

/// Remove what writes cut by a crash or a power cut left in the prefix cache's directory
/// (`ork_io::output::remove_stale_temporaries`: every temporary file of `path`, which only its
/// lock holder, this server, writes, and other temporary files of ork's atomic writes older
/// than ten minutes).
fn remove_stale_temporaries(dir: &Path, path: &Path) {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    for (file, result) in ork_io::output::remove_stale_temporaries(dir, name.as_deref()) {
        match result {
            Ok(()) => eprintln!("ork serve: removed {}, left by a cut write", file.display()),
            Err(err) => eprintln!("warning: cannot remove {}: {err}", file.display()),
        }
    }
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
        let Some(every) = self.persist.every.filter(|_| self.persist.lock.is_some()) else {
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
        if p.lock.is_none() {
            return;
        }
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
