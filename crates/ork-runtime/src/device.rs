//! Opening the device backend.

use std::sync::Arc;

use ork_device::{Device, DeviceKind};

use crate::RuntimeError;

/// Open the device backend `kind` with `domains` IOMMU domains, through the device layer's one
/// [`ork_device::open`] (its `auto` policy: an NPU backend that opens and can compute, else the
/// emulator, which says why in its name).
pub fn open_device(
    kind: DeviceKind,
    domains: u32,
    soc: ork_device::Soc,
) -> Result<Arc<dyn Device>, RuntimeError> {
    let options = ork_device::OpenOptions::new().domains(domains).soc(soc);
    ork_device::open(kind, &options).map_err(|e| RuntimeError::Device {
        what: "opening the device".to_owned(),
        source: Some(e),
    })
}
