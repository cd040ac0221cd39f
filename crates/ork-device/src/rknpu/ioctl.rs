//! The rknpu backend's system calls: every `ioctl` in one place.

use std::os::fd::BorrowedFd;

use rustix::ioctl::{ioctl, Opcode, Updater};
use zerocopy::{FromBytes, IntoBytes};

use super::uapi::{DrmVersion, IOCTL_DRM_VERSION};

/// Issue a read-write driver ioctl whose argument is a plain-data struct `T` (all bit patterns
/// valid, no pointers), sized exactly as the opcode says.
pub(super) fn call<const OP: Opcode, T: FromBytes + IntoBytes>(
    fd: BorrowedFd<'_>,
    arg: &mut T,
) -> rustix::io::Result<()> {
    // SAFETY: `OP` encodes `size_of::<T>()` and a read-write direction (all opcodes in
    // `uapi` are built with `opcode::read_write::<T>`); `T` is plain data without pointers, so the
    // kernel reading and writing `size_of::<T>()` bytes of `*arg` cannot break any Rust invariant.
    unsafe { ioctl(fd, Updater::<OP, T>::new(arg)) }
}

/// `DRM_IOCTL_VERSION`: the driver's name (e.g. "rknpu"), truncated to 63 bytes.
pub(super) fn driver_name(fd: BorrowedFd<'_>) -> rustix::io::Result<String> {
    let mut name = [0u8; 64];
    let mut v = DrmVersion {
        version_major: 0,
        version_minor: 0,
        version_patchlevel: 0,
        name_len: name.len() - 1,
        name: name.as_mut_ptr(),
        date_len: 0,
        date: std::ptr::null_mut(),
        desc_len: 0,
        desc: std::ptr::null_mut(),
    };
    // SAFETY: the opcode is `_IOWR('d', 0, struct drm_version)`; `name` points to `name_len`
    // writable bytes that outlive the call, `date`/`desc` are null with length 0 (the DRM core
    // copies at most `*_len` bytes to each pointer and writes the true lengths back).
    unsafe { ioctl(fd, Updater::<IOCTL_DRM_VERSION, DrmVersion>::new(&mut v)) }?;
    let n = v.name_len.min(name.len() - 1);
    Ok(String::from_utf8_lossy(&name[..n]).into_owned())
}
