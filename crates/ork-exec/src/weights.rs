//! Reading tensors from the GGUF: shape checks and row-wise dequantization.
use crate::ExecError;
use ork_gguf::{dequant, GgmlType, GgufFile, TensorInfo};
use rayon::prelude::*;

/// A 2-D matmul weight the model needs: GGUF dims `[k, n]` (n rows of k values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightSpec {
    /// Its id in the model's manifest ([`ork_manifest::Manifest::id`]): the key a
    /// [`crate::Linear`] is asked for it by.
    pub id: ork_manifest::WeightId,
    /// Tensor name in the GGUF (`TENSOR#EXPERT` for an expert's slice): the manifest's key.
    pub name: String,
    /// Input width (`ne[0]`).
    pub k: usize,
    /// Output width (`ne[1]`).
    pub n: usize,
}

/// Look a tensor up and check its dims.
pub(crate) fn tensor_info<'g>(
    gguf: &'g GgufFile,
    name: &str,
    dims: &[u64],
) -> Result<&'g TensorInfo, ExecError> {
    let info = gguf.tensor(name).ok_or_else(|| ExecError::MissingTensor {
        tensor: name.to_owned(),
    })?;
    if info.dims != dims {
        return Err(ExecError::TensorShape {
            tensor: name.to_owned(),
            expected: dims.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(info)
}

/// Rows of a tensor as stored: the bytes of each row of `dims[0]` values are contiguous.
pub(crate) struct RowTable<'g> {
    /// The file the rows are borrowed from (checked after each read: a model cut short while
    /// open reads zeros instead of faulting, see `GgufFile::check_intact`).
    gguf: &'g GgufFile,
    pub(crate) name: String,
    pub(crate) ty: GgmlType,
    pub(crate) data: &'g [u8],
    pub(crate) row_len: usize,
    pub(crate) row_bytes: usize,
    pub(crate) rows: usize,
}

impl<'g> RowTable<'g> {
    /// Borrow the rows of a tensor with the given dims.
    pub(crate) fn new(
        gguf: &'g GgufFile,
        name: &str,
        dims: &[u64],
    ) -> Result<RowTable<'g>, ExecError> {
        let info = tensor_info(gguf, name, dims)?;
        Self::from_info(gguf, info)
    }

    /// Borrow the rows of a tensor (or a view of one, such as an expert's slice) as described.
    pub(crate) fn from_info(
        gguf: &'g GgufFile,
        info: &TensorInfo,
    ) -> Result<RowTable<'g>, ExecError> {
        let (name, dims) = (info.name.as_str(), &info.dims[..]);
        if dims.is_empty() {
            return Err(ExecError::TensorData {
                tensor: name.to_owned(),
                what: "no dimensions".to_owned(),
            });
        }
        let data = gguf.tensor_data(info);
        let row_len = usize::try_from(dims[0]).map_err(|_| too_big(name))?;
        let rows = dims[1..]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| too_big(name))?;
        if rows == 0 || row_len == 0 || !data.len().is_multiple_of(rows) {
            return Err(ExecError::TensorData {
                tensor: name.to_owned(),
                what: format!("{} bytes do not split into {rows} rows", data.len()),
            });
        }
        Ok(RowTable {
            gguf,
            name: name.to_owned(),
            ty: info.ty,
            data,
            row_len,
            row_bytes: data.len() / rows,
            rows,
        })
    }

    /// Dequantize rows `r0..r0 + out.len()/row_len` into `out`.
    pub(crate) fn dequantize_rows(&self, r0: usize, out: &mut [f32]) -> Result<(), ExecError> {
        let n = out.len() / self.row_len;
        debug_assert!(r0 + n <= self.rows && out.len().is_multiple_of(self.row_len));
        let src = &self.data[r0 * self.row_bytes..(r0 + n) * self.row_bytes];
        dequant::dequantize(self.ty, src, out).map_err(ExecError::from)?;
        self.gguf.check_intact(&self.name).map_err(ExecError::from)
    }

    /// Dequantize the whole tensor, in parallel over groups of rows.
    pub(crate) fn dequantize_all(&self) -> Result<Vec<f32>, ExecError> {
        let total = self
            .rows
            .checked_mul(self.row_len)
            .ok_or_else(|| too_big(&self.name))?;
        let mut out = vec![0.0f32; total];
        let rows_per_task = (4096 / self.row_len).max(1);
        out.par_chunks_mut(rows_per_task * self.row_len)
            .enumerate()
            .try_for_each(|(t, chunk)| self.dequantize_rows(t * rows_per_task, chunk))?;
        Ok(out)
    }
}

fn too_big(name: &str) -> ExecError {
    ExecError::TensorData {
        tensor: name.to_owned(),
        what: "element count overflows usize".to_owned(),
    }
}

/// Dequantize a whole tensor with the given dims to f32.
pub(crate) fn dequantize_tensor(
    gguf: &GgufFile,
    name: &str,
    dims: &[u64],
) -> Result<Vec<f32>, ExecError> {
    RowTable::new(gguf, name, dims)?.dequantize_all()
}

/// Dequantize a matmul weight to f32 (`spec.n` rows of `spec.k`): a 2-D tensor, or an expert's
/// slice named `TENSOR#EXPERT` of a 3-D expert tensor.
pub(crate) fn dequantize_weight(gguf: &GgufFile, spec: &WeightSpec) -> Result<Vec<f32>, ExecError> {
    let dims = [spec.k as u64, spec.n as u64];
    if !spec.name.contains('#') {
        return dequantize_tensor(gguf, &spec.name, &dims);
    }
    let view =
        ork_manifest::weight_view(gguf, &spec.name).ok_or_else(|| ExecError::MissingTensor {
            tensor: spec.name.clone(),
        })?;
    if view.dims != dims {
        return Err(ExecError::TensorShape {
            tensor: spec.name.clone(),
            expected: dims.to_vec(),
            found: view.dims,
        });
    }
    RowTable::from_info(gguf, &view)?.dequantize_all()
}
