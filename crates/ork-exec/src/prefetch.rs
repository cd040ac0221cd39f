//! A cache prefetch hint for data read soon in a pattern the hardware prefetcher follows late
//! (strided rows). A hint only: results never depend on it.
#![allow(unsafe_code)]

/// Ask the CPU to bring every cache line of `data` into L1 (a no-op where there is no such
/// hint).
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(data);
        let p = data.as_ptr().cast::<i8>();
        for off in (0..bytes).step_by(64) {
            // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has; it is a hint that
            // never faults and reads nothing observable, and the address lies inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}
