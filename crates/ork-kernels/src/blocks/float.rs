//! F32, F16 and BF16 weights against activations stored the same way (ggml's `vec_dot_type`
//! for these types: `ggml_vec_dot_f16` converts the activation row to f16 and multiplies in f32,
//! `ggml_vec_dot_bf16` likewise with bf16, `ggml-cpu/vec.cpp`).
//!
//! Every value widens to f32 exactly; each product `w_i · a_i` is one f32 multiply, added to
//! lane `i % 16` of sixteen f32 accumulators (a separate add, never fused), folded by
//! [`super::order::reduce16`]. The scalar twin [`rows_scalar`] does exactly that; the SIMD
//! kernels keep the sixteen lanes in two ymm (x86) or four q registers (aarch64) and finish the
//! last `k % 16` values on the stored lanes, as the twin does. NaN and infinities follow IEEE
//! arithmetic in that order (a NaN's payload is not specified).
//!
//! One exception, as in ggml: F16 on an aarch64 core with fp16 arithmetic (FEAT_FP16, detected
//! at run time) accumulates in fp16 in ggml's `ggml_vec_dot_f16` order instead ([`fp16`], whose
//! `rows_scalar` is that kernel's twin), so its F16 results are llama.cpp's on such a core and
//! differ from the other ISAs' (which equal ggml's f32-accumulating x86 path up to order).

use super::order::reduce16;
use super::{Family, RowsFn, WeightType};
use half::{bf16, f16};

// The fp16 twin: the aarch64 kernel shares its tail; the rest is the tests' reference.
#[cfg_attr(not(test), allow(dead_code))]
mod fp16;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

/// A float storage: bytes per value and its exact widening to f32.
pub(super) trait Elem {
    /// Bytes per value.
    const BYTES: usize;
    /// The value stored in `b` (`BYTES` little-endian bytes).
    fn get(b: &[u8]) -> f32;
}

/// f32 storage.
pub(super) struct F32;
/// IEEE half storage.
pub(super) struct F16;
/// bfloat16 storage.
pub(super) struct Bf16;

impl Elem for F32 {
    const BYTES: usize = 4;
    fn get(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Elem for F16 {
    const BYTES: usize = 2;
    fn get(b: &[u8]) -> f32 {
        f16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

impl Elem for Bf16 {
    const BYTES: usize = 2;
    fn get(b: &[u8]) -> f32 {
        bf16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

/// The float kernels (dispatched by `super::Kernel::with_isa`); every SIMD ISA of an
/// architecture runs its one float kernel (AVX2 + F16C, NEON).
pub(super) const FAMILY: Family = Family {
    scalar: |ty| {
        Some(match ty {
            WeightType::F32 => rows_scalar::<F32>,
            WeightType::F16 => rows_scalar::<F16>,
            WeightType::BF16 => rows_scalar::<Bf16>,
            _ => return None,
        })
    },
    #[cfg(target_arch = "x86_64")]
    simd: |ty, _| x86::rows(ty),
    #[cfg(target_arch = "aarch64")]
    simd: |ty, _| neon::rows(ty),
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    simd: |_, _| None,
};

/// Add the products of values `from..k` of `w` and `a` (rows of `k` values) into `lanes`
/// (lane `i % 16`) and fold: the twin's tail, shared by the SIMD kernels.
#[inline(always)]
pub(super) fn finish<E: Elem>(mut lanes: [f32; 16], w: &[u8], a: &[u8], from: usize) -> f32 {
    let k = w.len() / E::BYTES;
    for i in from..k {
        let (x, y) = (&w[i * E::BYTES..], &a[i * E::BYTES..]);
        lanes[i % 16] += E::get(x) * E::get(y);
    }
    reduce16(&lanes)
}

/// A SIMD kernel's `R` weight rows × `N` activation rows.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) type Tile<const R: usize, const N: usize> =
    unsafe fn([&[u8]; R], [&[u8]; N]) -> [[f32; N]; R];

/// Every weight row (`rb` bytes) against every activation row: with fewer than four activation
/// rows (decode), four weight rows at a time against each; else one weight row against four
/// activation rows at a time; the rest one by one.
///
/// # Safety
/// The tiles must be safe to call on this CPU for rows of `rb` bytes; the lengths are those
/// `Kernel::rows` checks.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) unsafe fn drive(
    rb: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
    (rows4, acts4, one): (Tile<4, 1>, Tile<1, 4>, Tile<1, 1>),
) {
    let wrow = |r: usize| &w[r * rb..][..rb];
    let arow = |i: usize| &acts[i * rb..][..rb];
    let mut r = 0;
    while m < 4 && r + 4 <= rows {
        for i in 0..m {
            // SAFETY: the caller's guarantee.
            let v = unsafe { rows4([wrow(r), wrow(r + 1), wrow(r + 2), wrow(r + 3)], [arow(i)]) };
            for (j, v) in v.iter().enumerate() {
                out[(r + j) * m + i] = v[0];
            }
        }
        r += 4;
    }
    for r in r..rows {
        let mut i = 0;
        while i + 4 <= m {
            // SAFETY: as above.
            let v = unsafe { acts4([wrow(r)], [arow(i), arow(i + 1), arow(i + 2), arow(i + 3)]) };
            out[r * m + i..][..4].copy_from_slice(&v[0]);
            i += 4;
        }
        for i in i..m {
            // SAFETY: as above.
            out[r * m + i] = unsafe { one([wrow(r)], [arow(i)]) }[0][0];
        }
    }
}

/// The scalar twin (module docs).
pub(super) fn rows_scalar<E: Elem>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) {
    let rb = k * E::BYTES;
    for r in 0..rows {
        let wr = &w[r * rb..][..rb];
        for i in 0..m {
            let ar = &acts[i * rb..][..rb];
            out[r * m + i] = finish::<E>([0.0; 16], wr, ar, 0);
        }
    }
}

#[cfg(test)]
mod tests;
