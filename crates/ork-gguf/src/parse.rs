//! The GGUF header parser: a checked cursor over borrowed bytes.
//!
//! Layout (GGUF v2/v3, little-endian; ggml `docs/gguf.md`, `ggml/src/gguf.cpp`):
//! magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata key/value pairs,
//! the tensor infos (name, u32 n_dims, u64 dims…, u32 type, u64 offset relative to the data
//! section), padding to `general.alignment`, the data section.
//!
//! Every read is checked against the end of the buffer; every count is capped, compared with what
//! the remaining bytes could possibly hold, and multiplied with checked arithmetic before anything
//! is allocated.

use crate::file::{MetaValue, TensorInfo};
use crate::{GgmlType, GgufError};
use std::collections::HashMap;
use std::path::Path;

/// Most tensors accepted (large MoE files have a few thousand).
pub(crate) const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata pairs accepted.
pub(crate) const MAX_KV: u64 = 1 << 20;
/// Longest metadata key or tensor name, bytes.
pub(crate) const MAX_NAME_LEN: u64 = 1 << 16;
/// Longest string value, bytes.
pub(crate) const MAX_STRING_LEN: u64 = 1 << 30;
/// Most values (array elements included) in all metadata together. A `MetaValue` takes 32 bytes,
/// so this bounds the metadata's memory at 512 MiB even for a hostile file (real vocabularies:
/// ~50k–260k tokens, ~500k merges).
pub(crate) const MAX_META_VALUES: u64 = 1 << 24;
/// Deepest nesting of arrays in arrays.
pub(crate) const MAX_ARRAY_DEPTH: u32 = 8;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
pub(crate) const MAX_DIMS: u64 = 4;
/// Most entries reserved up front for any list; longer lists grow as they are actually read, so a
/// count that passed the caps but lies still costs no memory before its entries are there.
const PREALLOC: u64 = 4096;
/// Alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;

/// Value type ids of GGUF metadata (`enum gguf_type`).
pub(crate) mod value_type {
    pub(crate) const U8: u32 = 0;
    pub(crate) const I8: u32 = 1;
    pub(crate) const U16: u32 = 2;
    pub(crate) const I16: u32 = 3;
    pub(crate) const U32: u32 = 4;
    pub(crate) const I32: u32 = 5;
    pub(crate) const F32: u32 = 6;
    pub(crate) const BOOL: u32 = 7;
    pub(crate) const STRING: u32 = 8;
    pub(crate) const ARRAY: u32 = 9;
    pub(crate) const U64: u32 = 10;
    pub(crate) const I64: u32 = 11;
    pub(crate) const F64: u32 = 12;
}

/// Smallest encoding of one value of a type, bytes (used to bound array lengths by the bytes
/// left); `None` for an unknown type id.
fn min_encoded_size(type_id: u32) -> Option<u64> {
    use value_type::*;
    Some(match type_id {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        STRING => 8,
        ARRAY => 12,
        _ => return None,
    })
}

/// The parsed header of a GGUF file.
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, MetaValue)>,
    pub(crate) meta_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
}

/// A checked reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.buf.len());
        match end {
            Some(end) => {
                let bytes = &self.buf[self.pos..end];
                self.pos = end;
                Ok(bytes)
            }
            None => Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                offset: self.offset(),
                needed: n,
                len: self.buf.len() as u64,
                what: what(),
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn limit(
        &self,
        offset: u64,
        what: impl FnOnce() -> String,
        value: u64,
        limit: u64,
    ) -> GgufError {
        GgufError::LimitExceeded {
            path: self.path.to_path_buf(),
            offset,
            what: what(),
            value,
            limit,
        }
    }

    fn malformed(&self, offset: u64, what: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            offset,
            what,
        }
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes; at most `cap` bytes.
    fn string(&mut self, cap: u64, what: impl Fn() -> String) -> Result<String, GgufError> {
        let at = self.offset();
        let len = self.u64(|| format!("length of {}", what()))?;
        if len > cap {
            return Err(self.limit(at, || format!("length of {}", what()), len, cap));
        }
        // Reads nothing (and allocates nothing) unless all `len` bytes are there.
        let bytes = self.take(len, &what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.malformed(
                at + 8 + e.valid_up_to() as u64,
                format!("{} is not valid UTF-8", what()),
            )),
        }
    }
}

/// Parse and validate the header of a GGUF file held in `buf` (`path` only names it in errors).
pub(crate) fn parse(buf: &[u8], path: &Path) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0, path };
    let version = read_magic_and_version(&mut c)?;
    let (n_tensors, n_kv) = read_counts(&mut c)?;
    let meta = read_metadata(&mut c, n_kv)?;
    let alignment = read_alignment(&c, &meta)?;
    let mut infos = read_tensor_infos(&mut c, n_tensors)?;
    let data_offset = place_tensors(&c, alignment, &mut infos)?;
    check_no_overlap(path, &infos.tensors)?;
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata: meta.metadata,
        meta_index: meta.index,
        tensors: infos.tensors,
        tensor_index: infos.index,
    })
}

/// The metadata as read: pairs in file order, their index by key, and where each value starts.
struct Metadata {
    metadata: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
    value_offsets: Vec<u64>,
}

/// The tensor infos as read: offsets are still relative to the data section.
struct TensorInfos {
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    relative_offsets: Vec<u64>,
}

/// Check the magic and read a supported version (2 or 3).
fn read_magic_and_version(c: &mut Cursor<'_>) -> Result<u32, GgufError> {
    let (buf, path) = (c.buf, c.path);
    if buf.len() >= 4 && &buf[..4] != b"GGUF" || buf.len() < 4 && !b"GGUF".starts_with(buf) {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found: buf[..buf.len().min(4)].to_vec(),
        });
    }
    c.take(4, || "magic".into())?;
    let version = c.u32(|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    Ok(version)
}

/// Read the tensor and key/value counts, each capped by what the rest of the file could hold. A
/// tensor info takes at least 32 bytes (name length, n_dims, one dim, type, offset), a key/value
/// pair at least 13 (key length, type, one byte).
fn read_counts(c: &mut Cursor<'_>) -> Result<(u64, u64), GgufError> {
    let at = c.offset();
    let n_tensors = c.u64(|| "tensor count".into())?;
    let at_kv = c.offset();
    let n_kv = c.u64(|| "metadata count".into())?;
    let tensor_limit = MAX_TENSORS.min(c.remaining() / 32);
    if n_tensors > tensor_limit {
        return Err(c.limit(at, || "tensor count".into(), n_tensors, tensor_limit));
    }
    let kv_limit = MAX_KV.min(c.remaining() / 13);
    if n_kv > kv_limit {
        return Err(c.limit(at_kv, || "metadata count".into(), n_kv, kv_limit));
    }
    Ok((n_tensors, n_kv))
}

/// Read `n_kv` key/value pairs; a key may appear once.
fn read_metadata(c: &mut Cursor<'_>, n_kv: u64) -> Result<Metadata, GgufError> {
    let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC) as usize);
    let mut index = HashMap::with_capacity(n_kv.min(PREALLOC) as usize);
    let mut value_offsets = Vec::with_capacity(n_kv.min(PREALLOC) as usize);
    let mut budget = MAX_META_VALUES;
    for i in 0..n_kv {
        let at = c.offset();
        let key = c.string(MAX_NAME_LEN, || format!("metadata key #{i}"))?;
        if index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                path: c.path.to_path_buf(),
                key,
                offset: at,
            });
        }
        let type_at = c.offset();
        let type_id = c.u32(|| format!("type of key '{key}'"))?;
        value_offsets.push(c.offset());
        let value = read_value(c, &key, type_id, type_at, 0, &mut budget)?;
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    Ok(Metadata {
        metadata,
        index,
        value_offsets,
    })
}

/// `general.alignment` when present (an integer power of two), else the default.
fn read_alignment(c: &Cursor<'_>, meta: &Metadata) -> Result<u64, GgufError> {
    let Some(&i) = meta.index.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let at = meta.value_offsets[i];
    let value = &meta.metadata[i].1;
    let is_integer = matches!(
        value,
        MetaValue::U8(_)
            | MetaValue::I8(_)
            | MetaValue::U16(_)
            | MetaValue::I16(_)
            | MetaValue::U32(_)
            | MetaValue::I32(_)
            | MetaValue::U64(_)
            | MetaValue::I64(_)
    );
    if !is_integer {
        return Err(c.malformed(
            at,
            format!("general.alignment must be an integer, found {value:?}"),
        ));
    }
    match value.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        other => Err(GgufError::BadAlignment {
            path: c.path.to_path_buf(),
            offset: at,
            // A negative value is reported as 0: it is as invalid.
            alignment: other.unwrap_or(0),
        }),
    }
}

/// Read `n_tensors` tensor infos; a name may appear once.
fn read_tensor_infos(c: &mut Cursor<'_>, n_tensors: u64) -> Result<TensorInfos, GgufError> {
    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC) as usize);
    let mut index = HashMap::with_capacity(n_tensors.min(PREALLOC) as usize);
    let mut relative_offsets = Vec::with_capacity(n_tensors.min(PREALLOC) as usize);
    for i in 0..n_tensors {
        let info_at = c.offset();
        let name = c.string(MAX_NAME_LEN, || format!("name of tensor #{i}"))?;
        if index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor {
                path: c.path.to_path_buf(),
                tensor: name,
                offset: info_at,
            });
        }
        let (info, rel) = read_tensor_info(c, name, info_at)?;
        relative_offsets.push(rel);
        index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }
    Ok(TensorInfos {
        tensors,
        index,
        relative_offsets,
    })
}

/// Read the rest of the info of tensor `name` (whose info starts at `info_at`): its shape, type
/// and byte size, and its offset relative to the data section.
fn read_tensor_info(
    c: &mut Cursor<'_>,
    name: String,
    info_at: u64,
) -> Result<(TensorInfo, u64), GgufError> {
    let path = c.path;
    let bad_shape = |what: String| GgufError::BadShape {
        path: path.to_path_buf(),
        tensor: name.clone(),
        offset: info_at,
        what,
    };
    let dims_at = c.offset();
    let n_dims = u64::from(c.u32(|| format!("n_dims of tensor '{name}'"))?);
    if n_dims > MAX_DIMS {
        return Err(c.limit(
            dims_at,
            || format!("n_dims of tensor '{name}'"),
            n_dims,
            MAX_DIMS,
        ));
    }
    if n_dims == 0 {
        return Err(bad_shape("has no dimensions".into()));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(|| format!("dim {d} of tensor '{name}'"))?);
    }
    if let Some(d) = dims.iter().position(|&d| d == 0) {
        return Err(bad_shape(format!("dimension {d} is zero")));
    }
    // ggml counts elements in int64_t.
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::Overflow {
            path: path.to_path_buf(),
            offset: dims_at,
            what: format!("element count of tensor '{name}' {dims:?}"),
        })?;
    let type_at = c.offset();
    let type_id = c.u32(|| format!("type of tensor '{name}'"))?;
    let ty = GgmlType::from_id(type_id);
    let (Some(block_size), Some(type_size)) = (ty.block_size(), ty.type_size()) else {
        return Err(GgufError::UnknownType {
            path: path.to_path_buf(),
            tensor: name,
            offset: type_at,
            type_id,
        });
    };
    if dims[0] % block_size != 0 {
        return Err(bad_shape(format!(
            "row length ne0 = {} is not a multiple of the {ty} block size {block_size}",
            dims[0]
        )));
    }
    let size = (n_elements / block_size)
        .checked_mul(type_size)
        .ok_or_else(|| GgufError::Overflow {
            path: path.to_path_buf(),
            offset: dims_at,
            what: format!("byte size of tensor '{name}'"),
        })?;
    let rel = c.u64(|| format!("data offset of tensor '{name}'"))?;
    let info = TensorInfo {
        name,
        dims,
        ty,
        offset: 0,
        size,
    };
    Ok((info, rel))
}

/// Find the data section (the aligned end of the tensor infos) and give each tensor its absolute
/// offset; each must be aligned in the section and end inside the file. Returns the data offset.
fn place_tensors(
    c: &Cursor<'_>,
    alignment: u64,
    infos: &mut TensorInfos,
) -> Result<u64, GgufError> {
    let (path, file_len) = (c.path, c.buf.len() as u64);
    let infos_end = c.offset();
    let data_offset = infos_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Overflow {
            path: path.to_path_buf(),
            offset: infos_end,
            what: "data section offset".into(),
        })?;
    for (t, &rel) in infos.tensors.iter_mut().zip(&infos.relative_offsets) {
        let out_of_bounds = |offset: u64| GgufError::TensorOutOfBounds {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            offset,
            size: t.size,
            file_len,
        };
        let Some(abs) = data_offset.checked_add(rel) else {
            return Err(out_of_bounds(u64::MAX));
        };
        if rel % alignment != 0 || abs.checked_add(t.size).is_none_or(|end| end > file_len) {
            return Err(out_of_bounds(abs));
        }
        t.offset = abs;
    }
    Ok(data_offset)
}

/// No two tensors may share bytes (a crafted file could alias one weight's data as another's,
/// which no writer produces).
fn check_no_overlap(path: &Path, tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].size > 0)
        .collect();
    order.sort_unstable_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if b.offset < a.offset + a.size {
            return Err(GgufError::OverlappingTensors {
                path: path.to_path_buf(),
                tensor: b.name.clone(),
                other: a.name.clone(),
                offset: b.offset,
                size: b.size,
            });
        }
    }
    Ok(())
}

/// Read one value of type `type_id` for `key`; `depth` counts enclosing arrays; `budget` is the
/// number of values still allowed in the whole metadata.
fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    type_id: u32,
    type_at: u64,
    depth: u32,
    budget: &mut u64,
) -> Result<MetaValue, GgufError> {
    use value_type::*;
    if *budget == 0 {
        return Err(c.limit(
            type_at,
            || format!("number of metadata values at key '{key}'"),
            MAX_META_VALUES + 1,
            MAX_META_VALUES,
        ));
    }
    *budget -= 1;
    let what = || format!("value of key '{key}'");
    Ok(match type_id {
        U8 => MetaValue::U8(c.array::<1>(what)?[0]),
        I8 => MetaValue::I8(i8::from_le_bytes(c.array(what)?)),
        U16 => MetaValue::U16(u16::from_le_bytes(c.array(what)?)),
        I16 => MetaValue::I16(i16::from_le_bytes(c.array(what)?)),
        U32 => MetaValue::U32(u32::from_le_bytes(c.array(what)?)),
        I32 => MetaValue::I32(i32::from_le_bytes(c.array(what)?)),
        F32 => MetaValue::F32(f32::from_le_bytes(c.array(what)?)),
        U64 => MetaValue::U64(u64::from_le_bytes(c.array(what)?)),
        I64 => MetaValue::I64(i64::from_le_bytes(c.array(what)?)),
        F64 => MetaValue::F64(f64::from_le_bytes(c.array(what)?)),
        BOOL => {
            let at = c.offset();
            match c.array::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(c.malformed(
                        at,
                        format!("key '{key}': bool value {b} is neither 0 nor 1"),
                    ))
                }
            }
        }
        STRING => MetaValue::String(c.string(MAX_STRING_LEN, what)?),
        ARRAY => {
            let elem_at = c.offset();
            let elem_type = c.u32(|| format!("array element type of key '{key}'"))?;
            let Some(min_size) = min_encoded_size(elem_type) else {
                return Err(GgufError::BadValueType {
                    path: c.path.to_path_buf(),
                    key: key.to_owned(),
                    offset: elem_at,
                    type_id: elem_type,
                });
            };
            if elem_type == ARRAY && depth + 1 >= MAX_ARRAY_DEPTH {
                return Err(c.limit(
                    elem_at,
                    || format!("array nesting depth of key '{key}'"),
                    u64::from(depth) + 2,
                    u64::from(MAX_ARRAY_DEPTH),
                ));
            }
            let len_at = c.offset();
            let len = c.u64(|| format!("array length of key '{key}'"))?;
            let limit = (c.remaining() / min_size).min(*budget);
            if len > limit {
                return Err(c.limit(
                    len_at,
                    || format!("array length of key '{key}'"),
                    len,
                    limit,
                ));
            }
            let mut items = Vec::with_capacity(len.min(PREALLOC) as usize);
            for _ in 0..len {
                items.push(read_value(c, key, elem_type, elem_at, depth + 1, budget)?);
            }
            MetaValue::Array(items)
        }
        other => {
            return Err(GgufError::BadValueType {
                path: c.path.to_path_buf(),
                key: key.to_owned(),
                offset: type_at,
                type_id: other,
            })
        }
    })
}
