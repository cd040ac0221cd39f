//! GGUF container: metadata values, tensor infos and the open file.
use crate::parse::{self, Header};
use crate::{dequant, GgmlType, GgufError};
use ork_io::{open_regular, GuardedMap, OpenRegularError};
use std::path::{Path, PathBuf};

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
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// Float value (f32/f64, or integers converted; f64 and large integers are rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::F32(v) => Some(v),
            Self::F64(v) => Some(v as f32),
            Self::U8(v) => Some(v.into()),
            Self::I8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::U32(v) => Some(v as f32),
            Self::I32(v) => Some(v as f32),
            Self::U64(v) => Some(v as f32),
            Self::I64(v) => Some(v as f32),
            _ => None,
        }
    }
    /// String value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
    /// Array value.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
    /// Bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// Dimensions, `ne[0]` (contiguous) first.
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
    /// Values per row: `ne0` (0 for a tensor without dimensions, which a parsed file never has).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(0)
    }
    /// Number of rows: the product of `dims[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
    /// Bytes per row (`None` for a type without known geometry).
    pub fn row_bytes(&self) -> Option<u64> {
        self.ty.bytes_for(self.row_len())
    }
}

/// Where the file's bytes live.
enum Bytes {
    Mapped(GuardedMap),
    Owned(Vec<u8>),
}

/// An open, validated GGUF file.
///
/// Construction parses and checks the whole header (see the crate docs); afterwards every
/// tensor's bytes are known to lie inside the file, so the accessors need no further checks.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("file_len", &self.file_len())
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map and validate.
    ///
    /// Only a regular file is opened (a FIFO, device or directory is refused with
    /// [`GgufError::NotRegularFile`], without blocking). If the file is cut short by another
    /// program while it is open, reads of the vanished bytes yield zeros instead of killing the
    /// process; [`GgufFile::check_intact`] reports it, and callers check it after reading.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = open_regular(path).map_err(|e| match e {
            OpenRegularError::Io(e) => io(e),
            OpenRegularError::NotRegular(kind) => GgufError::NotRegularFile {
                path: path.to_path_buf(),
                kind,
            },
            _ => io(std::io::Error::other("cannot open")),
        })?;
        let map = GuardedMap::new(file).map_err(io)?;
        let header = parse::parse(map.bytes(), path)?;
        map.intact().map_err(io)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            bytes: Bytes::Mapped(map),
            header,
        })
    }

    /// Validate a GGUF image held in memory (fixtures, fuzzing). `label` stands in for the path
    /// in errors and in [`GgufFile::path`]. [`GgufFile::evict`] does nothing on such a file.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let path = label.into();
        let header = parse::parse(&bytes, &path)?;
        Ok(GgufFile {
            path,
            bytes: Bytes::Owned(bytes),
            header,
        })
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(map) => map.bytes(),
            Bytes::Owned(v) => v,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }
    /// general.alignment (default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }
    /// File length in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes().len() as u64
    }
    /// Absolute offset of the data section (the aligned end of the tensor infos).
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }
    /// A metadata value by key.
    pub fn metadata(&self, key: &str) -> Option<&MetaValue> {
        self.header
            .meta_index
            .get(key)
            .map(|&i| &self.header.metadata[i].1)
    }
    /// All metadata in file order.
    pub fn metadata_iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.header.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }
    /// All tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }
    /// A tensor by name, O(1).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The tensor's bytes (borrowed from the map).
    ///
    /// # Panics
    /// If `t` does not come from this file and its range lies outside it (a programming error,
    /// like an out-of-range index). [`GgufFile::dequantize_rows`] returns an error instead.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.range(t.offset, t.size).unwrap_or_else(|| {
            panic!(
                "{}: tensor '{}' ({}+{}) is not a tensor of this file",
                self.path.display(),
                t.name,
                t.offset,
                t.size
            )
        })
    }

    fn range(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.bytes().get(start..end)
    }

    /// Check that the bytes read from the file so far were the file's: it was not cut short
    /// while open (see the crate docs). `tensor` names what was just read, for the error.
    /// Always `Ok` for in-memory files.
    pub fn check_intact(&self, tensor: &str) -> Result<(), GgufError> {
        let Bytes::Mapped(map) = &self.bytes else {
            return Ok(());
        };
        map.intact().map_err(|source| GgufError::Changed {
            path: self.path.clone(),
            tensor: tensor.to_owned(),
            source,
        })
    }

    /// Drop the page-aligned interior of the tensor's pages (madvise DONTNEED).
    ///
    /// The range is rounded inwards (start up, end down, to the page size), so pages shared with
    /// neighbouring tensors stay. The bytes stay readable: a later access faults them back in from
    /// the file. Does nothing for in-memory files or ranges outside the file.
    pub fn evict(&self, t: &TensorInfo) {
        let _ = self.evict_range(t.offset, t.size);
    }

    /// Like [`GgufFile::evict`] for any byte range; returns how many bytes were released.
    pub fn evict_range(&self, offset: u64, len: u64) -> Result<u64, GgufError> {
        let Bytes::Mapped(map) = &self.bytes else {
            return Ok(0);
        };
        let (Ok(start), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Ok(0);
        };
        let end = start.saturating_add(len);
        map.dont_need(start..end)
            .map(|n| n as u64)
            .map_err(|source| GgufError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Decode whole rows of `t` (a row is `ne0` values) starting at row `first_row` into `out`,
    /// whose length must be a multiple of `ne0`.
    ///
    /// Errors: [`GgufError::UnsupportedType`] naming the tensor for types ork cannot decode,
    /// [`GgufError::BadRowRange`] for rows outside the tensor or a partial row,
    /// [`GgufError::TensorOutOfBounds`] if `t` does not belong to this file.
    pub fn dequantize_rows(
        &self,
        t: &TensorInfo,
        first_row: u64,
        out: &mut [f32],
    ) -> Result<(), GgufError> {
        if !t.ty.is_decodable() {
            return Err(GgufError::UnsupportedType {
                path: self.path.clone(),
                tensor: t.name.clone(),
                ty: t.ty.to_string(),
            });
        }
        let row_len = t.row_len();
        let n_rows = t.n_rows();
        let bad_range = || GgufError::BadRowRange {
            path: self.path.clone(),
            tensor: t.name.clone(),
            first_row,
            out_len: out.len() as u64,
            row_len,
            n_rows,
        };
        let out_len = out.len() as u64;
        if row_len == 0 || !out_len.is_multiple_of(row_len) {
            return Err(bad_range());
        }
        let rows = out_len / row_len;
        if first_row.checked_add(rows).is_none_or(|end| end > n_rows) {
            return Err(bad_range());
        }
        let out_of_bounds = || GgufError::TensorOutOfBounds {
            path: self.path.clone(),
            tensor: t.name.clone(),
            offset: t.offset,
            size: t.size,
            file_len: self.file_len(),
        };
        // For a tensor of this file the rows lie inside `t.offset..t.offset + t.size`; a foreign
        // `TensorInfo` may claim anything, so every step is checked.
        let row_bytes = t.row_bytes().ok_or_else(out_of_bounds)?;
        let src = first_row
            .checked_mul(row_bytes)
            .zip(rows.checked_mul(row_bytes))
            .filter(|&(rel, len)| rel.checked_add(len).is_some_and(|end| end <= t.size))
            .and_then(|(rel, len)| self.range(t.offset.checked_add(rel)?, len))
            .ok_or_else(out_of_bounds)?;
        dequant::dequantize(t.ty, src, out)
    }

    /// Decode a whole tensor into a new vector (norm weights, embeddings, tests).
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let n = usize::try_from(t.n_elements()).map_err(|_| GgufError::Overflow {
            path: self.path.clone(),
            offset: t.offset,
            what: format!("element count of tensor '{}'", t.name),
        })?;
        let mut out = vec![0f32; n];
        self.dequantize_rows(t, 0, &mut out)?;
        Ok(out)
    }
}

// An open file is shared between the packing threads and the prefetcher.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
};
