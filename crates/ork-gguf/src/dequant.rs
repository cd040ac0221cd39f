//! Block decoders: ggml block types to f32.
//!
//! Each decoder follows the reference `dequantize_row_*` functions of ggml's
//! `ggml/src/ggml-quants.c` (block layouts from `ggml/src/ggml-common.h`) and is bit-exact with
//! `gguf.quants.dequantize` of the PyPI `gguf` package 0.19 (`gguf/quants.py`), which performs
//! the same f32 operations in the same order: `d * q` for the symmetric types, `d * q + m` for
//! Q4_1/Q5_1, `(d * sc) * q - (dmin * m)` for the k-quants. The golden vectors in
//! `tests/golden/` (made by `scripts/golden.py`) pin this.
//!
//! Decoders work one block at a time straight into the caller's buffer, without allocating; the
//! inner loops are written over fixed-size arrays so the compiler drops bounds checks and
//! vectorises them.

mod float;
mod k_quants;
mod legacy;

use crate::{GgmlType, GgufError, GgufFile, TensorInfo};
use std::path::PathBuf;

/// Decode whole blocks of `ty` from `src` into `dst`.
///
/// `src` must hold a whole number of blocks and `dst` exactly `blocks × block_size` values, else
/// [`GgufError::Decode`]. Types ork cannot decode (see [`GgmlType::is_decodable`]) give
/// [`GgufError::UnsupportedType`] with empty `path` and `tensor` (use
/// [`GgufFile::dequantize_rows`] for an error that names the tensor).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    if !ty.is_decodable() {
        return Err(GgufError::UnsupportedType {
            path: PathBuf::new(),
            tensor: String::new(),
            ty: ty.to_string(),
        });
    }
    let (Some(block_size), Some(type_size)) = (ty.block_size(), ty.type_size()) else {
        unreachable!("decodable types have a geometry");
    };
    let (block_size, type_size) = (block_size as usize, type_size as usize);
    if !src.len().is_multiple_of(type_size) {
        return Err(GgufError::Decode {
            ty: ty.to_string(),
            what: format!(
                "source of {} bytes is not a whole number of {type_size}-byte blocks",
                src.len()
            ),
        });
    }
    let blocks = src.len() / type_size;
    if blocks.checked_mul(block_size) != Some(dst.len()) {
        return Err(GgufError::Decode {
            ty: ty.to_string(),
            what: format!(
                "{blocks} blocks decode to {} values, destination holds {}",
                blocks.saturating_mul(block_size),
                dst.len()
            ),
        });
    }
    match ty {
        GgmlType::F32 => float::f32(src, dst),
        GgmlType::F16 => float::f16(src, dst),
        GgmlType::BF16 => float::bf16(src, dst),
        GgmlType::Q4_0 => legacy::q4_0(src, dst),
        GgmlType::Q4_1 => legacy::q4_1(src, dst),
        GgmlType::Q5_0 => legacy::q5_0(src, dst),
        GgmlType::Q5_1 => legacy::q5_1(src, dst),
        GgmlType::Q8_0 => legacy::q8_0(src, dst),
        GgmlType::Q2_K => k_quants::q2_k(src, dst),
        GgmlType::Q3_K => k_quants::q3_k(src, dst),
        GgmlType::Q4_K => k_quants::q4_k(src, dst),
        GgmlType::Q5_K => k_quants::q5_k(src, dst),
        GgmlType::Q6_K => k_quants::q6_k(src, dst),
        GgmlType::Q8_1 | GgmlType::Q8_K | GgmlType::Other(_) => {
            unreachable!("checked by is_decodable")
        }
    }
    Ok(())
}

/// Decode whole rows of `t` (a row is `ne0` values; rows = product of `dims[1..]`) starting at
/// `first_row` into `out`, whose length must be a multiple of `ne0`. The pack kernel's entry
/// point; same as [`GgufFile::dequantize_rows`].
pub fn dequantize_rows(
    file: &GgufFile,
    t: &TensorInfo,
    first_row: usize,
    out: &mut [f32],
) -> Result<(), GgufError> {
    file.dequantize_rows(t, first_row as u64, out)
}

/// Split `src`/`dst` into matching fixed-size blocks. Lengths were validated by [`dequantize`].
#[inline(always)]
fn blocks<'a, const TS: usize, const BS: usize>(
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8; TS], &'a mut [f32; BS])> {
    debug_assert_eq!(src.len() / TS * BS, dst.len());
    src.chunks_exact(TS)
        .zip(dst.chunks_exact_mut(BS))
        .map(|(b, y)| {
            (
                b.try_into().expect("chunk of TS bytes"),
                y.try_into().expect("chunk of BS values"),
            )
        })
}

/// The little-endian f16 at `b[i..i + 2]` as f32 (exact).
#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}
