//! Matmul tasks and weights on a device.

use ork_pack::{PackDtype, PackedWeight, TiledLayout};

use crate::kernel::MAX_K;
use crate::{BufferView, Device, DeviceBuffer, DeviceError, DomainId, MemFlags};

/// A packed weight resident on a device: the tiled blob in a device buffer plus its per-output-
/// channel scales (host side; the NPU applies them in the output conversion).
#[derive(Debug)]
pub struct DeviceWeight {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// Buffer holding exactly `layout.blob_bytes()` tiled bytes at offset 0.
    pub buffer: DeviceBuffer,
    /// One scale per output channel (`layout.n`).
    pub scales: Vec<f32>,
}

impl DeviceWeight {
    /// Borrow as a task operand.
    pub fn as_weight(&self) -> WeightRef<'_> {
        WeightRef {
            layout: self.layout,
            bytes: self.buffer.full_view(),
            scales: &self.scales,
        }
    }
}

/// A weight as a task sees it: layout, the tiled bytes (a view, so it may sit inside a shared
/// arena buffer), scales.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// The tiled blob (`layout.blob_bytes()` bytes).
    pub bytes: BufferView<'a>,
    /// One scale per output channel (`layout.n`).
    pub scales: &'a [f32],
}

/// Where a task's int8 activations are.
#[derive(Clone, Copy, Debug)]
pub enum Activations<'a> {
    /// Host memory (fine for the emulator).
    Host(&'a [i8]),
    /// A device buffer range holding the int8 values; must be in the task's domain.
    Device(BufferView<'a>),
}

/// NPU cores a task may use: bit i = core i; 0 = let the device choose (all cores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreMask(pub u32);

impl CoreMask {
    /// Let the device choose.
    pub const AUTO: CoreMask = CoreMask(0);
}

/// One matmul: `out[m, n] = (Σ_k a[m, k] · q[n, k]) · act_scales[m] · weight.scales[n]`.
#[derive(Clone, Copy, Debug)]
pub struct MatmulTask<'a> {
    /// Rows of activations (tokens).
    pub m: usize,
    /// `m × weight.layout.k` int8 values, row-major.
    pub activations: Activations<'a>,
    /// One scale per activation row (per token).
    pub act_scales: &'a [f32],
    /// The weight (its domain is the task's domain).
    pub weight: WeightRef<'a>,
    /// Cores to run on.
    pub cores: CoreMask,
}

/// What a task did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulStats {
    /// Domain it ran in.
    pub domain: DomainId,
    /// Whether the device had to switch domains first.
    pub switched: bool,
    /// Multiply-adds performed (padded shape: `m · Kpad · Npad`).
    pub macs: u64,
    /// Wall time on the device, switch included.
    pub elapsed: std::time::Duration,
    /// Kernel used (e.g. "avx-vnni"; "rknpu" on hardware).
    pub kernel: &'static str,
}

impl<'a> MatmulTask<'a> {
    /// The activation bytes, if they are host-visible.
    pub fn activation_bytes(&self) -> &'a [i8] {
        match self.activations {
            Activations::Host(s) => s,
            Activations::Device(v) => cast_i8(v.as_slice()),
        }
    }

    /// Check the task's shape and operand lengths against `out_len` output elements.
    pub(crate) fn check(&self, out_len: usize) -> Result<(), DeviceError> {
        let l = self.weight.layout;
        let (m, k, n) = (self.m, l.k, l.n);
        if k == 0 || n == 0 {
            return Err(DeviceError::Shape {
                m,
                k,
                n,
                reason: "weight has a zero dimension",
            });
        }
        if l.k_pad() > MAX_K {
            return Err(DeviceError::Shape {
                m,
                k,
                n,
                reason: "K exceeds 65536 (i32 accumulator range)",
            });
        }
        let want_bytes = l.blob_bytes();
        if self.weight.bytes.len() != want_bytes as u64 {
            return Err(DeviceError::Length {
                operand: "weight bytes",
                expected: want_bytes,
                got: self.weight.bytes.len() as usize,
            });
        }
        if self.weight.scales.len() != n {
            return Err(DeviceError::Length {
                operand: "weight scales",
                expected: n,
                got: self.weight.scales.len(),
            });
        }
        let mk = m.checked_mul(k).ok_or(DeviceError::Shape {
            m,
            k,
            n,
            reason: "m·k overflows",
        })?;
        let a_len = match self.activations {
            Activations::Host(s) => s.len(),
            Activations::Device(v) => v.len() as usize,
        };
        if a_len != mk {
            return Err(DeviceError::Length {
                operand: "activations",
                expected: mk,
                got: a_len,
            });
        }
        if self.act_scales.len() != m {
            return Err(DeviceError::Length {
                operand: "activation scales",
                expected: m,
                got: self.act_scales.len(),
            });
        }
        let mn = m.checked_mul(n).ok_or(DeviceError::Shape {
            m,
            k,
            n,
            reason: "m·n overflows",
        })?;
        if out_len != mn {
            return Err(DeviceError::Length {
                operand: "output",
                expected: mn,
                got: out_len,
            });
        }
        let task_domain = self.weight.bytes.domain();
        if let Activations::Device(v) = self.activations {
            if v.domain() != task_domain {
                return Err(DeviceError::CrossDomain {
                    operand: "activations",
                    task_domain,
                    operand_domain: v.domain(),
                });
            }
        }
        Ok(())
    }
}

/// Reinterpret bytes as int8 values (same size, alignment 1, every bit pattern valid).
fn cast_i8(b: &[u8]) -> &[i8] {
    use zerocopy::FromBytes;
    // Cannot fail: `[i8]` has alignment 1 and any length is a whole number of elements.
    <[i8]>::ref_from_bytes(b).unwrap_or(&[])
}

/// Copy a host-packed weight into a new device buffer in `domain` (flags
/// [`MemFlags::WEIGHT`]) and sync it to the device.
pub fn upload(
    dev: &dyn Device,
    w: &PackedWeight,
    domain: DomainId,
) -> Result<DeviceWeight, DeviceError> {
    let want = w.layout.blob_bytes();
    if w.data.len() != want {
        return Err(DeviceError::Length {
            operand: "weight bytes",
            expected: want,
            got: w.data.len(),
        });
    }
    if w.scales.len() != w.layout.n {
        return Err(DeviceError::Length {
            operand: "weight scales",
            expected: w.layout.n,
            got: w.scales.len(),
        });
    }
    let mut buffer = dev.create_buffer(want as u64, MemFlags::WEIGHT, domain)?;
    buffer.as_mut_slice().copy_from_slice(&w.data);
    buffer.sync_to_device()?;
    Ok(DeviceWeight {
        layout: w.layout,
        buffer,
        scales: w.scales.clone(),
    })
}

/// Whether a dtype's raw accumulators are integers (int8 / int4 weights).
pub(crate) fn is_integer(d: PackDtype) -> bool {
    matches!(d, PackDtype::I8 | PackDtype::I4)
}
