//! The only unsafe code in this crate: keeping a mapped range in RAM (`mlock(2)`) and letting
//! it go (`munlock(2)`), for the hot experts kept resident within `--pin-mb`, and marking the
//! tensors as read at random (`madvise(MADV_RANDOM)`), asking which pages of a slice are in the
//! page cache (`mincore(2)`) and releasing a cold expert's pages (`madvise(MADV_PAGEOUT)`).
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

/// Whether every page of `bytes` (a slice of a map of the whole file, at `file_offset` in it)
/// is in the page cache (`mincore(2)`; a page whose read is still in flight counts: it is
/// there, being filled). The expert readahead asks before it reads a slice, so what is already
/// resident is not read again.
///
/// # Errors
/// The kernel's refusal (`ENOMEM` for a range not mapped, `EINVAL` for a map that does not
/// start on a page, such as a file held in memory).
pub(crate) fn resident(bytes: &[u8], file_offset: u64) -> std::io::Result<bool> {
    if bytes.is_empty() {
        return Ok(true);
    }
    let page = rustix::param::page_size();
    let start = bytes.as_ptr() as usize;
    let base = usize::try_from(file_offset)
        .ok()
        .and_then(|o| start.checked_sub(o))
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let from = (start - start % page).max(base);
    let len = start + bytes.len() - from;
    let mut pages = vec![0u8; len.div_ceil(page)];
    // SAFETY: [from, from + len) lies inside the live map `bytes` borrows from (as in
    // `advise_random`: `from` moves down to a page boundary, never below the map's start);
    // mincore reads no memory through it and writes one byte per page of that range into
    // `pages`, which has exactly `len.div_ceil(page)` bytes.
    let rc = unsafe { libc::mincore(from as *mut c_void, len, pages.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pages.iter().all(|p| p & 1 == 1))
}

/// Reclaim the page-cache pages of `bytes` now (`MADV_PAGEOUT`): an expert used once is let go
/// at once, so that under a memory limit it evicts none of the hot experts that will be used
/// again. Only whole pages inside `bytes` are advised (a neighbour's shared page stays); a page
/// still mapped by another process stays too. Clean file pages are dropped, never written, and
/// read back from the file on the next touch: it changes where the bytes are, never what they
/// hold.
///
/// # Errors
/// The kernel's refusal (`EINVAL` before Linux 5.4, which lacks `MADV_PAGEOUT`).
pub(crate) fn page_out(bytes: &[u8]) -> std::io::Result<()> {
    let page = rustix::param::page_size();
    let start = bytes.as_ptr() as usize;
    let from = start.next_multiple_of(page);
    let to = (start + bytes.len()) / page * page;
    if to <= from {
        return Ok(());
    }
    // SAFETY: [from, to) lies inside `bytes` (rounded inward to whole pages), a live borrowed
    // slice of a read-only file map. MADV_PAGEOUT only reclaims those pages; a later read
    // faults them back in from the file with the same contents, so `bytes` and any other
    // borrow of the map keep reading the same values. No memory is read or written.
    unsafe {
        rustix::mm::madvise(
            from as *mut c_void,
            to - from,
            rustix::mm::Advice::LinuxPageOut,
        )
    }
    .map_err(Into::into)
}
