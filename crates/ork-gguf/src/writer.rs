//! A small GGUF writer and reference quantizers, for test fixtures.
//!
//! Other crates' tests need GGUF files with random weights (tiny Llama and MoE models) in the
//! real model's types. [`GgufBuilder`] lays out a v3 file the way llama.cpp's `gguf.cpp` /
//! gguf-py's `GGUFWriter` do: header, metadata, tensor infos, padding to the alignment, then each
//! tensor's data padded to the alignment. [`quantize`] produces the raw bytes for F32, F16,
//! BF16, Q8_0, Q4_0 and Q4_1 from f32, following the reference `quantize_row_*_ref` functions in
//! ggml's `ggml/src/ggml-quants.c` (bit-exact with gguf-py's `gguf.quants.quantize`, pinned by the
//! golden vectors).
//!
//! ```
//! use ork_gguf::{writer::{quantize, GgufBuilder}, GgmlType, GgufFile, MetaValue};
//! let w: Vec<f32> = (0..64 * 2).map(|i| i as f32 / 100.0).collect();
//! let bytes = GgufBuilder::new()
//!     .kv("general.architecture", MetaValue::String("llama".into()))
//!     .tensor("w", &[64, 2], GgmlType::Q8_0, quantize(GgmlType::Q8_0, &w)?)
//!     .to_bytes()?;
//! let file = GgufFile::from_bytes("fixture.gguf", bytes)?;
//! assert_eq!(file.tensor("w").unwrap().dims, [64, 2]);
//! # Ok::<(), ork_gguf::GgufError>(())
//! ```

use crate::parse::{value_type, DEFAULT_ALIGNMENT};
use crate::{GgmlType, GgufError, MetaValue};
use std::collections::HashSet;
use std::path::Path;

/// Builds a GGUF v3 file in memory. Inputs are checked when the file is produced
/// ([`GgufBuilder::to_bytes`] / [`GgufBuilder::write`]), so calls chain.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    /// An empty v3 file (alignment 32 unless a `general.alignment` key is added).
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A copy of `file`: every metadata pair in order, with the values of `overrides` replaced
    /// (or appended when absent), and the tensors whose names `keep` accepts, their bytes copied.
    /// For fixtures derived from a real model: its first blocks as a draft model, a changed
    /// vocabulary.
    pub fn from_file(
        file: &crate::GgufFile,
        keep: impl Fn(&str) -> bool,
        overrides: &[(&str, MetaValue)],
    ) -> Self {
        let mut b = GgufBuilder::new();
        for (key, value) in file.metadata_iter() {
            let value = overrides
                .iter()
                .find(|o| o.0 == key)
                .map_or_else(|| value.clone(), |o| o.1.clone());
            b = b.kv(key, value);
        }
        for (key, value) in overrides {
            if file.metadata(key).is_none() {
                b = b.kv(*key, value.clone());
            }
        }
        for t in file.tensors().iter().filter(|t| keep(&t.name)) {
            b = b.tensor(&t.name, &t.dims, t.ty, file.tensor_data(t).to_vec());
        }
        b
    }

    /// Write GGUF version `version` instead of 3 (2 has the same layout; other values make an
    /// invalid file, for negative tests).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Add a metadata pair (in order). A `general.alignment` key (any unsigned integer type) sets
    /// the alignment used for the layout.
    pub fn kv(mut self, key: impl Into<String>, value: MetaValue) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Add a tensor: `dims` with `ne0` first, `data` the raw bytes of type `ty`.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Add a tensor from f32 values, quantized to `ty` with [`quantize`].
    pub fn tensor_f32(
        self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        values: &[f32],
    ) -> Result<Self, GgufError> {
        let data = quantize(ty, values)?;
        Ok(self.tensor(name, dims, ty, data))
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => Ok(a),
                _ => Err(build(format!(
                    "general.alignment {v:?} is not a non-zero power of two"
                ))),
            },
        }
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let alignment = self.alignment()?;
        let mut keys = HashSet::new();
        for (k, _) in &self.metadata {
            if !keys.insert(k.as_str()) {
                return Err(build(format!("duplicate metadata key '{k}'")));
            }
        }
        let mut names = HashSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(build(format!("duplicate tensor '{}'", t.name)));
            }
            if t.dims.is_empty() || t.dims.len() > 4 || t.dims.contains(&0) {
                return Err(build(format!(
                    "tensor '{}': dims {:?} must be 1 to 4 non-zero values",
                    t.name, t.dims
                )));
            }
            let bs =
                t.ty.block_size()
                    .ok_or_else(|| build(format!("tensor '{}': unknown type {}", t.name, t.ty)))?;
            if t.dims[0] % bs != 0 {
                return Err(build(format!(
                    "tensor '{}': ne0 {} is not a multiple of the {} block size {bs}",
                    t.name, t.dims[0], t.ty
                )));
            }
            let expected = t
                .dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| t.ty.bytes_for(n))
                .ok_or_else(|| {
                    build(format!(
                        "tensor '{}': size of {:?} overflows",
                        t.name, t.dims
                    ))
                })?;
            if expected != t.data.len() as u64 {
                return Err(build(format!(
                    "tensor '{}': {} {:?} needs {expected} bytes, got {}",
                    t.name,
                    t.ty,
                    t.dims,
                    t.data.len()
                )));
            }
        }

        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, v)?;
        }
        let mut rel = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
            offsets.push(rel);
            rel = (rel + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad(&mut out, alignment);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(&mut out, alignment);
        }
        Ok(out)
    }

    /// Write the file atomically (`ork_io::output::write_atomic`): a temporary file in the same
    /// directory, synced, renamed over `path`, then the directory synced.
    pub fn write(&self, path: &Path) -> Result<(), GgufError> {
        let bytes = self.to_bytes()?;
        ork_io::output::write_atomic(path, &bytes).map_err(|e| match e {
            ork_io::output::OutputError::Io { source, .. } => GgufError::Io {
                path: path.to_path_buf(),
                source,
            },
            other => GgufError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(other.to_string()),
            },
        })
    }
}

fn build(what: String) -> GgufError {
    GgufError::Build { what }
}

fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment);
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    use value_type::*;
    match v {
        MetaValue::U8(_) => U8,
        MetaValue::I8(_) => I8,
        MetaValue::U16(_) => U16,
        MetaValue::I16(_) => I16,
        MetaValue::U32(_) => U32,
        MetaValue::I32(_) => I32,
        MetaValue::F32(_) => F32,
        MetaValue::Bool(_) => BOOL,
        MetaValue::String(_) => STRING,
        MetaValue::Array(_) => ARRAY,
        MetaValue::U64(_) => U64,
        MetaValue::I64(_) => I64,
        MetaValue::F64(_) => F64,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) -> Result<(), GgufError> {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(items) => {
            // GGUF arrays are homogeneous; an empty array is written as an array of u8.
            let elem = items.first().map_or(value_type::U8, type_id);
            if let Some(bad) = items.iter().find(|i| type_id(i) != elem) {
                return Err(build(format!(
                    "array mixes value types {elem} and {}",
                    type_id(bad)
                )));
            }
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item)?;
            }
        }
    }
    Ok(())
}

/// Quantize f32 values to the raw bytes of `ty`: F32, F16, BF16, Q8_0, Q4_0 or Q4_1.
///
/// The length must be a whole number of blocks ([`GgufError::Build`] otherwise); other types
/// give [`GgufError::UnsupportedType`]. Q8_0/Q4_0/Q4_1 follow `quantize_row_q8_0_ref`,
/// `quantize_row_q4_0_ref` and `quantize_row_q4_1_ref` of ggml's `ggml-quants.c`; F16 and BF16
/// round to nearest even (BF16 as `ggml_compute_fp32_to_bf16`, NaN made quiet).
pub fn quantize(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, GgufError> {
    let bs = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => 32,
        _ => {
            return Err(GgufError::UnsupportedType {
                path: Default::default(),
                tensor: String::new(),
                ty: format!("{ty} (quantize)"),
            })
        }
    };
    if !values.len().is_multiple_of(bs) {
        return Err(build(format!(
            "{} values are not a whole number of {ty} blocks of {bs}",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(ty.bytes_for(values.len() as u64).unwrap_or(0) as usize);
    match ty {
        GgmlType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
        GgmlType::BF16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&f32_to_bf16(v).to_le_bytes())),
        GgmlType::Q8_0 => values
            .chunks_exact(32)
            .for_each(|x| quantize_q8_0(x, &mut out)),
        GgmlType::Q4_0 => values
            .chunks_exact(32)
            .for_each(|x| quantize_q4_0(x, &mut out)),
        GgmlType::Q4_1 => values
            .chunks_exact(32)
            .for_each(|x| quantize_q4_1(x, &mut out)),
        _ => unreachable!("filtered above"),
    }
    Ok(out)
}

/// `ggml_compute_fp32_to_bf16` (ggml-impl.h): quiet NaNs, round to nearest even.
fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// `quantize_row_q8_0_ref`: d = max|x| / 127, q = round(x / d).
fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16_bytes(d));
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

/// `quantize_row_q4_0_ref`: the value of largest magnitude maps to -8; q = min(15, x/d + 8.5).
fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16_bytes(d));
    for j in 0..16 {
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        out.push(lo | (hi << 4));
    }
}

/// `quantize_row_q4_1_ref`: d = (max - min) / 15, m = min, q = min(15, (x - m)/d + 0.5).
fn quantize_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16_bytes(d));
    out.extend_from_slice(&f16_bytes(min));
    for j in 0..16 {
        let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let hi = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        out.push(lo | (hi << 4));
    }
}
