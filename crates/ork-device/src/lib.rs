//! ork layer 4 — **device**: the [`Device`] trait that the residency layer and the executor talk
//! to, an emulated RK3588 NPU ([`EmuDevice`], the default) and the vendor `rknpu` DRM backend
//! ([`RknpuDevice`], Linux).
//!
//! The model the crate encodes (REFERENCE §1): every IOMMU domain has a 32-bit, 4 GiB IOVA
//! window; buffers are carved out of it top-down, size-aligned unless
//! [`MemFlags::IOMMU_LIMIT_IOVA_ALIGNMENT`] is set; an exhausted window is the driver's errno 14,
//! here [`DeviceError::WindowFull`]. Up to 16 domains exist; one is attached to the NPU at a
//! time, and a task in another domain waits for the current one to drain and pays a switch.
//!
//! Matmul (REFERENCE §4): activations `M × K` — int8 with per-row scales, or fp16
//! ([`ActPrecision`]) — times a weight in the native tiled layout of [`ork_pack::TiledLayout`]
//! (int8, int4 or fp16), f32 output `M × N`.
//!
//! ```
//! use ork_device::{upload, Activations, CoreMask, Device, DomainId, EmuDevice, MatmulTask};
//! use ork_pack::{PackDtype, PackedWeight, TiledLayout};
//!
//! let dev = EmuDevice::new();
//! let layout = TiledLayout::new(PackDtype::I8, 64, 32);
//! let mut data = vec![0u8; layout.blob_bytes()];
//! data[layout.index(3, 5)] = 2; // q[n=5, k=3] = 2
//! let w = upload(&dev, &PackedWeight { layout, data, scales: vec![0.5; 32] }, DomainId(0))?;
//! let mut a = vec![0i8; 64];
//! a[3] = 10;
//! let mut out = vec![0f32; 32];
//! let task = MatmulTask {
//!     m: 1,
//!     activations: Activations::Host(&a),
//!     act_scales: &[0.1],
//!     weight: w.as_weight(),
//!     cores: CoreMask::AUTO,
//! };
//! dev.matmul(&task, &mut out)?;
//! assert!((out[5] - 10.0 * 2.0 * 0.1 * 0.5).abs() < 1e-6);
//! # Ok::<(), ork_device::DeviceError>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench;
mod buffer;
mod emu;
mod error;
mod gemm;
mod host_map;
pub mod kernel;
mod probe;
#[cfg(target_os = "linux")]
mod rknpu;
mod task;
pub mod window;

pub use buffer::{BufferView, DeviceBuffer};
pub use emu::{EmuConfig, EmuDevice, SwitchWait};
pub use error::DeviceError;
pub use probe::{probe_dma, probe_stream, DmaProbeMode, DmaProbeReport, StreamProbeReport};
#[cfg(target_os = "linux")]
pub use rknpu::RknpuDevice;
pub use task::{
    upload, ActPrecision, Activations, CoreMask, DeviceWeight, MatmulStats, MatmulTask, WeightRef,
};

/// Most IOMMU domains the vendor driver supports (`RKNPU_MAX_IOMMU_DOMAIN_NUM`).
pub const MAX_DOMAINS: u32 = 16;

/// An IOMMU domain id (`0..domains`, at most 16). Each domain has its own 4 GiB window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId(pub u32);

impl std::fmt::Display for DomainId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Buffer flags; bit values are the vendor driver's `RKNPU_MEM_*` (REFERENCE §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemFlags(pub u32);

impl MemFlags {
    /// Pages need not be physically contiguous.
    pub const NON_CONTIGUOUS: MemFlags = MemFlags(1 << 0);
    /// CPU-cached; needs explicit syncs.
    pub const CACHEABLE: MemFlags = MemFlags(1 << 1);
    /// Write-combined CPU mapping.
    pub const WRITE_COMBINE: MemFlags = MemFlags(1 << 2);
    /// Also mapped in the kernel (task buffers).
    pub const KERNEL_MAPPING: MemFlags = MemFlags(1 << 3);
    /// Through the IOMMU.
    pub const IOMMU: MemFlags = MemFlags(1 << 4);
    /// Zero the pages.
    pub const ZEROING: MemFlags = MemFlags(1 << 5);
    /// Page-granular IOVA alignment instead of size alignment (driver 0.9.7+).
    pub const IOMMU_LIMIT_IOVA_ALIGNMENT: MemFlags = MemFlags(1 << 10);
    /// What public projects use for weights: `NON_CONTIGUOUS | CACHEABLE | IOMMU_LIMIT_IOVA_ALIGNMENT`
    /// (0x403).
    pub const WEIGHT: MemFlags = MemFlags(0x403);

    /// Whether all bits of `other` are set.
    pub const fn contains(self, other: MemFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for MemFlags {
    type Output = MemFlags;
    fn bitor(self, rhs: MemFlags) -> MemFlags {
        MemFlags(self.0 | rhs.0)
    }
}

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Backend and model, e.g. "emulated RK3588 NPU".
    pub name: String,
    /// NPU cores (RK3588: 3).
    pub cores: u32,
    /// IOMMU domains usable (each with its own window).
    pub domains: u32,
    /// Bytes of one domain's IOVA window.
    pub window_bytes: u64,
    /// Driver version as "major.minor.patch", if there is a driver.
    pub driver_version: Option<String>,
}

/// Counters of a device since it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Buffers currently alive.
    pub buffers_live: u64,
    /// Bytes (page-rounded) allocated in each domain's window, indexed by domain id.
    pub resident_per_domain: Vec<u64>,
    /// Highest total of resident bytes seen.
    pub peak_resident: u64,
    /// Domain switches performed.
    pub domain_switches: u64,
    /// Matmul tasks completed.
    pub tasks: u64,
    /// Domain currently attached to the NPU.
    pub attached: DomainId,
}

impl DeviceStats {
    /// Sum of resident bytes over all domains.
    pub fn resident_total(&self) -> u64 {
        self.resident_per_domain.iter().sum()
    }
}

/// An NPU as ork sees it. Object safe; shared across threads.
pub trait Device: Send + Sync {
    /// Static facts about the device.
    fn info(&self) -> DeviceInfo;
    /// Allocate `size` bytes in `domain`'s window, mapped into the host.
    fn create_buffer(
        &self,
        size: u64,
        flags: MemFlags,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError>;
    /// Run one matmul; `out` is `m × n` f32, row-major.
    fn matmul(&self, task: &MatmulTask<'_>, out: &mut [f32]) -> Result<MatmulStats, DeviceError>;
    /// Run one matmul on an integer weight and return the exact i32 accumulators
    /// `Σ_k a[m,k] · q[n,k]` (`m × n`, row-major, no scales applied).
    fn matmul_raw(
        &self,
        task: &MatmulTask<'_>,
        out: &mut [i32],
    ) -> Result<MatmulStats, DeviceError>;
    /// Counters.
    fn stats(&self) -> DeviceStats;
}
