//! The vendor `rknpu` DRM backend (RK3588 boards running Rockchip's kernel driver).
//!
//! [`flags`] (which `RKNPU_MEM_*` flags each [`crate::BufferIntent`] gets) is compiled everywhere:
//! the emulator models the driver's IOVA alignment from the same flags. The device itself
//! (`device.rs`, the ioctls and the UAPI structs) is Linux only.

pub(crate) mod flags;

#[cfg(target_os = "linux")]
mod device;
#[cfg(target_os = "linux")]
mod ioctl;
#[cfg(target_os = "linux")]
pub(crate) mod uapi;

#[cfg(target_os = "linux")]
pub use device::RknpuDevice;
