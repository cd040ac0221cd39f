//! The only unsafe code in this crate: mapping a file, dropping its pages, and surviving the
//! file being cut short while it is mapped.
//!
//! # A file that shrinks under its mapping
//! Reading a page of a mapping that lies wholly past the end of its file raises `SIGBUS`, which
//! kills the process. Another program may truncate or rewrite (`>`/`cp` truncate first) a model
//! or an `.orkpack` while ork has it mapped, so every [`GuardedMap`] is registered in a small
//! lock-free table, and a process-wide `SIGBUS` handler (installed once, chained to the handler
//! that was there before) looks the faulting address up in it:
//! - inside a registered mapping: it maps one anonymous zero page over the faulting page
//!   (`MAP_FIXED`, read-only), raises that mapping's *faulted* flag, and returns; the read is
//!   retried and yields zeros;
//! - anywhere else: it hands the signal to the previous handler (std's stack-overflow handler,
//!   or the default action), so unrelated faults still kill the process as before.
//!
//! Readers check [`GuardedMap::intact`] (flag not raised, file still as long as the mapping)
//! after copying or decoding bytes, and turn a changed file into the same error as a short one
//! (see `docs/orkpack.md`, "Files that change while open"). Bytes read from a shortened file's
//! last, partial page read as zeros without any fault; the length check catches those.

use memmap2::{Mmap, MmapOptions, UncheckedAdvice};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Registered mappings at once; a mapping beyond this still works, unguarded (its faults then
/// behave as before: the process dies of SIGBUS).
const SLOTS: usize = 256;

/// One registered mapping: `start == 0` means free.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // used only to initialise the array below
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Serialises registration (the handler itself only reads atomics).
static REGISTER: Mutex<()> = Mutex::new(());
/// The `SIGBUS` action that was installed before ours (set once, before ours is installed).
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();
/// The system page size, read once outside the handler.
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// Install the handler once per process; `false` if `sigaction` failed.
fn install_handler() -> bool {
    PREVIOUS
        .get_or_init(|| {
            PAGE.store(rustix::param::page_size(), Ordering::Relaxed);
            // SAFETY: `sigaction` is given a zeroed (valid: empty mask, no flags) struct filled
            // with a handler of the SA_SIGINFO signature, and a valid out-pointer for the old
            // action. The handler only touches atomics and calls `mmap`/`sigaction`, which are
            // system calls and safe in a signal handler.
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_sigbus as *const () as usize;
                new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, &new, &mut old) != 0 {
                    return None;
                }
                Some(old)
            }
        })
        .is_some()
}

/// The process-wide `SIGBUS` handler (see the module docs).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` for a SA_SIGINFO handler; for SIGBUS
    // `si_addr` is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    if page != 0 {
        for slot in &TABLE {
            let start = slot.start.load(Ordering::Acquire);
            let len = slot.len.load(Ordering::Acquire);
            if start == 0 || addr < start || addr - start >= len {
                continue;
            }
            let at = addr & !(page - 1);
            // SAFETY: `at..at + page` lies inside a live read-only mapping owned by a
            // `GuardedMap` (registered until just before it is unmapped, and a fault inside it
            // means a reader still borrows it). Replacing that page with an anonymous zero page
            // changes only the bytes readers see there — from "fault" to zeros — which they
            // detect through the faulted flag. mmap is a plain system call.
            let r = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::Release);
                return;
            }
            break;
        }
    }
    // Not ours (or the page could not be replaced): behave as if we were not here.
    match PREVIOUS.get().copied().flatten() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
                // signature; we pass on the arguments the kernel gave us.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a handler installed without SA_SIGINFO has the one-argument signature.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Restore the default action and return: the faulting instruction runs again and
            // the process dies of SIGBUS, exactly as without this handler.
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default action.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// A read-only, private mapping of a whole file whose pages may vanish (the file cut short by
/// another program) without killing the process: see the module docs.
pub struct GuardedMap {
    mmap: Option<Mmap>,
    file: File,
    len: u64,
    /// The file's modification time when it was mapped (`None` where the platform has none).
    modified: Option<std::time::SystemTime>,
    slot: Option<usize>,
}

impl std::fmt::Debug for GuardedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedMap")
            .field("len", &self.len)
            .field("guarded", &self.slot.is_some())
            .finish()
    }
}

impl GuardedMap {
    /// Map all of `file` (its current length) read-only and register the mapping. An empty file
    /// maps to nothing (`mmap` refuses zero-length maps). The file is kept open for
    /// [`GuardedMap::intact`].
    pub fn new(file: File) -> io::Result<GuardedMap> {
        let meta = file.metadata()?;
        let (len, modified) = (meta.len(), meta.modified().ok());
        if len == 0 {
            return Ok(GuardedMap {
                mmap: None,
                file,
                len,
                modified,
                slot: None,
            });
        }
        let ulen = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file larger than memory"))?;
        // SAFETY: the mapping is read-only and private, so nothing in this process writes
        // through it. Another process may still truncate or rewrite the file while it is mapped:
        // a truncation makes reads of the vanished pages fault, which the registered SIGBUS
        // handler turns into zero pages plus a raised flag (module docs); a rewrite in place
        // changes the bytes under `&[u8]` borrows, which ork never relies on for memory safety
        // (bytes are only ever decoded, every offset is checked against lengths fixed at open)
        // and which checksums (orkpack) or `intact` (length) report.
        let mmap = unsafe { MmapOptions::new().len(ulen).map(&file)? };
        let slot = if install_handler() {
            register(mmap.as_ptr() as usize, ulen)
        } else {
            None
        };
        Ok(GuardedMap {
            mmap: Some(mmap),
            file,
            len,
            modified,
            slot,
        })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.mmap.as_deref().unwrap_or(&[])
    }

    /// Whether every byte read from the mapping so far was the file's: no page of it vanished
    /// (faulted and replaced by zeros) and the file is still at least as long as the mapping
    /// (an `fstat`). Call it after reading; `Err` carries the reason, for an error message.
    pub fn intact(&self) -> Result<(), io::Error> {
        self.unchanged().map(drop)
    }

    /// [`GuardedMap::intact`], and whether the file's modification time is still the one it had
    /// when it was mapped (`Ok(false)`: written to since, in place; its bytes may differ from
    /// those read before). One `fstat`.
    pub fn unchanged(&self) -> Result<bool, io::Error> {
        if let Some(i) = self.slot {
            if TABLE[i].faulted.load(Ordering::Acquire) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file was cut short while open (a mapped page vanished)",
                ));
            }
        }
        let meta = self.file.metadata()?;
        let now = meta.len();
        if now < self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the file was cut from {} to {now} bytes while open",
                    self.len
                ),
            ));
        }
        Ok(self.modified.is_some() && meta.modified().ok() == self.modified)
    }

    /// The open file behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Release the physical pages backing the whole pages inside `range` (rounded inwards to page
    /// boundaries); returns how many bytes were advised. Ranges outside the map advise nothing.
    pub fn dont_need(&self, range: Range<usize>) -> io::Result<usize> {
        let Some(mmap) = &self.mmap else {
            return Ok(0);
        };
        let page = rustix::param::page_size();
        if range.end > mmap.len() || range.start >= range.end {
            return Ok(0);
        }
        // The map starts on a page boundary (it maps from file offset 0), so file offsets and
        // offsets into the map round the same way.
        let start = range.start.div_ceil(page) * page;
        let end = range.end / page * page;
        if start >= end {
            return Ok(0);
        }
        // SAFETY: `MADV_DONTNEED` is "unchecked" in memmap2 because on a private mapping it throws
        // away pages the process modified (copy-on-write) and refills them from the file. This map
        // is read-only (`Mmap`, PROT_READ), so no page was ever modified: afterwards every page
        // reads back the same file bytes (or zeros, for a page the SIGBUS handler replaced), and
        // outstanding `&[u8]` borrows stay valid. The range `start..end` is page-aligned and
        // lies inside the map (checked above).
        unsafe {
            mmap.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)?;
        }
        Ok(end - start)
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Deregister before the mapping goes away (the Mmap field drops after this body).
        if let Some(i) = self.slot.take() {
            let _g = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
            TABLE[i].start.store(0, Ordering::Release);
            TABLE[i].len.store(0, Ordering::Release);
            TABLE[i].faulted.store(false, Ordering::Release);
        }
    }
}

/// Claim a free slot for `start..start + len`.
fn register(start: usize, len: usize) -> Option<usize> {
    let _g = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
    let i = TABLE
        .iter()
        .position(|s| s.start.load(Ordering::Acquire) == 0)?;
    TABLE[i].faulted.store(false, Ordering::Release);
    TABLE[i].len.store(len, Ordering::Release);
    TABLE[i].start.store(start, Ordering::Release);
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_write_in_place_is_reported_as_a_change() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[1u8; 64]).unwrap();
        // An old modification time, so that the write below moves it whatever the clock's
        // granularity.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        f.as_file().set_modified(old).unwrap();
        let map = GuardedMap::new(File::open(f.path()).unwrap()).unwrap();
        assert!(map.unchanged().unwrap());
        use std::os::unix::fs::FileExt;
        f.as_file().write_at(&[2u8], 10).unwrap();
        assert!(!map.unchanged().unwrap(), "same length, new bytes");
        assert!(map.intact().is_ok(), "a rewrite is not a cut");
    }

    #[test]
    fn a_file_cut_short_under_the_map_reads_zeros_and_reports_it() {
        let page = rustix::param::page_size();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 4 * page]).unwrap();
        let map = GuardedMap::new(File::open(f.path()).unwrap()).unwrap();
        assert_eq!(map.bytes()[3 * page], 7);
        assert!(map.intact().is_ok());
        f.as_file().set_len(page as u64).unwrap();
        map.dont_need(0..4 * page).unwrap();
        // Without the handler this read would kill the test process with SIGBUS.
        let sum: u64 = map.bytes()[2 * page..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 0);
        assert_eq!(map.bytes()[0], 7);
        assert_eq!(
            map.intact().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
