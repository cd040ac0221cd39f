//! GGUF container parsing (skeleton: signatures are the contract).
use crate::{GgmlType, GgufError};
use std::path::Path;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// Integer value (any integer type, non-negative).
    pub fn as_u64(&self) -> Option<u64> {
        unimplemented!()
    }
    /// Float value (f32/f64, or integers converted).
    pub fn as_f32(&self) -> Option<f32> {
        unimplemented!()
    }
    /// String value.
    pub fn as_str(&self) -> Option<&str> {
        unimplemented!()
    }
    /// Array value.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        unimplemented!()
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// Dimensions, ne[0] (contiguous) first.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data.
    pub size: u64,
}

impl TensorInfo {
    /// Product of the dims.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {}

impl GgufFile {
    /// Map and validate.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let _ = path;
        unimplemented!()
    }
    /// The file's path.
    pub fn path(&self) -> &Path {
        unimplemented!()
    }
    /// GGUF version.
    pub fn version(&self) -> u32 {
        unimplemented!()
    }
    /// general.alignment (default 32).
    pub fn alignment(&self) -> u64 {
        unimplemented!()
    }
    /// File length in bytes.
    pub fn file_len(&self) -> u64 {
        unimplemented!()
    }
    /// A metadata value by key.
    pub fn metadata(&self, key: &str) -> Option<&MetaValue> {
        let _ = key;
        unimplemented!()
    }
    /// All metadata in file order.
    pub fn metadata_iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        std::iter::empty()
    }
    /// All tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        unimplemented!()
    }
    /// A tensor by name, O(1).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let _ = name;
        unimplemented!()
    }
    /// The tensor's bytes (borrowed from the map).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let _ = t;
        unimplemented!()
    }
    /// Drop the page-aligned interior of the tensor's pages (madvise DONTNEED).
    pub fn evict(&self, t: &TensorInfo) {
        let _ = t;
        unimplemented!()
    }
}
