//! A closed standard output ends a command-line run the way it ends other Unix tools: the
//! process dies of `SIGPIPE` at the first write, silently (shells report exit status 141).
//!
//! Rust programs start with `SIGPIPE` ignored, so a write to a closed pipe returns `EPIPE`
//! instead, and `println!` turns that into a panic (exit 101, "failed printing to stdout").
//! Restoring the default action covers every print path at once (`println!`, `eprintln!`,
//! locked writers, library output) rather than each call site. A network server must not call
//! this: a peer that goes away would kill it (`docs/cli.md`).

/// Restore the default action of `SIGPIPE` (terminate the process). Call it first in `main`
/// of a command-line tool; `false` if `sigaction` failed (writes then keep returning `EPIPE`).
pub fn die_on_closed_pipe() -> bool {
    // SAFETY: `sigaction` is given a zeroed (valid: empty mask, no flags) struct whose handler
    // is `SIG_DFL`, and no out-pointer; no handler code of ours runs.
    unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(libc::SIGPIPE, &new, std::ptr::null_mut()) == 0
    }
}
