//! ork layer 4 — **device**: the [`Device`] trait that the residency layer and the executor talk
//! to, an emulated RK3588 NPU ([`EmuDevice`], the default), the vendor `rknpu` DRM backend
//! ([`RknpuDevice`], Linux; buffers only) and the vendor runtime backend ([`RknnDevice`]:
//! matmuls through `librknnrt.so`'s matmul API, loaded at run time; see `docs/rknn.md`).
//!
//! The model the crate encodes (see `docs/device.md`): every IOMMU domain has a 32-bit, 4 GiB IOVA
//! window; buffers are carved out of it top-down, page-aligned or size-aligned depending on what
//! they are for ([`BufferIntent`]); an exhausted window is the driver's errno 14,
//! here [`DeviceError::WindowFull`]. Up to 16 domains exist; one is attached to the NPU at a
//! time, and a task in another domain waits for the current one to drain and pays a switch.
//!
//! Matmul (see `docs/device.md`): activations `M × K` — int8 with per-row scales, or fp16
//! ([`ActPrecision`]) — times a weight in the native tiled layout of [`ork_pack::TiledLayout`]
//! (int8, int4 or fp16), f32 output `M × N`.
//!
//! ```
//! use ork_device::{upload, Activations, CoreMask, Device, DomainId, EmuDevice, MatmulTask};
//! use ork_pack::{PackDtype, PackedWeight, ScaleGroup, TiledLayout};
//!
//! let dev = EmuDevice::new();
//! let layout = TiledLayout::new(PackDtype::I8, 64, 32);
//! let mut data = vec![0u8; layout.blob_bytes()];
//! data[layout.index(3, 5)] = 2; // q[n=5, k=3] = 2
//! let w = upload(
//!     &dev,
//!     &PackedWeight { layout, data, scales: vec![0.5; 32], group: ScaleGroup::PerChannel },
//!     DomainId(0),
//! )?;
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
pub mod check_data;
mod emu;
mod error;
mod gemm;
mod host_map;
/// The CPU kernels the emulator runs, from their one home in `ork-kernels` (`docs/kernels.md`).
pub use ork_kernels::tile as kernel;
mod open;
mod probe;
pub mod rknn;
mod rknpu;
pub mod soc;
pub mod split;
mod task;
pub mod window;

#[cfg(feature = "testing")]
pub mod conformance;

pub use buffer::{BackendBuffer, BufferIntent, BufferView, DeviceBuffer, SyncDir};
pub use emu::{EmuConfig, EmuDevice, SwitchWait};
pub use error::DeviceError;
pub use open::{open, DeviceKind, OpenOptions};
pub use probe::{probe_dma, probe_stream, DmaProbeMode, DmaProbeReport, StreamProbeReport};
pub use rknn::RknnDevice;
#[cfg(target_os = "linux")]
pub use rknpu::RknpuDevice;
pub use soc::{ChipLimit, ElemType, Fp16Operand, MatmulShape, Soc};
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
    /// Whether [`Device::matmul`] runs on this backend (rknpu today: `false`, it can only
    /// allocate buffers). [`open`] never picks a backend that cannot compute for a caller that
    /// needs to.
    pub computes: bool,
    /// The chip whose matmul table the backend enforces (see `docs/chip.md`): a task the chip
    /// cannot run fails with [`DeviceError::Chip`]. `None` for a backend that models no chip.
    pub soc: Option<Soc>,
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
///
/// Every backend passes the conformance suite in the `conformance` module (feature `testing`;
/// see `docs/device.md`).
pub trait Device: Send + Sync {
    /// Static facts about the device.
    fn info(&self) -> DeviceInfo;
    /// Allocate `size` bytes for `intent` in `domain`'s window, mapped into the host. The window
    /// holds [`Device::footprint`]`(size)` bytes of it.
    fn create_buffer(
        &self,
        size: u64,
        intent: BufferIntent,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError>;
    /// Bytes of the window a buffer of `size` bytes occupies (its size rounded up to the
    /// device's page; what [`DeviceStats::resident_per_domain`] counts). Budgets are kept in
    /// these bytes.
    fn footprint(&self, size: u64) -> u64;
    /// Prepare a resident weight for tasks, for backends that bind a weight to a per-shape
    /// context (a vendor runtime binds B to a matmul context per type, K, N and domain).
    ///
    /// Called once its bytes are in place and synced ([`upload`] and the residency layer's
    /// weight cache call it; call it again after rewriting a weight's bytes). It is optional for
    /// correctness: [`Device::matmul`] on an unprepared weight prepares it itself, so this only
    /// moves that cost out of the first task. Preparing the same weight twice is cheap.
    ///
    /// There is no release call: a binding belongs to the weight's buffer and is released when
    /// that buffer is dropped (the backend does it in its [`BackendBuffer`]'s `Drop`), so a freed
    /// weight never leaves a binding behind. The default does nothing.
    fn prepare_weight(&self, weight: &WeightRef<'_>) -> Result<(), DeviceError> {
        let _ = weight;
        Ok(())
    }
    /// Run one matmul; `out` is `m × n` f32, row-major.
    fn matmul(&self, task: &MatmulTask<'_>, out: &mut [f32]) -> Result<MatmulStats, DeviceError>;
    /// Run several independent matmuls, `tasks[i]` into `outs[i]`, with the results of
    /// [`Device::matmul`] on each in turn, bit for bit. A backend may submit them as one job:
    /// the emulator runs the tiles of single-row int8 tasks of one domain in one parallel pass
    /// (one fork/join instead of one per task, which is what a decoded token's q/k/v and
    /// gate/up projections cost most at M = 1). Stops at the first error; the outputs of the
    /// tasks not run are then unspecified. Each task's [`MatmulStats::elapsed`] is the time of
    /// the whole batch when the backend ran it as one job.
    ///
    /// The default calls [`Device::matmul`] on each task in order.
    ///
    /// # Errors
    /// [`DeviceError::Length`] (operand "batch outputs") when `outs` and `tasks` differ in
    /// length; otherwise the first error [`Device::matmul`] would give.
    fn matmul_batch(
        &self,
        tasks: &[MatmulTask<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<Vec<MatmulStats>, DeviceError> {
        check_batch(tasks, outs)?;
        tasks
            .iter()
            .zip(outs.iter_mut())
            .map(|(t, o)| self.matmul(t, o))
            .collect()
    }
    /// Exact integer accumulators, where the backend can give them (the emulator can; hardware
    /// backends need not). Tests use them to compare bit for bit; the default is `None`.
    fn as_integer(&self) -> Option<&dyn IntegerOracle> {
        None
    }
    /// Counters.
    fn stats(&self) -> DeviceStats;
}

/// A backend that can return the exact i32 accumulators of a matmul (see
/// [`Device::as_integer`]).
pub trait IntegerOracle {
    /// Run one matmul on an integer weight and int8 activations and return the exact i32
    /// accumulators `Σ_k a[m,k] · q[n,k]` (`m × n`, row-major, no scales applied). Other
    /// operands are [`DeviceError::NotInteger`].
    fn matmul_raw(
        &self,
        task: &MatmulTask<'_>,
        out: &mut [i32],
    ) -> Result<MatmulStats, DeviceError>;
}

/// [`DeviceError::Length`] unless a batch has one output per task.
pub(crate) fn check_batch(
    tasks: &[MatmulTask<'_>],
    outs: &[&mut [f32]],
) -> Result<(), DeviceError> {
    if tasks.len() != outs.len() {
        return Err(DeviceError::Length {
            operand: "batch outputs",
            expected: tasks.len(),
            got: outs.len(),
        });
    }
    Ok(())
}
