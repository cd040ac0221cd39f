//! Row sources: an f32 matrix in memory, and a GGUF tensor decoded row by row.

use crate::{PackError, RowSource};
use ork_gguf::{dequant, GgmlType, GgufFile, TensorInfo};
use std::ops::Range;

/// Element range of rows `first .. first + out_len / k` of an `n × k` row-major source.
fn rows_range(k: usize, n: usize, first: usize, out_len: usize) -> Result<Range<usize>, PackError> {
    let rows = out_len / k;
    if !out_len.is_multiple_of(k) || first.checked_add(rows).is_none_or(|end| end > n) {
        return Err(PackError::Shape {
            k,
            n,
            reason: "requested rows lie outside the source",
        });
    }
    Ok(first..first + rows)
}

/// A row-major `n × k` f32 matrix in memory (row `i` = output channel `i`).
#[derive(Clone, Copy, Debug)]
pub struct MatrixRows<'a> {
    data: &'a [f32],
    k: usize,
    n: usize,
}

impl<'a> MatrixRows<'a> {
    /// View `data` as `n` rows of `k` values.
    ///
    /// # Errors
    /// [`PackError::Length`] if `data.len() != k · n`.
    pub fn new(data: &'a [f32], k: usize, n: usize) -> Result<Self, PackError> {
        match k.checked_mul(n) {
            Some(len) if len == data.len() => Ok(MatrixRows { data, k, n }),
            _ => Err(PackError::Length {
                what: "matrix rows",
                expected: k.saturating_mul(n),
                got: data.len(),
            }),
        }
    }
}

impl RowSource for MatrixRows<'_> {
    fn k(&self) -> usize {
        self.k
    }
    fn n(&self) -> usize {
        self.n
    }
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), PackError> {
        let rows = rows_range(self.k, self.n, first, out.len())?;
        out.copy_from_slice(&self.data[rows.start * self.k..rows.end * self.k]);
        Ok(())
    }
}

/// A 2-D GGUF tensor of dims `[K, N]` (ne0 = K contiguous) as `N` rows of `K` values, each
/// decoded on demand from its blocks with [`ork_gguf::dequant::dequantize`]. The source bytes
/// are borrowed (from the file's map); nothing is decoded ahead of the pack kernel.
#[derive(Clone, Copy, Debug)]
pub struct GgufRows<'a> {
    name: &'a str,
    ty: GgmlType,
    data: &'a [u8],
    k: usize,
    n: usize,
    row_bytes: usize,
}

impl<'a> GgufRows<'a> {
    /// Rows of tensor `info` of `file`.
    ///
    /// # Errors
    /// [`PackError::TensorShape`] if the tensor is not a non-empty 2-D matrix (trailing dims of 1
    /// are allowed) of a type with known block geometry, whose rows are whole blocks and whose
    /// data is exactly `N` rows.
    pub fn new(file: &'a GgufFile, info: &'a TensorInfo) -> Result<Self, PackError> {
        Self::from_blocks(&info.name, info.ty, &info.dims, file.tensor_data(info))
    }

    /// Rows of a tensor given by its parts: `data` holds `dims[1]` rows of `dims[0]` values of
    /// type `ty`, in ggml's block encoding. `name` is used in errors.
    ///
    /// # Errors
    /// As [`GgufRows::new`].
    pub fn from_blocks(
        name: &'a str,
        ty: GgmlType,
        dims: &[u64],
        data: &'a [u8],
    ) -> Result<Self, PackError> {
        let bad = |reason| PackError::TensorShape {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
            reason,
        };
        let (k, n) = match dims {
            [k, n, rest @ ..] if rest.iter().all(|&d| d == 1) => (*k, *n),
            _ => return Err(bad("not a 2-D matrix")),
        };
        let (Ok(k), Ok(n)) = (usize::try_from(k), usize::try_from(n)) else {
            return Err(bad("dims overflow usize"));
        };
        if k == 0 || n == 0 {
            return Err(bad("empty matrix"));
        }
        // ggml rows are whole blocks, so the data is N slices of `bytes_for(K)` bytes.
        let row_bytes = ty
            .bytes_for(k as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| bad("K is not a whole number of blocks of a known type"))?;
        if row_bytes.checked_mul(n) != Some(data.len()) {
            return Err(bad("data size does not match the type and dims"));
        }
        Ok(GgufRows {
            name,
            ty,
            data,
            k,
            n,
            row_bytes,
        })
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The tensor's element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Encoded bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
}

impl RowSource for GgufRows<'_> {
    fn k(&self) -> usize {
        self.k
    }
    fn n(&self) -> usize {
        self.n
    }
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), PackError> {
        let rows = rows_range(self.k, self.n, first, out.len())?;
        let bytes = &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes];
        dequant::dequantize(self.ty, bytes, out).map_err(|source| PackError::Tensor {
            tensor: self.name.to_owned(),
            source,
        })
    }
}
