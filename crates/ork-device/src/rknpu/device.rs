//! The rknpu device: the DRM render node, its buffers and domains.
//!
//! Implemented: finding the render node whose DRM driver is "rknpu", reading the driver version,
//! buffer create (48-byte MEM_CREATE on 0.9.6+, 40-byte before), host mapping through MEM_MAP's
//! fake offset, MEM_SYNC, MEM_DESTROY, IOMMU domain ids. Not implemented: task submission (it
//! needs register-command generation for the matmul unit); [`Device::matmul`] returns
//! [`DeviceError::Unsupported`]. Nothing here has run on a board: see `docs/device.md`.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::flags::MemFlags;
use super::ioctl;
use super::uapi::*;
use crate::buffer::{BackendBuffer, SyncDir};
use crate::host_map::HostMap;
use crate::window::{footprint, WINDOW_BYTES};
use crate::{
    BufferIntent, Device, DeviceBuffer, DeviceError, DeviceInfo, DeviceStats, DomainId,
    MatmulStats, MatmulTask, MAX_DOMAINS,
};

struct Counters {
    buffers_live: u64,
    resident: Vec<u64>,
    peak: u64,
    switches: u64,
    attached: u32,
}

struct Shared {
    fd: OwnedFd,
    counters: Mutex<Counters>,
}

fn lock(m: &Mutex<Counters>) -> std::sync::MutexGuard<'_, Counters> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// rknpu's record of one buffer: the GEM object (handle and the opaque `obj_addr` MEM_CREATE
/// returned), its host mapping, and the device's shared state (so a buffer may outlive the
/// `RknpuDevice`).
struct RknpuBuffer {
    map: HostMap,
    shared: Arc<Shared>,
    handle: u32,
    obj_addr: u64,
    flags: MemFlags,
    domain: DomainId,
    size: u64,
}

impl Drop for RknpuBuffer {
    fn drop(&mut self) {
        let mut d = MemDestroy {
            handle: self.handle,
            reserved: 0,
            obj_addr: self.obj_addr,
        };
        // A failing MEM_DESTROY cannot be reported from `drop`; the driver frees the object when
        // the fd closes in any case.
        let _ = ioctl::call::<IOCTL_MEM_DESTROY, _>(self.shared.fd.as_fd(), &mut d);
        let mut c = lock(&self.shared.counters);
        c.buffers_live -= 1;
        if let Some(r) = c.resident.get_mut(self.domain.0 as usize) {
            *r -= footprint(self.size);
        }
        // `map` is unmapped when the fields drop, right after this.
    }
}

impl BackendBuffer for RknpuBuffer {
    fn host(&self) -> &[u8] {
        self.map.as_slice()
    }

    fn host_mut(&mut self) -> &mut [u8] {
        self.map.as_mut_slice()
    }

    fn sync(&self, dir: SyncDir, offset: u64, len: u64) -> Result<(), DeviceError> {
        if !self.flags.contains(MemFlags::CACHEABLE) {
            return Ok(()); // MEM_SYNC is only valid (and only needed) on cacheable buffers.
        }
        let flags = match dir {
            SyncDir::ToDevice => SYNC_TO_DEVICE,
            SyncDir::FromDevice => SYNC_FROM_DEVICE,
        };
        let mut s = MemSync {
            flags,
            reserved: 0,
            obj_addr: self.obj_addr,
            offset,
            size: len,
        };
        ioctl::call::<IOCTL_MEM_SYNC, _>(self.shared.fd.as_fd(), &mut s).map_err(|e| {
            DeviceError::Driver {
                op: "RKNPU_MEM_SYNC",
                source: e.into(),
            }
        })
    }
}

/// An RK3588 NPU through the vendor `rknpu` DRM driver.
pub struct RknpuDevice {
    shared: Arc<Shared>,
    path: PathBuf,
    version: u32,
}

impl std::fmt::Debug for RknpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RknpuDevice")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl RknpuDevice {
    /// Open the first render node under `/dev/dri` whose DRM driver is "rknpu".
    pub fn open() -> Result<Self, DeviceError> {
        Self::open_in(Path::new("/dev/dri"))
    }

    /// Open the first "rknpu" render node in `dir` (for tests and unusual layouts).
    pub fn open_in(dir: &Path) -> Result<Self, DeviceError> {
        let entries = std::fs::read_dir(dir).map_err(|e| DeviceError::NotFound {
            what: format!(
                "no rknpu device: cannot read {} ({e}); this machine has no RK3588 NPU driver",
                dir.display()
            ),
        })?;
        let mut nodes: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("renderD"))
            })
            .collect();
        nodes.sort();
        let mut seen = Vec::new();
        for node in nodes {
            let file = match OpenOptions::new().read(true).write(true).open(&node) {
                Ok(f) => f,
                Err(e) => {
                    seen.push(format!("{}: {e}", node.display()));
                    continue;
                }
            };
            let fd = OwnedFd::from(file);
            match ioctl::driver_name(fd.as_fd()) {
                Ok(name) if name == "rknpu" => return Self::from_fd(fd, node),
                Ok(name) => seen.push(format!("{}: driver {name}", node.display())),
                Err(e) => seen.push(format!("{}: DRM_IOCTL_VERSION {e}", node.display())),
            }
        }
        Err(DeviceError::NotFound {
            what: format!(
                "no render node with driver \"rknpu\" in {} (checked: {})",
                dir.display(),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join("; ")
                }
            ),
        })
    }

    fn from_fd(fd: OwnedFd, path: PathBuf) -> Result<Self, DeviceError> {
        let mut a = Action {
            flags: ACT_GET_DRV_VERSION,
            value: 0,
        };
        ioctl::call::<IOCTL_ACTION, _>(fd.as_fd(), &mut a).map_err(|e| DeviceError::Driver {
            op: "RKNPU_ACTION(GET_DRV_VERSION)",
            source: e.into(),
        })?;
        let version = a.value;
        let domains = if version >= version_code(0, 9, 6) {
            MAX_DOMAINS
        } else {
            1
        };
        let shared = Arc::new(Shared {
            fd,
            counters: Mutex::new(Counters {
                buffers_live: 0,
                resident: vec![0; domains as usize],
                peak: 0,
                switches: 0,
                attached: 0,
            }),
        });
        Ok(RknpuDevice {
            shared,
            path,
            version,
        })
    }

    /// Driver version code (`major·10000 + minor·100 + patch`).
    pub fn driver_version(&self) -> u32 {
        self.version
    }

    fn domains(&self) -> u32 {
        if self.version >= version_code(0, 9, 6) {
            MAX_DOMAINS
        } else {
            1
        }
    }

    /// Refuse a buffer of `size` bytes in `domain` that the driver could never create: an
    /// unknown domain, no bytes, more than a window holds.
    fn check_request(&self, size: u64, domain: DomainId) -> Result<(), DeviceError> {
        if domain.0 >= self.domains() {
            return Err(DeviceError::UnknownDomain {
                domain,
                domains: self.domains(),
            });
        }
        if size == 0 {
            return Err(DeviceError::ZeroSize { domain });
        }
        if size > WINDOW_BYTES - crate::window::PAGE_BYTES {
            return Err(DeviceError::Oversize {
                requested: size,
                usable: WINDOW_BYTES - crate::window::PAGE_BYTES,
            });
        }
        Ok(())
    }

    /// Create a GEM object of `size` bytes in `domain` (MEM_CREATE, the pre-0.9.6 layout on
    /// older drivers); its (handle, object address, IOVA). A full window is
    /// [`DeviceError::WindowFull`].
    fn mem_create(
        &self,
        size: u64,
        flags: MemFlags,
        domain: DomainId,
    ) -> Result<(u32, u64, u64), DeviceError> {
        let fd = self.shared.fd.as_fd();
        let created = if self.version >= version_code(0, 9, 6) {
            let mut c = MemCreate {
                flags: flags.0,
                size,
                iommu_domain_id: domain.0 as i32,
                ..Default::default()
            };
            ioctl::call::<IOCTL_MEM_CREATE, _>(fd, &mut c)
                .map(|()| (c.handle, c.obj_addr, c.dma_addr))
        } else {
            let mut c = MemCreateV0 {
                flags: flags.0,
                size,
                ..Default::default()
            };
            ioctl::call::<IOCTL_MEM_CREATE_V0, _>(fd, &mut c)
                .map(|()| (c.handle, c.obj_addr, c.dma_addr))
        };
        match created {
            Ok(v) => Ok(v),
            Err(e) if e == rustix::io::Errno::FAULT => {
                // errno 14: the domain's window has no room (docs/device.md).
                let resident = lock(&self.shared.counters).resident[domain.0 as usize];
                Err(DeviceError::WindowFull {
                    domain,
                    requested: footprint(size),
                    align: 0,
                    resident,
                    largest_free: 0,
                })
            }
            Err(e) => Err(DeviceError::Driver {
                op: "RKNPU_MEM_CREATE",
                source: e.into(),
            }),
        }
    }

    /// Map the GEM object `handle` of `size` bytes into this process (MEM_MAP, then mmap of
    /// the offset it returns); on failure the object is destroyed.
    fn map_mem(&self, handle: u32, obj_addr: u64, size: u64) -> Result<HostMap, DeviceError> {
        let fd = self.shared.fd.as_fd();
        let destroy = || {
            let mut d = MemDestroy {
                handle,
                reserved: 0,
                obj_addr,
            };
            let _ = ioctl::call::<IOCTL_MEM_DESTROY, _>(fd, &mut d);
        };
        let mut m = MemMap {
            handle,
            ..Default::default()
        };
        if let Err(e) = ioctl::call::<IOCTL_MEM_MAP, _>(fd, &mut m) {
            destroy();
            return Err(DeviceError::Driver {
                op: "RKNPU_MEM_MAP",
                source: e.into(),
            });
        }
        let len = usize::try_from(footprint(size)).unwrap_or(usize::MAX);
        // SAFETY: `m.offset` is the fake mmap offset the driver just returned for the live GEM
        // object `handle` of `size` bytes (≥ `len` after page rounding, as the driver allocates
        // whole pages); the mapping is owned by the new `DeviceBuffer` only.
        match unsafe { HostMap::shared_fd(fd, m.offset, len) } {
            Ok(map) => Ok(map),
            Err(source) => {
                destroy();
                Err(DeviceError::HostMemory { size, source })
            }
        }
    }

    /// Attach `domain` to the NPU (ACTION SET_IOMMU_DOMAIN_ID; the driver drains the current
    /// domain first).
    pub fn set_domain(&self, domain: DomainId) -> Result<(), DeviceError> {
        if domain.0 >= self.domains() {
            return Err(DeviceError::UnknownDomain {
                domain,
                domains: self.domains(),
            });
        }
        let mut a = Action {
            flags: ACT_SET_IOMMU_DOMAIN_ID,
            value: domain.0,
        };
        ioctl::call::<IOCTL_ACTION, _>(self.shared.fd.as_fd(), &mut a).map_err(|e| {
            DeviceError::Driver {
                op: "RKNPU_ACTION(SET_IOMMU_DOMAIN_ID)",
                source: e.into(),
            }
        })?;
        let mut c = lock(&self.shared.counters);
        if c.attached != domain.0 {
            c.switches += 1;
            c.attached = domain.0;
        }
        Ok(())
    }

    /// Domain the driver has attached now (ACTION GET_IOMMU_DOMAIN_ID).
    pub fn current_domain(&self) -> Result<DomainId, DeviceError> {
        let mut a = Action {
            flags: ACT_GET_IOMMU_DOMAIN_ID,
            value: 0,
        };
        ioctl::call::<IOCTL_ACTION, _>(self.shared.fd.as_fd(), &mut a).map_err(|e| {
            DeviceError::Driver {
                op: "RKNPU_ACTION(GET_IOMMU_DOMAIN_ID)",
                source: e.into(),
            }
        })?;
        Ok(DomainId(a.value))
    }
}

impl Device for RknpuDevice {
    fn info(&self) -> DeviceInfo {
        let v = self.version;
        DeviceInfo {
            name: format!("rknpu ({})", self.path.display()),
            cores: 3,
            domains: self.domains(),
            window_bytes: WINDOW_BYTES,
            driver_version: Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)),
            computes: false,
            // The chip is not identified yet (and nothing is submitted to it).
            soc: None,
        }
    }

    fn create_buffer(
        &self,
        size: u64,
        intent: BufferIntent,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError> {
        let flags = MemFlags::for_intent(intent);
        self.check_request(size, domain)?;
        let (handle, obj_addr, iova) = self.mem_create(size, flags, domain)?;
        let map = self.map_mem(handle, obj_addr, size)?;
        {
            let mut c = lock(&self.shared.counters);
            c.buffers_live += 1;
            c.resident[domain.0 as usize] += footprint(size);
            let total: u64 = c.resident.iter().sum();
            c.peak = c.peak.max(total);
        }
        let record = RknpuBuffer {
            map,
            shared: Arc::clone(&self.shared),
            handle,
            obj_addr,
            flags,
            domain,
            size,
        };
        DeviceBuffer::new(iova, size, domain, intent, Box::new(record))
    }

    fn footprint(&self, size: u64) -> u64 {
        footprint(size)
    }

    fn matmul(&self, _task: &MatmulTask<'_>, _out: &mut [f32]) -> Result<MatmulStats, DeviceError> {
        Err(DeviceError::Unsupported {
            backend: "rknpu",
            what: "matmul submission (register-command generation for RKNPU_SUBMIT) is not implemented; use the emulator",
        })
    }

    fn stats(&self) -> DeviceStats {
        let c = lock(&self.shared.counters);
        DeviceStats {
            buffers_live: c.buffers_live,
            resident_per_domain: c.resident.clone(),
            peak_resident: c.peak,
            domain_switches: c.switches,
            tasks: 0,
            attached: DomainId(c.attached),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_directory_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("dri");
        assert!(matches!(
            RknpuDevice::open_in(&missing),
            Err(DeviceError::NotFound { .. })
        ));
    }

    #[test]
    fn non_drm_nodes_are_skipped() {
        // A regular file named like a render node: the version ioctl fails (ENOTTY) and the node
        // is skipped, ending in NotFound.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("renderD128"), b"").unwrap();
        assert!(matches!(
            RknpuDevice::open_in(dir.path()),
            Err(DeviceError::NotFound { .. })
        ));
    }
}
