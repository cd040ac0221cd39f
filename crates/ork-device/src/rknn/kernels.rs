//! The emulator's matmul kernels on plain operand slices, for the CI stand-in of the vendor
//! runtime (`crates/ork-rknn-standin`): it computes exactly what [`crate::EmuDevice`] computes,
//! so a model run through `--device rknn` against the stand-in must equal the emulator's.
//!
//! Operands as the runtime sees them with B in the native layout and A / C row-major: `b` is the
//! tiled blob of `layout` (`layout.blob_bytes()` bytes), `a` is `m × layout.k`, `out` is
//! `m × layout.n`.

use half::f16;
use ork_pack::TiledLayout;

use crate::kernel::Isa;
use crate::task::{is_integer, ActValues};
use crate::{gemm, DeviceError};

fn check(
    layout: &TiledLayout,
    b: usize,
    a: usize,
    m: usize,
    out: usize,
) -> Result<(), DeviceError> {
    let len = |operand, expected: usize, got: usize| {
        if expected == got {
            Ok(())
        } else {
            Err(DeviceError::Length {
                operand,
                expected,
                got,
            })
        }
    };
    len("weight bytes", layout.blob_bytes(), b)?;
    len("activations", m * layout.k, a)?;
    len("output", m * layout.n, out)
}

/// Exact i32 accumulators `Σ_k a[m, k] · q[n, k]` of int8 activations and an int8 / int4 weight.
///
/// # Errors
/// [`DeviceError::Length`] for operands that do not match the shape, [`DeviceError::NotInteger`]
/// for an fp16 weight.
pub fn int_acc(
    layout: &TiledLayout,
    b: &[u8],
    a: &[i8],
    m: usize,
    out: &mut [i32],
) -> Result<(), DeviceError> {
    check(layout, b.len(), a.len(), m, out.len())?;
    if !is_integer(layout.dtype) {
        return Err(DeviceError::NotInteger {
            dtype: layout.dtype,
            activations: crate::ActPrecision::Int8,
        });
    }
    gemm::gemm_int(Isa::best(), layout, b, a, m, out, |acc, _, _, o| {
        o.copy_from_slice(acc)
    });
    Ok(())
}

/// f32 accumulators of fp16 activations and any weight (the emulator's float path).
///
/// # Errors
/// [`DeviceError::Length`] for operands that do not match the shape.
pub fn float_acc(
    layout: &TiledLayout,
    b: &[u8],
    a: &[f16],
    m: usize,
    out: &mut [f32],
) -> Result<(), DeviceError> {
    check(layout, b.len(), a.len(), m, out.len())?;
    let af = gemm::f32_rows(
        &ActValues::F16(std::borrow::Cow::Borrowed(a)),
        m,
        layout.k,
        layout.k_pad(),
    );
    gemm::gemm_float(Isa::best(), layout, b, &af, m, out, |acc, _, _, o| {
        o.copy_from_slice(acc)
    });
    Ok(())
}

/// Per-group sums `Σ_j f32(Σ_{k in group j} a[m, k] · q[n, k]) · scales[n, j]` of int8
/// activations and an int8 weight (`scales`: `[N][K/group]`), without any activation scale.
///
/// # Errors
/// [`DeviceError::Length`] for operands that do not match the shape, [`DeviceError::Shape`] for
/// a group that is not a multiple of 32 dividing K (or above 1024).
pub fn grouped_acc(
    layout: &TiledLayout,
    b: &[u8],
    a: &[i8],
    m: usize,
    group: usize,
    scales: &[f32],
    out: &mut [f32],
) -> Result<(), DeviceError> {
    check(layout, b.len(), a.len(), m, out.len())?;
    let want = ork_pack::ScaleGroup::Group(group)
        .scales_len(layout.k, layout.n)
        .ok()
        .filter(|_| group <= crate::kernel::group::MAX_GROUP && is_integer(layout.dtype))
        .ok_or(DeviceError::Shape {
            m,
            k: layout.k,
            n: layout.n,
            reason: "scale group is not a multiple of 32 dividing K (≤ 1024) of an integer weight",
        })?;
    if scales.len() != want {
        return Err(DeviceError::Length {
            operand: "weight scales",
            expected: want,
            got: scales.len(),
        });
    }
    gemm::gemm_grouped(
        Isa::best(),
        layout,
        b,
        a,
        m,
        group,
        scales,
        out,
        |acc, _, _, o| o.copy_from_slice(acc),
    );
    Ok(())
}
