//! Temporary files of streaming writers (the `.orkpack` writer): each is registered while it
//! lives, so that SIGINT or SIGTERM deletes it before the process dies of the signal, and one
//! left by an abrupt end (kill -9, power loss) is removed by the next writer in its directory
//! once its process is gone.
//!
//! The first call of [`install_signal_cleanup`] starts a signal-hook listener thread for SIGINT
//! and SIGTERM: on either, it deletes every live temporary file of the process, then re-raises
//! the signal with its default disposition, so the process still dies of it (exit status 130
//! for SIGINT in a shell). An application that handles these signals itself (a server that
//! drains) calls [`leave_signals_to_application`] once its handlers are installed.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tempfile::TempPath;

/// Paths of the temp files of live writers in this process (deleted by the signal listener).
static LIVE_TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Set by [`leave_signals_to_application`]: the listener no longer acts on signals.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// From now on SIGINT and SIGTERM belong to the application (a server that drains on them):
/// the writers' listener, if one was started, no longer deletes temp files and re-raises the
/// signal, so the process is not killed under the application's handler. Unfinished writers
/// still delete their temp files when dropped (as the application winds down), and a temp
/// left by an abrupt end is removed by the next writer of the same target. Call it only after
/// installing the application's own handlers: a signal in between still ends the process, as
/// it would have without them.
pub fn leave_signals_to_application() {
    HANDED_OVER.store(true, Ordering::SeqCst);
}
/// Set once the SIGINT/SIGTERM listener runs.
static SIGNAL_LISTENER: OnceLock<Result<(), String>> = OnceLock::new();

fn live_temps() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic while holding the lock cannot leave the Vec inconsistent: keep using it.
    LIVE_TEMPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Start the listener thread that removes live temp files on SIGINT/SIGTERM, then dies of the
/// signal. Idempotent.
pub fn install_signal_cleanup() -> Result<(), String> {
    SIGNAL_LISTENER
        .get_or_init(|| {
            use signal_hook::consts::{SIGINT, SIGTERM};
            let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
                .map_err(|e| format!("registering SIGINT/SIGTERM: {e}"))?;
            std::thread::Builder::new()
                .name("ork-store-signals".into())
                .spawn(move || {
                    for sig in signals.forever() {
                        if HANDED_OVER.load(Ordering::SeqCst) {
                            continue;
                        }
                        // Hold the lock until the process is gone so no writer can create or
                        // publish a temp file after the cleanup.
                        let temps = live_temps();
                        for p in temps.iter() {
                            let _ = std::fs::remove_file(p);
                        }
                        let _ = signal_hook::low_level::emulate_default_handler(sig);
                        // Only reached if re-raising failed.
                        std::process::exit(128 + sig);
                    }
                })
                .map_err(|e| format!("spawning the signal listener: {e}"))?;
            Ok(())
        })
        .clone()
}

/// A temp file registered for signal cleanup; deleted on drop unless published.
pub struct Temp {
    path: Option<TempPath>,
}

impl Temp {
    /// Create a temporary file named `prefix` + 8 random characters in `dir`, mode 0644 before
    /// the umask, registered for deletion on SIGINT/SIGTERM ([`install_signal_cleanup`]) before
    /// the registry's lock is released.
    pub fn create_in(dir: &Path, prefix: &OsStr) -> std::io::Result<(File, Temp)> {
        let mut temps = live_temps();
        // 0644 before the umask, like any file a user creates (tempfile's default is 0600).
        let tf = tempfile::Builder::new()
            .prefix(prefix)
            .rand_bytes(8)
            .permissions(std::fs::Permissions::from_mode(0o644))
            .tempfile_in(dir)?;
        let (file, tp) = tf.into_parts();
        temps.push(tp.to_path_buf());
        Ok((file, Temp { path: Some(tp) }))
    }

    /// The temporary file's path, until it is published.
    pub fn pending(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The temporary file's path.
    ///
    /// # Panics
    /// Never: a `Temp` is consumed by [`Temp::publish`].
    pub fn path(&self) -> &Path {
        self.path.as_deref().expect("temp present until published")
    }

    /// Rename over `target` (while holding the registry lock, so the signal listener never
    /// deletes a path that has already become the target).
    pub fn publish(mut self, target: &Path) -> std::io::Result<()> {
        let mut temps = live_temps();
        let tp = self.path.take().expect("temp present until published");
        let own: PathBuf = tp.to_path_buf();
        match tp.persist(target) {
            Ok(()) => {
                temps.retain(|p| *p != own);
                Ok(())
            }
            Err(e) => {
                // Hand the path back so Drop deletes it and deregisters it.
                self.path = Some(e.path);
                drop(temps);
                Err(e.error)
            }
        }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(tp) = self.path.take() {
            let mut temps = live_temps();
            let own: &Path = &tp;
            temps.retain(|p| p != own);
            drop(tp); // deletes the file
        }
    }
}

/// Remove temp files of `target` left behind by processes that no longer exist (kill -9, power
/// loss). Best effort: failures are ignored, the temps of live processes are left alone.
pub fn remove_stale_temps(dir: &Path, prefix: &OsStr) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = prefix.as_encoded_bytes();
    let own = std::process::id();
    for de in rd.flatten() {
        let name = de.file_name();
        let Some(rest) = name.as_encoded_bytes().strip_prefix(prefix) else {
            continue;
        };
        let Some(pid_bytes) = rest.split(|&b| b == b'.').next() else {
            continue;
        };
        let Some(pid) = std::str::from_utf8(pid_bytes)
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid as u32 == own {
            continue;
        }
        let Some(pid) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        if rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
            let _ = std::fs::remove_file(de.path());
        }
    }
}
