//! Probes of a device's address windows, as library functions (the CLI prints them).

use crate::{BufferIntent, Device, DeviceError, DomainId};

/// What the DMA probe does with each buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaProbeMode {
    /// Create only.
    Create,
    /// Create and write through the host mapping (first and last byte).
    CreateMmap,
}

/// Result of [`probe_dma`].
#[derive(Debug)]
pub struct DmaProbeReport {
    /// Buffers created before the failure.
    pub count_ok: u64,
    /// Their total size in bytes.
    pub bytes_ok: u64,
    /// Buffers created in each probed domain.
    pub per_domain: Vec<u64>,
    /// 0-based index (over all domains) of the buffer that failed, if one did.
    pub failed_at_index: Option<u64>,
    /// The failure (`WindowFull` = the driver's errno 14).
    pub error: Option<DeviceError>,
}

/// Allocate `mb`-MiB [`BufferIntent::Probe`] buffers (rknpu: `NON_CONTIGUOUS | CACHEABLE`,
/// size-aligned like a plain DMA allocation) in domain 0 until its window is full, then in domain 1, … up to `domains`; keep
/// them all alive, then free them. Reproduces ork's board probe: one domain fails at index 63
/// after 4.23 GB with 64 MB buffers.
pub fn probe_dma(
    dev: &dyn Device,
    mb: u64,
    mode: DmaProbeMode,
    domains: u32,
) -> Result<DmaProbeReport, DeviceError> {
    let have = dev.info().domains;
    if domains == 0 || domains > have {
        return Err(DeviceError::UnknownDomain {
            domain: DomainId(domains.saturating_sub(1)),
            domains: have,
        });
    }
    let size = mb
        .checked_mul(1 << 20)
        .filter(|&s| s > 0)
        .ok_or(DeviceError::ZeroSize {
            domain: DomainId(0),
        })?;
    let mut held = Vec::new();
    let mut per_domain = vec![0u64; domains as usize];
    let mut failure = None;
    'domains: for d in 0..domains {
        loop {
            match dev.create_buffer(size, BufferIntent::Probe, DomainId(d)) {
                Ok(mut b) => {
                    if mode == DmaProbeMode::CreateMmap {
                        let s = b.as_mut_slice();
                        let last = s.len() - 1;
                        s[0] = 0xA5;
                        s[last] = 0x5A;
                    }
                    per_domain[d as usize] += 1;
                    held.push(b);
                }
                Err(DeviceError::WindowFull { .. }) if d + 1 < domains => continue 'domains,
                Err(e) => {
                    failure = Some(e);
                    break 'domains;
                }
            }
        }
    }
    let count_ok = held.len() as u64;
    Ok(DmaProbeReport {
        count_ok,
        bytes_ok: count_ok * size,
        per_domain,
        failed_at_index: failure.as_ref().map(|_| count_ok),
        error: failure,
    })
}

/// Result of [`probe_stream`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamProbeReport {
    /// Bytes that went through the window (created, filled, freed).
    pub bytes_cycled: u64,
    /// Buffers cycled.
    pub buffers: u64,
    /// Highest resident total seen during the probe.
    pub max_resident: u64,
    /// Resident bytes left over at the end beyond what was resident at the start (0 = no leak).
    pub leaked: u64,
}

/// Cycle `total_mb` MiB through domain 0 in `mb`-MiB weight-sized buffers: create (weight intent),
/// fill with a real copy from a host buffer, sync, free. Residency must return to
/// where it started.
pub fn probe_stream(
    dev: &dyn Device,
    total_mb: u64,
    mb: u64,
) -> Result<StreamProbeReport, DeviceError> {
    let size = mb
        .checked_mul(1 << 20)
        .filter(|&s| s > 0)
        .ok_or(DeviceError::ZeroSize {
            domain: DomainId(0),
        })?;
    let start = dev.stats().resident_total();
    let src: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let mut cycled = 0u64;
    let mut buffers = 0u64;
    let mut max_resident = start;
    while cycled < total_mb.saturating_mul(1 << 20) {
        let mut b = dev.create_buffer(size, BufferIntent::Weight, DomainId(0))?;
        b.as_mut_slice().copy_from_slice(&src);
        b.sync_to_device()?;
        max_resident = max_resident.max(dev.stats().resident_total());
        drop(b);
        cycled += size;
        buffers += 1;
    }
    let end = dev.stats().resident_total();
    Ok(StreamProbeReport {
        bytes_cycled: cycled,
        buffers,
        max_resident,
        leaked: end.saturating_sub(start),
    })
}
