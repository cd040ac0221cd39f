//! The only unsafe code in this crate: mapping the file and dropping its pages.
//!
//! Both operations go through `memmap2`; this module exists so that the two `unsafe` calls and
//! the reasoning that makes them sound sit in one place.

use memmap2::{Mmap, UncheckedAdvice};
use std::fs::File;
use std::io;
use std::ops::Range;

/// A read-only, private mapping of a whole file.
pub(crate) struct Map {
    mmap: Mmap,
}

impl Map {
    /// Map all of `file` read-only.
    pub(crate) fn new(file: &File) -> io::Result<Map> {
        // SAFETY: the mapping is read-only and private, so nothing in this process writes through
        // it. The remaining hazard of any file mapping — another process truncating or rewriting
        // the file while it is mapped — cannot be excluded by a library: truncation makes later
        // reads fault (SIGBUS), rewriting changes the bytes under `&[u8]` borrows. ork treats
        // model files as immutable while they are open (as llama.cpp and candle do) and documents
        // it on `GgufFile::open`.
        let mmap = unsafe { Mmap::map(file)? };
        Ok(Map { mmap })
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Release the physical pages backing the whole pages inside `range` (rounded inwards to page
    /// boundaries); returns how many bytes were advised. Ranges outside the map advise nothing.
    pub(crate) fn dont_need(&self, range: Range<usize>) -> io::Result<usize> {
        let page = rustix::param::page_size();
        if range.end > self.mmap.len() || range.start >= range.end {
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
        // reads back the same file bytes, and outstanding `&[u8]` borrows stay valid. The range
        // `start..end` is page-aligned and lies inside the map (checked above).
        unsafe {
            self.mmap
                .unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)?;
        }
        Ok(end - start)
    }
}
