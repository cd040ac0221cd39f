//! The IOVA window model: one 32-bit (4 GiB) device address space per IOMMU domain, with an
//! allocator that behaves like the kernel's.
//!
//! Linux's IOVA allocator (`drivers/iommu/iova.c`, `alloc_iova` with `size_aligned`, as used by
//! the generic DMA path in `dma-iommu.c`) hands out ranges top-down: it takes the highest free
//! range below the limit whose start is a multiple of the alignment, and with `size_aligned` the
//! alignment is the allocation's size rounded up to a power of two (in pages). The rknpu driver's
//! own allocator, used with `IOMMU_LIMIT_IOVA_ALIGNMENT`, is page granular. Both are modelled by
//! [`Window::alloc`]; which one applies is chosen by [`IovaAlign`].

use std::collections::BTreeMap;
use std::ops::Range;

/// Size of the IOVA space of one domain: 32 address bits.
pub const WINDOW_BYTES: u64 = 1 << 32;
/// IOMMU page size.
pub const PAGE_BYTES: u64 = 4096;

/// How an allocation's start address is aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IovaAlign {
    /// Generic DMA path: aligned to the size rounded up to a power of two pages.
    SizeOrder,
    /// `IOMMU_LIMIT_IOVA_ALIGNMENT`: page aligned only.
    Page,
}

/// Geometry of one domain's window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Bytes of IOVA space (4 GiB on the RK3588 IOMMU).
    pub size: u64,
    /// Ranges never handed out. The default reserves the page at IOVA 0: `dma-iommu.c` starts its
    /// IOVA domain at pfn 1. This default is a calibration against the board (see
    /// `docs/device.md`): it reproduces the measured "64 MB buffer #63 fails after 4.23 GB".
    pub reserved: Vec<Range<u64>>,
}

impl Default for WindowConfig {
    fn default() -> Self {
        // One range: the page at IOVA 0 (a Vec of ranges, not the range's elements).
        #[allow(clippy::single_range_in_vec_init)]
        let reserved = vec![0..PAGE_BYTES];
        WindowConfig {
            size: WINDOW_BYTES,
            reserved,
        }
    }
}

/// Why [`Window::alloc`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocFailure {
    /// Zero bytes requested.
    Zero,
    /// Larger than the usable window; can never succeed.
    Oversize {
        /// Usable bytes (window minus reserved).
        usable: u64,
    },
    /// No free range fits right now.
    Full {
        /// Page-rounded size requested.
        size: u64,
        /// Alignment required.
        align: u64,
        /// Largest free range.
        largest_free: u64,
    },
}

/// One domain's IOVA address space and its allocator.
///
/// Ranges are page-granular. `used` maps each allocated range's start to its end (exclusive);
/// reserved ranges live in `reserved` and are never freed.
#[derive(Clone, Debug)]
pub struct Window {
    size: u64,
    reserved: Vec<Range<u64>>,
    used: BTreeMap<u64, u64>,
    allocated: u64,
}

fn page_round(x: u64) -> Option<u64> {
    x.checked_add(PAGE_BYTES - 1).map(|v| v & !(PAGE_BYTES - 1))
}

/// Bytes of a window a buffer of `size` bytes occupies: `size` rounded up to whole IOMMU pages
/// (`u64::MAX` for sizes no window can hold). The emulator's and rknpu's
/// [`crate::Device::footprint`], and what a planner without a device uses for them.
pub const fn footprint(size: u64) -> u64 {
    match size.checked_add(PAGE_BYTES - 1) {
        Some(v) => v & !(PAGE_BYTES - 1),
        None => u64::MAX,
    }
}

impl Window {
    /// An empty window. Reserved ranges are clipped to the window and page-rounded outward.
    pub fn new(config: &WindowConfig) -> Self {
        let size = config.size & !(PAGE_BYTES - 1);
        let mut reserved: Vec<Range<u64>> = config
            .reserved
            .iter()
            .map(|r| {
                let start = (r.start & !(PAGE_BYTES - 1)).min(size);
                let end = page_round(r.end).unwrap_or(size).min(size);
                start..end
            })
            .filter(|r| r.start < r.end)
            .collect();
        reserved.sort_by_key(|r| r.start);
        // Merge overlaps so gap walking sees disjoint ranges.
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(reserved.len());
        for r in reserved {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Window {
            size,
            reserved: merged,
            used: BTreeMap::new(),
            allocated: 0,
        }
    }

    /// Bytes of the window that allocations may use.
    pub fn usable(&self) -> u64 {
        self.size - self.reserved.iter().map(|r| r.end - r.start).sum::<u64>()
    }

    /// Bytes currently allocated (page-rounded sizes).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Number of live allocations.
    pub fn live(&self) -> usize {
        self.used.len()
    }

    /// All occupied ranges (reserved and allocated), sorted, as `(start, end)`.
    fn occupied(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.reserved.iter().map(|r| (r.start, r.end)).collect();
        v.extend(self.used.iter().map(|(&s, &e)| (s, e)));
        v.sort_unstable();
        v
    }

    /// Free gaps, highest first, as `(start, end)`.
    fn gaps_top_down(&self) -> Vec<(u64, u64)> {
        let occ = self.occupied();
        let mut gaps = Vec::with_capacity(occ.len() + 1);
        let mut hi = self.size;
        for &(s, e) in occ.iter().rev() {
            if e < hi {
                gaps.push((e, hi));
            }
            hi = hi.min(s);
        }
        if hi > 0 {
            gaps.push((0, hi));
        }
        gaps
    }

    /// Largest free range in bytes.
    pub fn largest_free(&self) -> u64 {
        self.gaps_top_down()
            .iter()
            .map(|(s, e)| e - s)
            .max()
            .unwrap_or(0)
    }

    /// Alignment an allocation of `size` bytes (page-rounded) gets under `align`.
    pub fn alignment(size: u64, align: IovaAlign) -> u64 {
        match align {
            IovaAlign::Page => PAGE_BYTES,
            IovaAlign::SizeOrder => (size / PAGE_BYTES).next_power_of_two() * PAGE_BYTES,
        }
    }

    /// Allocate `size` bytes top-down; returns the IOVA of the range's start.
    pub fn alloc(&mut self, size: u64, align: IovaAlign) -> Result<u64, AllocFailure> {
        if size == 0 {
            return Err(AllocFailure::Zero);
        }
        let usable = self.usable();
        let size = match page_round(size) {
            Some(s) if s <= usable => s,
            _ => return Err(AllocFailure::Oversize { usable }),
        };
        let a = Self::alignment(size, align);
        for (lo, hi) in self.gaps_top_down() {
            if hi - lo < size {
                continue;
            }
            let start = (hi - size) & !(a - 1);
            if start >= lo {
                self.used.insert(start, start + size);
                self.allocated += size;
                return Ok(start);
            }
        }
        Err(AllocFailure::Full {
            size,
            align: a,
            largest_free: self.largest_free(),
        })
    }

    /// Return the range that starts at `iova`. Returns its size, or `None` if nothing was
    /// allocated there (the caller's bookkeeping is broken; nothing is changed).
    pub fn free(&mut self, iova: u64) -> Option<u64> {
        let end = self.used.remove(&iova)?;
        let size = end - iova;
        self.allocated -= size;
        Some(size)
    }
}

/// The windows of every IOMMU domain of one device and the accounting a device reports (live
/// buffers, peak resident bytes). One model for every backend, so the emulator's and the `rknn`
/// backend's budgets, alignment and wall hits agree.
pub(crate) struct Windows {
    windows: Vec<Window>,
    buffers_live: u64,
    peak: u64,
}

impl Windows {
    /// `domains` empty windows of the given geometry.
    pub(crate) fn new(domains: u32, config: &WindowConfig) -> Windows {
        Windows {
            windows: (0..domains).map(|_| Window::new(config)).collect(),
            buffers_live: 0,
            peak: 0,
        }
    }

    /// Reserve `size` bytes in `domain`'s window with the alignment the vendor driver would use
    /// for `intent`; returns the IOVA. The caller has checked that `domain` exists.
    pub(crate) fn alloc(
        &mut self,
        size: u64,
        intent: crate::BufferIntent,
        domain: crate::DomainId,
    ) -> Result<u64, crate::DeviceError> {
        use crate::DeviceError;
        let align = if crate::rknpu::flags::MemFlags::for_intent(intent).page_aligned() {
            IovaAlign::Page
        } else {
            IovaAlign::SizeOrder
        };
        let w = &mut self.windows[domain.0 as usize];
        let iova = match w.alloc(size, align) {
            Ok(iova) => iova,
            Err(AllocFailure::Zero) => return Err(DeviceError::ZeroSize { domain }),
            Err(AllocFailure::Oversize { usable }) => {
                return Err(DeviceError::Oversize {
                    requested: size,
                    usable,
                })
            }
            Err(AllocFailure::Full {
                size: rounded,
                align,
                largest_free,
            }) => {
                return Err(DeviceError::WindowFull {
                    domain,
                    requested: rounded,
                    align,
                    resident: w.allocated(),
                    largest_free,
                })
            }
        };
        self.buffers_live += 1;
        let total: u64 = self.windows.iter().map(Window::allocated).sum();
        self.peak = self.peak.max(total);
        Ok(iova)
    }

    /// Release a range [`Windows::alloc`] returned (exactly once per allocation).
    pub(crate) fn free(&mut self, domain: crate::DomainId, iova: u64) {
        if let Some(w) = self.windows.get_mut(domain.0 as usize) {
            let freed = w.free(iova);
            debug_assert!(
                freed.is_some(),
                "released an IOVA range that was not allocated"
            );
        }
        self.buffers_live -= 1;
    }

    /// Buffers alive now.
    pub(crate) fn buffers_live(&self) -> u64 {
        self.buffers_live
    }

    /// Bytes allocated per domain now.
    pub(crate) fn resident_per_domain(&self) -> Vec<u64> {
        self.windows.iter().map(Window::allocated).collect()
    }

    /// Most bytes allocated over all domains at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn top_down_and_size_aligned() {
        let mut w = Window::new(&WindowConfig::default());
        let a = w.alloc(64 * MIB, IovaAlign::SizeOrder).unwrap();
        assert_eq!(a, WINDOW_BYTES - 64 * MIB);
        // 12 KiB rounds its alignment up to 16 KiB.
        let b = w.alloc(12 * 1024, IovaAlign::SizeOrder).unwrap();
        assert_eq!(b % (16 * 1024), 0);
        assert_eq!(b, a - 16 * 1024);
        let c = w.alloc(12 * 1024, IovaAlign::Page).unwrap();
        assert_eq!(c, b - 12 * 1024);
    }

    #[test]
    fn calibration_63_buffers_of_64_mib() {
        for align in [IovaAlign::SizeOrder, IovaAlign::Page] {
            let mut w = Window::new(&WindowConfig::default());
            let mut n = 0;
            while w.alloc(64 * MIB, align).is_ok() {
                n += 1;
            }
            assert_eq!(n, 63, "{align:?}");
        }
    }

    #[test]
    fn size_alignment_fragments() {
        // 3 MiB buffers are 4 MiB aligned: after one, a 1 MiB hole stays that a 2 MiB buffer
        // (2 MiB aligned) cannot use but an unaligned 1 MiB buffer can.
        let cfg = WindowConfig {
            size: 8 * MIB,
            reserved: vec![],
        };
        let mut w = Window::new(&cfg);
        assert_eq!(w.alloc(3 * MIB, IovaAlign::SizeOrder), Ok(4 * MIB));
        assert_eq!(w.alloc(3 * MIB, IovaAlign::SizeOrder), Ok(0));
        assert!(matches!(
            w.alloc(2 * MIB, IovaAlign::SizeOrder),
            Err(AllocFailure::Full { .. })
        ));
        assert_eq!(w.alloc(MIB, IovaAlign::Page), Ok(7 * MIB));
        assert_eq!(w.largest_free(), MIB);
    }

    #[test]
    fn zero_and_oversize() {
        let mut w = Window::new(&WindowConfig::default());
        assert_eq!(w.alloc(0, IovaAlign::Page), Err(AllocFailure::Zero));
        assert!(matches!(
            w.alloc(WINDOW_BYTES, IovaAlign::Page),
            Err(AllocFailure::Oversize { .. })
        ));
        assert!(matches!(
            w.alloc(u64::MAX, IovaAlign::Page),
            Err(AllocFailure::Oversize { .. })
        ));
        assert_eq!(w.free(12345), None);
    }

    proptest! {
        #[test]
        fn random_alloc_free_never_overlaps(
            ops in proptest::collection::vec((any::<bool>(), 1u64..(600 * MIB), any::<bool>(), any::<prop::sample::Index>()), 1..200)
        ) {
            let cfg = WindowConfig { size: WINDOW_BYTES, reserved: vec![0..PAGE_BYTES, (1 << 31)..(1 << 31) + 5 * MIB] };
            let mut w = Window::new(&cfg);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (is_alloc, size, aligned, pick) in ops {
                if is_alloc || live.is_empty() {
                    let align = if aligned { IovaAlign::SizeOrder } else { IovaAlign::Page };
                    match w.alloc(size, align) {
                        Ok(start) => {
                            let len = page_round(size).unwrap();
                            prop_assert_eq!(start % Window::alignment(len, align), 0);
                            prop_assert!(start + len <= WINDOW_BYTES);
                            for r in &cfg.reserved {
                                prop_assert!(start + len <= r.start || start >= r.end);
                            }
                            for &(s, l) in &live {
                                prop_assert!(start + len <= s || start >= s + l, "overlap");
                            }
                            live.push((start, len));
                        }
                        Err(AllocFailure::Full { size: s, align: a, .. }) => {
                            // Top-down first fit is exhaustive: verify no aligned hole fits.
                            for (lo, hi) in w.gaps_top_down() {
                                prop_assert!(hi - lo < s || ((hi - s) & !(a - 1)) < lo);
                            }
                        }
                        Err(e) => prop_assert!(false, "unexpected {:?}", e),
                    }
                } else {
                    let (s, l) = live.swap_remove(pick.index(live.len()));
                    prop_assert_eq!(w.free(s), Some(l));
                }
                prop_assert_eq!(w.allocated(), live.iter().map(|x| x.1).sum::<u64>());
                prop_assert!(w.allocated() <= w.usable());
            }
            for (s, l) in live.drain(..) {
                prop_assert_eq!(w.free(s), Some(l));
            }
            prop_assert_eq!(w.allocated(), 0);
            prop_assert_eq!(w.live(), 0);
            prop_assert_eq!(w.largest_free(), (1 << 31) - PAGE_BYTES);
        }
    }
}
