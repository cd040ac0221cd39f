//! Matmul tasks and weights on a device.

use half::f16;
use ork_pack::{PackDtype, PackedWeight, ScaleGroup, TiledLayout};

use crate::kernel::MAX_K;
use crate::{BufferIntent, BufferView, Device, DeviceBuffer, DeviceError, DomainId};

/// A packed weight resident on a device: the tiled blob in a device buffer plus its per-output-
/// channel scales (host side; the NPU applies them in the output conversion).
#[derive(Debug)]
pub struct DeviceWeight {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// Buffer holding exactly `layout.blob_bytes()` tiled bytes at offset 0.
    pub buffer: DeviceBuffer,
    /// One scale per output channel (`layout.n`), or per output channel and group (`[N][K/g]`)
    /// with [`ScaleGroup::Group`].
    pub scales: Vec<f32>,
    /// How the scales cover K.
    pub group: ScaleGroup,
}

impl DeviceWeight {
    /// Borrow as a task operand.
    pub fn as_weight(&self) -> WeightRef<'_> {
        WeightRef {
            layout: self.layout,
            bytes: self.buffer.full_view(),
            scales: &self.scales,
            group: self.group,
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
    /// One scale per output channel (`layout.n`), or `layout.n · k/g` in the order `[N][K/g]`
    /// with [`ScaleGroup::Group`]`(g)`; twice that with [`ScaleGroup::Affine`]`(g)` (steps, then
    /// offsets).
    pub scales: &'a [f32],
    /// How the scales cover K.
    pub group: ScaleGroup,
}

impl WeightRef<'_> {
    /// Check the weight's shape, bytes and scales against its layout (`m`: the task's rows, for
    /// the error; 0 outside a task).
    pub(crate) fn check(&self, m: usize) -> Result<(), DeviceError> {
        let l = self.layout;
        let (k, n) = (l.k, l.n);
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
        if self.bytes.len() != want_bytes as u64 {
            return Err(DeviceError::Length {
                operand: "weight bytes",
                expected: want_bytes,
                got: self.bytes.len() as usize,
            });
        }
        let want_scales = check_group(l, self.group, m)?;
        if self.scales.len() != want_scales {
            return Err(DeviceError::Length {
                operand: "weight scales",
                expected: want_scales,
                got: self.scales.len(),
            });
        }
        Ok(())
    }
}

/// The number of scales a weight with this layout and scale group carries, or
/// [`DeviceError::Shape`] if the group does not fit (fp16, a size that is not a multiple of 32
/// up to 1024, or does not divide K).
fn check_group(l: TiledLayout, group: ScaleGroup, m: usize) -> Result<usize, DeviceError> {
    let shape = |reason| DeviceError::Shape {
        m,
        k: l.k,
        n: l.n,
        reason,
    };
    if let Some(g) = group.size() {
        if l.dtype == PackDtype::F16 {
            return Err(shape("fp16 weights have no scales to group"));
        }
        if group.is_affine() && l.dtype != PackDtype::I4 {
            return Err(shape("affine scale groups are for int4 weights only"));
        }
        if g > crate::kernel::group::MAX_GROUP {
            return Err(shape(
                "scale group exceeds 1024 (partial sums inexact in f32)",
            ));
        }
    }
    group
        .scales_len(l.k, l.n)
        .map_err(|_| shape("scale group is not a multiple of 32 dividing K"))
}

/// Precision of a task's activations (the A operand): int8 with per-token scales (w8a8, i32
/// accumulators, scales applied afterwards) or fp16 (no activation quantization). Which weight
/// types each goes with depends on the chip (`docs/chip.md`): the RK3588 has int8 × int8 and
/// fp16 × fp16 only; fp16 × int8 / int4 (w8a16, w4a16) and int8 × int4 are RK3576 types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActPrecision {
    /// Symmetric int8 with one scale per row (`MatmulTask::act_scales`).
    #[default]
    Int8,
    /// IEEE binary16, unscaled (`MatmulTask::act_scales` must be empty).
    F16,
}

impl ActPrecision {
    /// Bytes per activation value.
    pub const fn bytes(self) -> usize {
        match self {
            ActPrecision::Int8 => 1,
            ActPrecision::F16 => 2,
        }
    }

    /// Short name for reports ("int8", "fp16").
    pub const fn name(self) -> &'static str {
        match self {
            ActPrecision::Int8 => "int8",
            ActPrecision::F16 => "fp16",
        }
    }
}

/// Where a task's activations are, and in which precision.
#[derive(Clone, Copy, Debug)]
pub enum Activations<'a> {
    /// int8 values in host memory (fine for the emulator).
    Host(&'a [i8]),
    /// A device buffer range holding the int8 values; must be in the task's domain.
    Device(BufferView<'a>),
    /// fp16 values in host memory.
    HostF16(&'a [f16]),
    /// A device buffer range holding fp16 values (2 bytes each, little-endian); must be in the
    /// task's domain.
    DeviceF16(BufferView<'a>),
}

/// Host-visible activation values of a task, borrowed.
#[derive(Clone, Debug)]
pub(crate) enum ActValues<'a> {
    /// int8 values.
    Int8(&'a [i8]),
    /// fp16 values (zero-copy when the bytes are 2-aligned).
    F16(std::borrow::Cow<'a, [f16]>),
}

impl<'a> Activations<'a> {
    /// Their precision.
    pub fn precision(&self) -> ActPrecision {
        match self {
            Activations::Host(_) | Activations::Device(_) => ActPrecision::Int8,
            Activations::HostF16(_) | Activations::DeviceF16(_) => ActPrecision::F16,
        }
    }

    /// The device buffer range, if they are in one.
    pub fn view(&self) -> Option<BufferView<'a>> {
        match *self {
            Activations::Device(v) | Activations::DeviceF16(v) => Some(v),
            Activations::Host(_) | Activations::HostF16(_) => None,
        }
    }

    /// `(values, bytes)` held.
    fn len(&self) -> (usize, u64) {
        match *self {
            Activations::Host(s) => (s.len(), s.len() as u64),
            Activations::HostF16(s) => (s.len(), 2 * s.len() as u64),
            Activations::Device(v) => (v.len() as usize, v.len()),
            Activations::DeviceF16(v) => ((v.len() / 2) as usize, v.len()),
        }
    }
}

/// NPU cores a task may use: bit i = core i; 0 = let the device choose (all cores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreMask(pub u32);

impl CoreMask {
    /// Let the device choose.
    pub const AUTO: CoreMask = CoreMask(0);
}

/// One matmul: `out[m, n] = (Σ_k a[m, k] · q[n, k]) · act_scales[m] · weight.scales[n]` for int8
/// activations, `out[m, n] = (Σ_k a[m, k] · q[n, k]) · weight.scales[n]` for fp16 activations
/// (the sum in f32; see [`crate::kernel`] for its order). A weight with per-group scales
/// ([`ScaleGroup::Group`]`(g)`, int8 × int8 only) gives
/// `out[m, n] = (Σ_j (Σ_{k in group j} a[m, k] · q[n, k]) · weight.scales[n, j]) · act_scales[m]`
/// (the chip's per-group mode; integer partial sums, f32 across groups). Affine groups
/// ([`ScaleGroup::Affine`]`(g)`, fp16 × int4 only; `scales` = steps `s` then offsets `b`) give
/// `out[m, n] = Σ_j s[n, j] · P[m, n, j] + Σ_j fp16(b[n, j]) · fp16(Σ_{k in group j} a[m, k])`,
/// two matmuls of the chip's own types (`docs/chip.md`).
#[derive(Clone, Copy, Debug)]
pub struct MatmulTask<'a> {
    /// Rows of activations (tokens).
    pub m: usize,
    /// `m × weight.layout.k` values, row-major (int8 or fp16).
    pub activations: Activations<'a>,
    /// One scale per activation row (per token) for int8 activations; empty for fp16.
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
    /// The int8 activation values (host-visible); `None` for fp16 activations.
    pub fn activation_bytes(&self) -> Option<&'a [i8]> {
        match self.activations {
            Activations::Host(s) => Some(s),
            Activations::Device(v) => Some(cast_i8(v.as_slice())),
            Activations::HostF16(_) | Activations::DeviceF16(_) => None,
        }
    }

    /// The activation values, host-visible. Device fp16 bytes are borrowed in place when they are
    /// 2-aligned (device buffers are page-aligned, so a view at an even offset is), else copied.
    pub(crate) fn activation_values(&self) -> ActValues<'a> {
        use std::borrow::Cow;
        use zerocopy::FromBytes;
        match self.activations {
            Activations::Host(s) => ActValues::Int8(s),
            Activations::Device(v) => ActValues::Int8(cast_i8(v.as_slice())),
            Activations::HostF16(s) => ActValues::F16(Cow::Borrowed(s)),
            Activations::DeviceF16(v) => {
                let b = v.as_slice();
                ActValues::F16(match <[f16]>::ref_from_bytes(b) {
                    Ok(s) => Cow::Borrowed(s),
                    Err(_) => Cow::Owned(
                        b.chunks_exact(2)
                            .map(|p| f16::from_le_bytes([p[0], p[1]]))
                            .collect(),
                    ),
                })
            }
        }
    }

    /// Check the task's shape and operand lengths against `out_len` output elements.
    pub(crate) fn check(&self, out_len: usize) -> Result<(), DeviceError> {
        self.weight.check(self.m)?;
        let l = self.weight.layout;
        let (m, k, n) = (self.m, l.k, l.n);
        let mk = m.checked_mul(k).ok_or(DeviceError::Shape {
            m,
            k,
            n,
            reason: "m·k overflows",
        })?;
        let precision = self.activations.precision();
        let (a_len, a_bytes) = self.activations.len();
        let want_bytes = mk
            .checked_mul(precision.bytes())
            .ok_or(DeviceError::Shape {
                m,
                k,
                n,
                reason: "activation bytes overflow",
            })?;
        if a_bytes != want_bytes as u64 {
            // A device view is measured in bytes (an odd byte count for fp16 is caught here too).
            let device = self.activations.view().is_some();
            return Err(DeviceError::Length {
                operand: if device {
                    "activation bytes"
                } else {
                    "activations"
                },
                expected: if device { want_bytes } else { mk },
                got: if device { a_bytes as usize } else { a_len },
            });
        }
        let want_scales = match precision {
            ActPrecision::Int8 => m,
            ActPrecision::F16 => 0,
        };
        if self.act_scales.len() != want_scales {
            return Err(DeviceError::Length {
                operand: "activation scales",
                expected: want_scales,
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
        if let Some(v) = self.activations.view() {
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

/// Copy a host-packed weight into a new [`BufferIntent::Weight`] buffer in `domain`, sync it to
/// the device and [prepare](Device::prepare_weight) it.
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
    let want_scales = check_group(w.layout, w.group, 0)?;
    if w.scales.len() != want_scales {
        return Err(DeviceError::Length {
            operand: "weight scales",
            expected: want_scales,
            got: w.scales.len(),
        });
    }
    let mut buffer = dev.create_buffer(want as u64, BufferIntent::Weight, domain)?;
    buffer.as_mut_slice().copy_from_slice(&w.data);
    buffer.sync_to_device()?;
    let weight = DeviceWeight {
        layout: w.layout,
        buffer,
        scales: w.scales.clone(),
        group: w.group,
    };
    dev.prepare_weight(&weight.as_weight())?;
    Ok(weight)
}

/// Whether a dtype's raw accumulators are integers (int8 / int4 weights).
pub(crate) fn is_integer(d: PackDtype) -> bool {
    matches!(d, PackDtype::I8 | PackDtype::I4)
}
