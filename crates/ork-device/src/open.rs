//! Opening a device by kind: the one place that decides which backend `auto` means.

use std::sync::Arc;

use crate::{Device, DeviceError, EmuConfig, EmuDevice};

/// Which backend to open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// The policy of [`open`]: an NPU backend that opens and can do what the caller needs,
    /// else the emulator.
    #[default]
    Auto,
    /// The emulated RK3588 NPU ([`EmuDevice`]).
    Emu,
    /// The vendor `rknpu` DRM driver (Linux, on an RK3588 board).
    Rknpu,
    /// The vendor runtime `librknnrt.so` ([`crate::RknnDevice`], `ORK_RKNN_LIB` or the usual
    /// paths), computing through its matmul API.
    Rknn,
}

/// How to open a device.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenOptions {
    /// IOMMU domains the emulator and the `rknn` backend get (1..=16; `None`: all 16). The rknpu
    /// backend has the domains its driver has.
    pub domains: Option<u32>,
    /// Whether the caller will submit matmuls (`true`, the default) or only allocates buffers
    /// (the window probes). A backend that cannot compute ([`crate::DeviceInfo::computes`]) is
    /// refused when asked for by name and skipped by `auto` when this is set.
    pub compute: bool,
    /// The chip the emulator models and the `rknn` backend keeps to (default RK3588; see
    /// `docs/chip.md`).
    pub soc: crate::Soc,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            domains: None,
            compute: true,
            soc: crate::Soc::Rk3588,
        }
    }
}

impl OpenOptions {
    /// Options that need compute and give the emulator all 16 domains.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give the emulator `domains` IOMMU domains.
    pub fn domains(mut self, domains: u32) -> Self {
        self.domains = Some(domains);
        self
    }

    /// Whether the caller submits matmuls (see [`OpenOptions::compute`]).
    pub fn compute(mut self, compute: bool) -> Self {
        self.compute = compute;
        self
    }

    /// Model this chip in the emulator.
    pub fn soc(mut self, soc: crate::Soc) -> Self {
        self.soc = soc;
        self
    }
}

/// Open a device of `kind`.
///
/// The `auto` policy, the only one in ork: where an rknpu NPU is present (its render node
/// opens), use the vendor runtime (`rknn`) if it loads, else the rknpu backend itself if it can
/// do what the caller needs (with `options.compute`, it must compute, which rknpu cannot yet);
/// otherwise open the emulator and say in [`crate::DeviceInfo::name`] why (no NPU found, or
/// found but unusable). `auto` never takes the runtime library on a machine without an NPU (the
/// CI stand-in is such a library). Asking for a backend by name gives its error instead:
/// [`DeviceError::NotFound`] without a board (rknpu) or without a runtime library (rknn),
/// [`DeviceError::Unsupported`] when rknpu is asked to compute.
pub fn open(kind: DeviceKind, options: &OpenOptions) -> Result<Arc<dyn Device>, DeviceError> {
    match kind {
        DeviceKind::Emu => Ok(Arc::new(emulator(options)?)),
        DeviceKind::Rknpu => rknpu(options),
        DeviceKind::Rknn => rknn(options),
        DeviceKind::Auto => {
            let npu = rknpu(&options.clone().compute(false));
            let why = match npu {
                Err(DeviceError::NotFound { .. }) => "auto: no rknpu NPU found".to_string(),
                Err(e) => format!("auto: rknpu not used: {e}"),
                // Buffers only (the probes): the driver itself.
                Ok(npu) if !options.compute => return Ok(npu),
                Ok(_) => match rknn(options) {
                    Ok(dev) => return Ok(dev),
                    Err(e) => format!("auto: NPU found, but the rknn runtime is not usable: {e}"),
                },
            };
            Ok(Arc::new(emulator(options)?.with_note(why)))
        }
    }
}

/// The vendor-runtime backend for `options.soc`.
fn rknn(options: &OpenOptions) -> Result<Arc<dyn Device>, DeviceError> {
    Ok(Arc::new(crate::RknnDevice::open(options)?))
}

fn emulator(options: &OpenOptions) -> Result<EmuDevice, DeviceError> {
    let defaults = EmuConfig::default();
    EmuDevice::with_config(EmuConfig {
        domains: options.domains.unwrap_or(defaults.domains),
        soc: options.soc,
        ..defaults
    })
}

/// The rknpu device, if it opens and can do what `options` needs.
#[cfg(target_os = "linux")]
fn rknpu(options: &OpenOptions) -> Result<Arc<dyn Device>, DeviceError> {
    let dev = crate::RknpuDevice::open()?;
    if options.compute && !dev.info().computes {
        return Err(DeviceError::Unsupported {
            backend: "rknpu",
            what: "matmul submission (buffers work, but register-command generation was never \
                   run on a board); use --device emu",
        });
    }
    Ok(Arc::new(dev))
}

#[cfg(not(target_os = "linux"))]
fn rknpu(_options: &OpenOptions) -> Result<Arc<dyn Device>, DeviceError> {
    Err(DeviceError::NotFound {
        what: "the rknpu backend exists on Linux only".to_string(),
    })
}
