//! Device buffers: RAII owners of one allocation in a domain's window, the backend-owned record
//! behind each ([`BackendBuffer`]), and borrowed views.

use std::any::Any;

use crate::{DeviceError, DomainId};

/// What a buffer is for. Backends map an intent to their own allocation flags (rknpu: the
/// `RKNPU_MEM_*` bits in `rknpu/flags.rs`; see `docs/device.md`), so callers never name a
/// vendor's flags. Deliberately not `#[non_exhaustive]`: a new intent must make every backend
/// choose its flags (a compile error in its `match`), not fall into a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferIntent {
    /// A packed weight (B operand): written once by the CPU, read by the device many times.
    Weight,
    /// Activations (A operand): written by the CPU before each task.
    Activation,
    /// Task outputs (C operand): written by the device, read by the CPU.
    Output,
    /// Task descriptors / command streams the driver itself reads.
    Task,
    /// A plain DMA allocation as the window probes make it (rknpu: size-aligned IOVAs, the
    /// allocation path of ork's board measurement).
    Probe,
}

impl BufferIntent {
    /// Every intent, for tests and probes that cover them all.
    pub const ALL: [BufferIntent; 5] = [
        BufferIntent::Weight,
        BufferIntent::Activation,
        BufferIntent::Output,
        BufferIntent::Task,
        BufferIntent::Probe,
    ];
}

/// Direction of a cache sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncDir {
    /// CPU writes → device.
    ToDevice,
    /// Device writes → CPU.
    FromDevice,
}

/// A backend's own record of one allocation: its host mapping and whatever the backend needs to
/// address, sync and free it (emulator: the window range; rknpu: the GEM handle and `obj_addr`;
/// a vendor-runtime backend: its memory object). A [`DeviceBuffer`] owns it boxed and drops it
/// exactly once, when the buffer is dropped.
///
/// # Contract
/// * [`BackendBuffer::host`] and [`BackendBuffer::host_mut`] return the same bytes, at least
///   the buffer's size long, for the record's whole life ([`DeviceBuffer::new`] checks the
///   length once).
/// * Dropping the record frees the allocation and returns its IOVA range to the window. It may
///   outlive the [`crate::Device`] value that created it, so the record must keep whatever
///   shared state freeing needs alive (an `Arc` of the backend's state).
/// * Any per-shape binding the backend made for this allocation (see
///   [`crate::Device::prepare_weight`]) is released with the record.
///
/// A backend finds its own record in an operand with [`DeviceBuffer::backend`]; a buffer whose
/// record is of another type or of another device instance is a
/// [`DeviceError::ForeignBuffer`].
pub trait BackendBuffer: Any + Send + Sync {
    /// The host mapping of the allocation.
    fn host(&self) -> &[u8];
    /// The host mapping of the allocation, writable.
    fn host_mut(&mut self) -> &mut [u8];
    /// Make `len` bytes at `offset` coherent in direction `dir` (nothing to do where host
    /// memory is device memory).
    fn sync(&self, dir: SyncDir, offset: u64, len: u64) -> Result<(), DeviceError>;
    /// The caller is about to write the whole allocation (a weight being filled): a backend may
    /// map its pages in at once. A hint only; the default does nothing.
    fn will_write_all(&mut self) {}
}

/// One allocation in a domain's IOVA window, mapped into the host.
///
/// Dropping it destroys the allocation and returns its IOVA range to the window. It cannot be
/// freed twice or used after it is freed: both would need the value after `drop` consumed it,
/// which the compiler rejects.
///
/// ```compile_fail
/// # use ork_device::{BufferIntent, Device, EmuDevice, DomainId};
/// let dev = EmuDevice::new();
/// let buf = dev.create_buffer(4096, BufferIntent::Weight, DomainId(0)).unwrap();
/// drop(buf);
/// let _ = buf.iova(); // use after free: rejected (value moved)
/// ```
///
/// A [`BufferView`] borrows its buffer, so the buffer cannot be freed while a view lives:
///
/// ```compile_fail
/// # use ork_device::{BufferIntent, Device, EmuDevice, DomainId};
/// let dev = EmuDevice::new();
/// let buf = dev.create_buffer(8192, BufferIntent::Weight, DomainId(0)).unwrap();
/// let view = buf.view(0, 4096).unwrap();
/// drop(buf); // rejected: `view` still borrows `buf`
/// let _ = view.iova();
/// ```
pub struct DeviceBuffer {
    iova: u64,
    size: u64,
    domain: DomainId,
    intent: BufferIntent,
    backend: Box<dyn BackendBuffer>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("size", &self.size)
            .field("domain", &self.domain)
            .field("intent", &self.intent)
            .finish_non_exhaustive()
    }
}

impl DeviceBuffer {
    /// Wrap a backend's record of a fresh allocation of `size` bytes at `iova` in `domain`.
    /// Called by backends from [`crate::Device::create_buffer`]; fails with
    /// [`DeviceError::HostMapTooShort`] if the record maps fewer than `size` bytes (the record
    /// is dropped, which frees the allocation).
    pub fn new(
        iova: u64,
        size: u64,
        domain: DomainId,
        intent: BufferIntent,
        backend: Box<dyn BackendBuffer>,
    ) -> Result<Self, DeviceError> {
        let mapped = backend.host().len() as u64;
        if mapped < size {
            return Err(DeviceError::HostMapTooShort { size, mapped });
        }
        Ok(DeviceBuffer {
            iova,
            size,
            domain,
            intent,
            backend,
        })
    }

    /// Device address of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Bytes requested at creation (the window holds [`crate::Device::footprint`] of it).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Domain whose window holds it.
    pub fn domain(&self) -> DomainId {
        self.domain
    }
    /// What it was created for.
    pub fn intent(&self) -> BufferIntent {
        self.intent
    }
    /// The backend's record of this buffer, if it is a `T` (a backend asks for its own type; any
    /// other backend's buffer gives `None`).
    pub fn backend<T: BackendBuffer>(&self) -> Option<&T> {
        let any: &dyn Any = self.backend.as_ref();
        any.downcast_ref::<T>()
    }
    /// Host view of its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // `new` checked that the record maps at least `size` bytes.
        &self.backend.host()[..self.size as usize]
    }
    /// Host view of its bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let n = self.size as usize;
        &mut self.backend.host_mut()[..n]
    }
    /// Tell the backend the whole buffer is about to be written (a weight being filled), so it
    /// may map its pages in at once instead of faulting them in one by one
    /// ([`BackendBuffer::will_write_all`]; the emulator does, the board backends need not).
    pub fn will_write_all(&mut self) {
        self.backend.will_write_all();
    }
    /// Flush CPU writes so the device sees them (MEM_SYNC TO_DEVICE on cacheable rknpu buffers;
    /// nothing to do on the emulator).
    pub fn sync_to_device(&self) -> Result<(), DeviceError> {
        self.backend.sync(SyncDir::ToDevice, 0, self.size)
    }
    /// Invalidate CPU caches so the CPU sees device writes.
    pub fn sync_from_device(&self) -> Result<(), DeviceError> {
        self.backend.sync(SyncDir::FromDevice, 0, self.size)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// A backend record over a `Vec`, counting its drops (what another crate's backend writes).
    struct VecRecord(Vec<u8>, Arc<AtomicU32>);

    impl Drop for VecRecord {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl BackendBuffer for VecRecord {
        fn host(&self) -> &[u8] {
            &self.0
        }
        fn host_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
        fn sync(&self, _: SyncDir, _: u64, _: u64) -> Result<(), DeviceError> {
            Ok(())
        }
    }

    struct OtherRecord;

    impl BackendBuffer for OtherRecord {
        fn host(&self) -> &[u8] {
            &[]
        }
        fn host_mut(&mut self) -> &mut [u8] {
            &mut []
        }
        fn sync(&self, _: SyncDir, _: u64, _: u64) -> Result<(), DeviceError> {
            Ok(())
        }
    }

    #[test]
    fn an_outside_backend_record_is_owned_found_and_freed_once() {
        let drops = Arc::new(AtomicU32::new(0));
        let rec = |n| Box::new(VecRecord(vec![0; n], Arc::clone(&drops)));
        let r = DeviceBuffer::new(0x1000, 11, DomainId(0), BufferIntent::Output, rec(10));
        assert!(matches!(
            r,
            Err(DeviceError::HostMapTooShort {
                size: 11,
                mapped: 10
            })
        ));
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the rejected record is freed"
        );
        let mut b =
            DeviceBuffer::new(0x1000, 10, DomainId(2), BufferIntent::Output, rec(16)).unwrap();
        b.as_mut_slice()[9] = 5;
        assert_eq!((b.as_slice().len(), b.as_slice()[9]), (10, 5));
        assert!(b.backend::<VecRecord>().is_some());
        assert!(b.backend::<OtherRecord>().is_none());
        drop(b);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    }
}
