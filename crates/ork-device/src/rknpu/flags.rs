//! `RKNPU_MEM_*` buffer flags (bit values of the vendor driver 0.9.8, see `docs/device.md`) and
//! the mapping from a backend-neutral [`BufferIntent`] to them.

use crate::BufferIntent;

/// Buffer flags of MEM_CREATE; bit values are the vendor driver's `RKNPU_MEM_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct MemFlags(pub u32);

impl MemFlags {
    /// Pages need not be physically contiguous.
    pub const NON_CONTIGUOUS: MemFlags = MemFlags(1 << 0);
    /// CPU-cached; needs explicit syncs (MEM_SYNC is only valid on such buffers).
    pub const CACHEABLE: MemFlags = MemFlags(1 << 1);
    /// Also mapped in the kernel (the driver reads task descriptors through it).
    pub const KERNEL_MAPPING: MemFlags = MemFlags(1 << 3);
    /// Page-granular IOVA alignment instead of size alignment (driver 0.9.7+).
    pub const IOMMU_LIMIT_IOVA_ALIGNMENT: MemFlags = MemFlags(1 << 10);

    /// Whether all bits of `other` are set.
    pub const fn contains(self, other: MemFlags) -> bool {
        self.0 & other.0 == other.0
    }

    const fn or(self, other: MemFlags) -> MemFlags {
        MemFlags(self.0 | other.0)
    }

    /// The flags a buffer of `intent` is created with:
    ///
    /// * weights, activations, outputs: `NON_CONTIGUOUS | CACHEABLE | IOMMU_LIMIT_IOVA_ALIGNMENT`
    ///   (0x403, what public projects use for weights): no size alignment, so large buffers do
    ///   not fragment the window; cacheable, so syncs make CPU writes and device writes visible;
    /// * task descriptors: `KERNEL_MAPPING` (the driver reads them), contiguous, uncached;
    /// * probe buffers: `NON_CONTIGUOUS | CACHEABLE` (0x3), the plain DMA path with size-aligned
    ///   IOVAs that ork's board probe measured (64 MB buffer #63 fails after 4.23 GB).
    pub const fn for_intent(intent: BufferIntent) -> MemFlags {
        let streamed = Self::NON_CONTIGUOUS
            .or(Self::CACHEABLE)
            .or(Self::IOMMU_LIMIT_IOVA_ALIGNMENT);
        match intent {
            BufferIntent::Weight | BufferIntent::Activation | BufferIntent::Output => streamed,
            BufferIntent::Task => Self::KERNEL_MAPPING,
            BufferIntent::Probe => Self::NON_CONTIGUOUS.or(Self::CACHEABLE),
        }
    }

    /// Whether the driver page-aligns the buffer's IOVA (else it is aligned to its size rounded
    /// up to a power of two pages, the generic DMA path).
    pub const fn page_aligned(self) -> bool {
        self.contains(Self::IOMMU_LIMIT_IOVA_ALIGNMENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_map_to_the_driver_flags() {
        assert_eq!(MemFlags::for_intent(BufferIntent::Weight), MemFlags(0x403));
        assert_eq!(
            MemFlags::for_intent(BufferIntent::Activation),
            MemFlags(0x403)
        );
        assert_eq!(MemFlags::for_intent(BufferIntent::Output), MemFlags(0x403));
        assert_eq!(MemFlags::for_intent(BufferIntent::Task), MemFlags(0x8));
        assert_eq!(MemFlags::for_intent(BufferIntent::Probe), MemFlags(0x3));
        assert!(MemFlags(0x403).page_aligned());
        assert!(!MemFlags(0x3).page_aligned());
    }
}
