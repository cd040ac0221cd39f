//! Device buffers: RAII owners of one allocation in a domain's window, and borrowed views.

use std::sync::Arc;

use crate::host_map::HostMap;
use crate::{DeviceError, DomainId, MemFlags};

/// Direction of a cache sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SyncDir {
    /// CPU writes → device.
    ToDevice,
    /// Device writes → CPU.
    FromDevice,
}

/// What a backend does when one of its buffers goes away or is synced. Implemented by each
/// backend's shared state; a buffer keeps it alive, so a buffer may outlive the `Device` value.
pub(crate) trait BufferOwner: Send + Sync {
    /// Return the buffer's IOVA range and handle to the backend.
    fn release(&self, buf: &DeviceBuffer);
    /// Make `len` bytes at `offset` coherent in direction `dir`.
    fn sync(
        &self,
        buf: &DeviceBuffer,
        dir: SyncDir,
        offset: u64,
        len: u64,
    ) -> Result<(), DeviceError>;
}

/// One allocation in a domain's IOVA window, mapped into the host.
///
/// Dropping it destroys the allocation and returns its IOVA range to the window. It cannot be
/// freed twice or used after it is freed: both would need the value after `drop` consumed it,
/// which the compiler rejects.
///
/// ```compile_fail
/// # use ork_device::{Device, EmuDevice, MemFlags, DomainId};
/// let dev = EmuDevice::new();
/// let buf = dev.create_buffer(4096, MemFlags::WEIGHT, DomainId(0)).unwrap();
/// drop(buf);
/// let _ = buf.iova(); // use after free: rejected (value moved)
/// ```
///
/// A [`BufferView`] borrows its buffer, so the buffer cannot be freed while a view lives:
///
/// ```compile_fail
/// # use ork_device::{Device, EmuDevice, MemFlags, DomainId};
/// let dev = EmuDevice::new();
/// let buf = dev.create_buffer(8192, MemFlags::WEIGHT, DomainId(0)).unwrap();
/// let view = buf.view(0, 4096).unwrap();
/// drop(buf); // rejected: `view` still borrows `buf`
/// let _ = view.iova();
/// ```
pub struct DeviceBuffer {
    pub(crate) map: HostMap,
    pub(crate) iova: u64,
    pub(crate) size: u64,
    pub(crate) domain: DomainId,
    pub(crate) flags: MemFlags,
    /// Backend handle (emulator: allocation id; rknpu: GEM handle).
    pub(crate) handle: u32,
    /// Backend cookie (rknpu: the opaque `obj_addr` MEM_CREATE returned; emulator: unused).
    pub(crate) obj_addr: u64,
    pub(crate) owner: Arc<dyn BufferOwner>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("size", &self.size)
            .field("domain", &self.domain)
            .field("flags", &self.flags)
            .field("handle", &self.handle)
            .finish()
    }
}

impl DeviceBuffer {
    /// Device address of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Bytes requested at creation (the window holds it page-rounded).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Domain whose window holds it.
    pub fn domain(&self) -> DomainId {
        self.domain
    }
    /// Flags it was created with.
    pub fn flags(&self) -> MemFlags {
        self.flags
    }
    /// Host view of its bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.map.as_slice()[..self.size as usize]
    }
    /// Host view of its bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let n = self.size as usize;
        &mut self.map.as_mut_slice()[..n]
    }
    /// Flush CPU writes so the device sees them (MEM_SYNC TO_DEVICE on cacheable rknpu buffers;
    /// nothing to do on the emulator).
    pub fn sync_to_device(&self) -> Result<(), DeviceError> {
        self.owner.sync(self, SyncDir::ToDevice, 0, self.size)
    }
    /// Invalidate CPU caches so the CPU sees device writes.
    pub fn sync_from_device(&self) -> Result<(), DeviceError> {
        self.owner.sync(self, SyncDir::FromDevice, 0, self.size)
    }
    /// A borrowed sub-range (e.g. one weight inside an arena buffer). Views never free anything.
    pub fn view(&self, offset: u64, len: u64) -> Result<BufferView<'_>, DeviceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(BufferView {
                buf: self,
                offset,
                len,
            }),
            _ => Err(DeviceError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }
    /// The whole buffer as a view.
    pub fn full_view(&self) -> BufferView<'_> {
        BufferView {
            buf: self,
            offset: 0,
            len: self.size,
        }
    }
    /// Whether `owner` is this buffer's backend.
    pub(crate) fn owned_by(&self, owner: &Arc<dyn BufferOwner>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.owner), Arc::as_ptr(owner))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.owner.release(self);
        // `map` is unmapped when the fields drop, right after this.
    }
}

/// A borrowed range of a [`DeviceBuffer`]. It has no `Drop`: it frees nothing, and the borrow
/// keeps the buffer alive while the view exists.
#[derive(Clone, Copy, Debug)]
pub struct BufferView<'a> {
    buf: &'a DeviceBuffer,
    offset: u64,
    len: u64,
}

impl<'a> BufferView<'a> {
    /// Device address of the view's first byte.
    pub fn iova(&self) -> u64 {
        self.buf.iova + self.offset
    }
    /// Offset inside the buffer.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Domain of the underlying buffer.
    pub fn domain(&self) -> DomainId {
        self.buf.domain
    }
    /// The buffer this view borrows.
    pub fn buffer(&self) -> &'a DeviceBuffer {
        self.buf
    }
    /// Host view of the range.
    pub fn as_slice(&self) -> &'a [u8] {
        &self.buf.as_slice()[self.offset as usize..(self.offset + self.len) as usize]
    }
}
