//! Host mappings of device buffers: the only place (with the ioctl and SIMD modules) that uses
//! `unsafe`.
//!
//! A [`HostMap`] owns one `mmap`ed region, page aligned, and unmaps it on drop. The emulator maps
//! anonymous memory (zeroed and committed lazily by the kernel, so creating a 64 MB buffer costs no
//! RAM until it is written, as with the driver's pages); the rknpu backend maps the DRM buffer
//! through its fake offset on the render node.

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

/// An owned, page-aligned, read-write host mapping of `len` bytes.
#[derive(Debug)]
pub(crate) struct HostMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `HostMap` owns its region exclusively (like a `Vec<u8>`): shared access only hands out
// `&[u8]`, mutation needs `&mut self`, so moving it or sharing `&HostMap` across threads is sound.
unsafe impl Send for HostMap {}
// SAFETY: see `Send`; `&HostMap` only gives `&[u8]`.
unsafe impl Sync for HostMap {}

impl HostMap {
    /// Map `len` (> 0) bytes of zeroed anonymous memory, without reserving swap (pages are
    /// committed when first touched, or all at once by [`HostMap::populate`]).
    pub(crate) fn anonymous(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh anonymous private mapping with a null hint cannot alias any existing
        // Rust object; the kernel picks the address.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Other))?;
        Ok(HostMap { ptr, len })
    }

    /// Map `len` bytes of `fd` at `offset`, shared.
    ///
    /// # Safety
    /// `offset` must name a region of at least `len` bytes that the driver backs for as long as
    /// the mapping lives (a DRM GEM fake offset from MEM_MAP of a live buffer), and no other
    /// mapping of it may be handed to Rust code as a slice.
    #[cfg(target_os = "linux")]
    pub(crate) unsafe fn shared_fd<Fd: AsFd>(
        fd: Fd,
        offset: u64,
        len: usize,
    ) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        // SAFETY: the caller guarantees the region exists and is not aliased by Rust slices.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                offset,
            )
        }?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Other))?;
        Ok(HostMap { ptr, len })
    }

    /// The mapped bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes owned by `self`; the borrow of
        // `self` keeps it mapped and forbids concurrent mutation through `as_mut_slice`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapped bytes, mutable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only live reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Fault every page in for writing with one call (`MADV_POPULATE_WRITE`, Linux 5.14+), for
    /// a mapping about to be written whole: cheaper than a page fault per 4 KiB on the first
    /// write (measured: loading SmolLM2's 134 MB of int8 on the compute path took 0.14 s with
    /// faults, 0.10–0.11 s populated). Only a hint: where the kernel refuses, the writes fault
    /// the pages in as before.
    #[cfg(target_os = "linux")]
    pub(crate) fn populate(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the live mapping owned by `self`; populating it
        // writes no byte (its pages read as zeros before and after) and `&mut self` excludes
        // any other reference to them meanwhile.
        let _ = unsafe {
            rustix::mm::madvise(
                self.ptr.as_ptr().cast::<c_void>(),
                self.len,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
    }

    /// No-op where `MADV_POPULATE_WRITE` does not exist.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn populate(&mut self) {}
}

impl Drop for HostMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping created in the constructor, and no
        // slice borrowed from `self` can outlive this call.
        let r = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
        // munmap of a mapping we created can only fail on a kernel bug; there is no caller to
        // report to from `drop`, and leaking the address range is the only safe fallback.
        debug_assert!(r.is_ok(), "munmap failed: {r:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_is_zeroed_aligned_and_writable() {
        let mut m = HostMap::anonymous(10_000).unwrap();
        assert_eq!(m.as_slice().as_ptr() as usize % 4096, 0);
        assert!(m.as_slice().iter().all(|&b| b == 0));
        m.as_mut_slice()[9_999] = 7;
        assert_eq!(m.as_slice()[9_999], 7);
        assert!(HostMap::anonymous(0).is_err());
    }

    #[test]
    fn populate_keeps_the_bytes() {
        let mut m = HostMap::anonymous(3 * 4096 + 5).unwrap();
        m.as_mut_slice()[4096] = 9;
        m.populate();
        assert_eq!(m.as_slice()[4096], 9);
        assert_eq!(m.as_slice().iter().map(|&b| u32::from(b)).sum::<u32>(), 9);
        m.as_mut_slice()[3 * 4096 + 4] = 1;
        m.populate();
        assert_eq!(m.as_slice()[3 * 4096 + 4], 1);
    }
}
