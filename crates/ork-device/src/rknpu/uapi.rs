//! The vendor `rknpu` DRM UAPI (driver 0.9.8 `rknpu_ioctl.h`, see `docs/device.md`): `#[repr(C)]` structs
//! whose sizes are pinned at compile time and whose field offsets and request codes are unit-tested
//! against the reference table.

use rustix::ioctl::{opcode, Opcode};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `DRM_COMMAND_BASE`: driver ioctls start here.
pub(crate) const DRM_COMMAND_BASE: u8 = 0x40;

/// `struct rknpu_action`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct Action {
    pub flags: u32,
    pub value: u32,
}

/// `struct rknpu_mem_create` (0.9.6+, 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MemCreate {
    pub handle: u32,
    pub flags: u32,
    pub size: u64,
    pub obj_addr: u64,
    pub dma_addr: u64,
    pub sram_size: u64,
    pub iommu_domain_id: i32,
    pub core_mask: u32,
}

/// `struct rknpu_mem_create` before 0.9.6 (40 bytes, no domain / core mask).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MemCreateV0 {
    pub handle: u32,
    pub flags: u32,
    pub size: u64,
    pub obj_addr: u64,
    pub dma_addr: u64,
    pub sram_size: u64,
}

/// `struct rknpu_mem_map`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MemMap {
    pub handle: u32,
    pub reserved: u32,
    pub offset: u64,
}

/// `struct rknpu_mem_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MemDestroy {
    pub handle: u32,
    pub reserved: u32,
    pub obj_addr: u64,
}

/// `struct rknpu_mem_sync`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct MemSync {
    pub flags: u32,
    pub reserved: u32,
    pub obj_addr: u64,
    pub offset: u64,
    pub size: u64,
}

/// `struct rknpu_subcore_task`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct SubcoreTask {
    pub task_start: u32,
    pub task_number: u32,
}

/// `struct rknpu_submit` (104 bytes). Declared for its layout; submission is not implemented.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub(crate) struct Submit {
    pub flags: u32,
    pub timeout: u32,
    pub task_start: u32,
    pub task_number: u32,
    pub task_counter: u32,
    pub priority: i32,
    pub task_obj_addr: u64,
    pub iommu_domain_id: u32,
    pub reserved: u32,
    pub task_base_addr: u64,
    pub hw_elapse_time: i64,
    pub core_mask: u32,
    pub fence_fd: i32,
    pub subcore_task: [SubcoreTask; 5],
}

/// DRM core `struct drm_version` (64 bytes on 64-bit hosts).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct DrmVersion {
    pub version_major: i32,
    pub version_minor: i32,
    pub version_patchlevel: i32,
    pub name_len: usize,
    pub name: *mut u8,
    pub date_len: usize,
    pub date: *mut u8,
    pub desc_len: usize,
    pub desc: *mut u8,
}

const _: () = assert!(size_of::<Action>() == 8);
const _: () = assert!(size_of::<MemCreate>() == 48);
const _: () = assert!(size_of::<MemCreateV0>() == 40);
const _: () = assert!(size_of::<MemMap>() == 16);
const _: () = assert!(size_of::<MemDestroy>() == 16);
const _: () = assert!(size_of::<MemSync>() == 32);
const _: () = assert!(size_of::<Submit>() == 104);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<DrmVersion>() == 64);

/// `DRM_IOWR(DRM_COMMAND_BASE + nr, T)`.
const fn iowr<T>(nr: u8) -> Opcode {
    opcode::read_write::<T>(b'd', DRM_COMMAND_BASE + nr)
}

pub(crate) const IOCTL_ACTION: Opcode = iowr::<Action>(0x00);
/// Not issued yet (submission is not implemented); pinned by the request-code test.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const IOCTL_SUBMIT: Opcode = iowr::<Submit>(0x01);
pub(crate) const IOCTL_MEM_CREATE: Opcode = iowr::<MemCreate>(0x02);
pub(crate) const IOCTL_MEM_CREATE_V0: Opcode = iowr::<MemCreateV0>(0x02);
pub(crate) const IOCTL_MEM_MAP: Opcode = iowr::<MemMap>(0x03);
pub(crate) const IOCTL_MEM_DESTROY: Opcode = iowr::<MemDestroy>(0x04);
pub(crate) const IOCTL_MEM_SYNC: Opcode = iowr::<MemSync>(0x05);
/// `DRM_IOCTL_VERSION = DRM_IOWR(0x00, struct drm_version)`.
pub(crate) const IOCTL_DRM_VERSION: Opcode = opcode::read_write::<DrmVersion>(b'd', 0x00);

/// Actions (`rknpu_action.flags`).
pub(crate) const ACT_GET_DRV_VERSION: u32 = 1;
pub(crate) const ACT_GET_IOMMU_DOMAIN_ID: u32 = 24;
pub(crate) const ACT_SET_IOMMU_DOMAIN_ID: u32 = 25;

/// `rknpu_mem_sync.flags`.
pub(crate) const SYNC_TO_DEVICE: u32 = 1;
pub(crate) const SYNC_FROM_DEVICE: u32 = 2;

/// Driver version code as the driver reports it (`major·10000 + minor·100 + patch`,
/// `RKNPU_GET_DRV_VERSION_CODE` in the vendor's `rknpu_drv.h`).
pub(crate) const fn version_code(major: u32, minor: u32, patch: u32) -> u32 {
    major * 10000 + minor * 100 + patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn request_codes_match_reference() {
        assert_eq!(IOCTL_ACTION as u64, 0xC008_6440);
        assert_eq!(IOCTL_SUBMIT as u64, 0xC068_6441);
        assert_eq!(IOCTL_MEM_CREATE as u64, 0xC030_6442);
        assert_eq!(IOCTL_MEM_CREATE_V0 as u64, 0xC028_6442);
        assert_eq!(IOCTL_MEM_MAP as u64, 0xC010_6443);
        assert_eq!(IOCTL_MEM_DESTROY as u64, 0xC010_6444);
        assert_eq!(IOCTL_MEM_SYNC as u64, 0xC020_6445);
        #[cfg(target_pointer_width = "64")]
        assert_eq!(IOCTL_DRM_VERSION as u64, 0xC040_6400);
    }

    #[test]
    fn field_offsets_match_reference() {
        assert_eq!(
            (offset_of!(Action, flags), offset_of!(Action, value)),
            (0, 4)
        );
        assert_eq!(
            [
                offset_of!(MemCreate, handle),
                offset_of!(MemCreate, flags),
                offset_of!(MemCreate, size),
                offset_of!(MemCreate, obj_addr),
                offset_of!(MemCreate, dma_addr),
                offset_of!(MemCreate, sram_size),
                offset_of!(MemCreate, iommu_domain_id),
                offset_of!(MemCreate, core_mask),
            ],
            [0, 4, 8, 16, 24, 32, 40, 44]
        );
        assert_eq!(offset_of!(MemCreateV0, sram_size), 32);
        assert_eq!(
            [
                offset_of!(MemMap, handle),
                offset_of!(MemMap, reserved),
                offset_of!(MemMap, offset)
            ],
            [0, 4, 8]
        );
        assert_eq!(
            [
                offset_of!(MemDestroy, handle),
                offset_of!(MemDestroy, reserved),
                offset_of!(MemDestroy, obj_addr)
            ],
            [0, 4, 8]
        );
        assert_eq!(
            [
                offset_of!(MemSync, flags),
                offset_of!(MemSync, reserved),
                offset_of!(MemSync, obj_addr),
                offset_of!(MemSync, offset),
                offset_of!(MemSync, size)
            ],
            [0, 4, 8, 16, 24]
        );
        assert_eq!(
            [
                offset_of!(Submit, flags),
                offset_of!(Submit, timeout),
                offset_of!(Submit, task_start),
                offset_of!(Submit, task_number),
                offset_of!(Submit, task_counter),
                offset_of!(Submit, priority),
                offset_of!(Submit, task_obj_addr),
                offset_of!(Submit, iommu_domain_id),
                offset_of!(Submit, reserved),
                offset_of!(Submit, task_base_addr),
                offset_of!(Submit, hw_elapse_time),
                offset_of!(Submit, core_mask),
                offset_of!(Submit, fence_fd),
                offset_of!(Submit, subcore_task),
            ],
            [0, 4, 8, 12, 16, 20, 24, 32, 36, 40, 48, 56, 60, 64]
        );
        #[cfg(target_pointer_width = "64")]
        assert_eq!(
            [
                offset_of!(DrmVersion, name_len),
                offset_of!(DrmVersion, name),
                offset_of!(DrmVersion, desc)
            ],
            [16, 24, 56]
        );
    }

    #[test]
    fn version_codes() {
        assert_eq!(version_code(0, 9, 8), 908);
        assert!(version_code(0, 9, 6) > version_code(0, 9, 5));
    }
}
