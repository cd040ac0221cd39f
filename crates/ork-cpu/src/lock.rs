//! The only unsafe code in this crate: keeping a mapped range in RAM (`mlock(2)`) and letting
//! it go (`munlock(2)`), for the hot experts kept resident within `--pin-mb`.
//!
//! Both calls take the address range of a slice of the GGUF's map that the caller borrows: the
//! kernel rounds it out to whole pages (a neighbour's bytes on a shared page are locked too,
//! which is harmless), reads nothing through it and writes nothing to it. Locking needs
//! `RLIMIT_MEMLOCK` room or `CAP_IPC_LOCK` (root); a refusal is returned, never hidden.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;

/// Lock `bytes`' pages in RAM (faulting them in first: it blocks on storage, so call it off
/// the compute threads).
///
/// # Errors
/// The kernel's refusal (`EPERM`/`ENOMEM` past `RLIMIT_MEMLOCK`, `EAGAIN`, `EFAULT` for pages
/// past the end of a file cut short).
pub(crate) fn lock(bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: the range is a live borrowed slice (mapped for at least this call); mlock only
    // changes how the kernel treats those pages and neither reads nor writes memory through
    // the pointer, so the `*mut` it takes is never used to mutate.
    unsafe { rustix::mm::mlock(bytes.as_ptr() as *mut c_void, bytes.len()) }.map_err(Into::into)
}

/// Let `bytes`' pages be reclaimed again (the reverse of [`lock`]).
///
/// # Errors
/// The kernel's refusal.
pub(crate) fn unlock(bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `lock`: a live borrowed range, not read or written through the pointer.
    unsafe { rustix::mm::munlock(bytes.as_ptr() as *mut c_void, bytes.len()) }.map_err(Into::into)
}
