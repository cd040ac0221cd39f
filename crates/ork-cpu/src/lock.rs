//! The only unsafe code in this crate: keeping a mapped range in RAM (`mlock(2)`) and letting
//! it go (`munlock(2)`), for the hot experts kept resident within `--pin-mb`, and marking the
//! expert slices as read at random (`madvise(MADV_RANDOM)`).
//!
//! The calls take the address range of a slice of the GGUF's map that the caller borrows: the
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

/// Alignment the start of an advised range is rounded down to: a multiple of every page size
/// (4, 16 and 64 KiB), so the address is page-aligned as `madvise` requires.
const ADVISE_ALIGN: usize = 64 << 10;

/// Tell the kernel `bytes` (a slice of a map of the whole file, at `file_offset` in it) are
/// read at random (`MADV_RANDOM`): a page fault there reads that page only, not the device's
/// read-around window (`read_ahead_kb`; 8 MiB on the development machine's virtio disk, which
/// read the neighbouring experts on every fault). The expert readahead reads exactly what is
/// routed instead. The start is rounded down to [`ADVISE_ALIGN`], but not below the map's
/// start, so a neighbour's pages may get the hint too: it changes how pages are read, never
/// what they hold.
///
/// # Errors
/// The kernel's refusal.
pub(crate) fn advise_random(bytes: &[u8], file_offset: u64) -> std::io::Result<()> {
    let start = bytes.as_ptr() as usize;
    let Some(base) = usize::try_from(file_offset)
        .ok()
        .and_then(|o| start.checked_sub(o))
    else {
        return Ok(());
    };
    if bytes.is_empty() {
        return Ok(());
    }
    // The map starts page-aligned (mmap's result), so either bound is a page boundary.
    let from = (start - start % ADVISE_ALIGN).max(base);
    let len = start + bytes.len() - from;
    // SAFETY: [from, start + len) lies inside the live map `bytes` borrows from: `bytes` is in
    // it, and `from` only moves down, never below the map's start (`bytes` is at `file_offset`
    // of a map of the whole file). MADV_RANDOM changes the kernel's readahead policy for
    // those pages only; no memory is read or written.
    unsafe { rustix::mm::madvise(from as *mut c_void, len, rustix::mm::Advice::Random) }
        .map_err(Into::into)
}
