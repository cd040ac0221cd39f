//! Host memory behind a memory object: one zeroed, page-aligned allocation.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ptr::NonNull;

/// A zeroed, page-aligned allocation, freed on drop.
#[derive(Debug)]
pub(crate) struct Block {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes owned by this value; the runtime API hands their address to the caller,
// who writes through it between calls, as with the real runtime's memory.
unsafe impl Send for Block {}
// SAFETY: as above; the stand-in itself only reads through shared references.
unsafe impl Sync for Block {}

impl Block {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.max(1), 4096).ok()
    }

    /// `len` zero bytes, or `None` if the allocator refuses.
    pub(crate) fn new(len: usize) -> Option<Block> {
        let layout = Self::layout(len)?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(p).map(|ptr| Block { ptr, len })
    }

    /// First byte.
    pub(crate) fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// `len` bytes at `offset` (`None` outside the block).
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: inside the allocation, which lives as long as `self`. The caller of the C API
        // may write these bytes concurrently only by violating the API's own contract (no
        // writes to operands during `rknn_matmul_run`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// `len` bytes at `offset`, writable (`None` outside the block).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn bytes_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: inside the allocation. Only `rknn_matmul_run` writes (the C operand), while it
        // holds no other reference to these bytes; the API's contract forbids the caller from
        // touching C during the run.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}
