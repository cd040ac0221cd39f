//! The inverse of the tiling, for tests and deep verification of stored weights.

use crate::kernel::expect_len;
use crate::quant::unpack_nibbles;
use crate::{PackDtype, PackError, PackedWeight, ScaleGroup, TiledLayout};
use half::f16;

impl PackedWeight {
    /// Check the weight is well formed: blob and scales lengths match the layout and scale group,
    /// every scale is finite, non-negative and at most [`crate::MAX_SCALE`] (offsets within
    /// ±`MAX_SCALE`), every padding element is zero.
    ///
    /// # Errors
    /// [`PackError::Shape`], [`PackError::Length`], [`PackError::Group`], [`PackError::Scale`] or
    /// [`PackError::Padding`], naming the first problem found.
    pub fn check(&self) -> Result<(), PackError> {
        let groups = self.check_lengths()?;
        let (steps, offsets) = self.group.split(&self.scales);
        if let Some((i, &scale)) = steps
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && s.is_sign_positive() && **s <= crate::MAX_SCALE))
        {
            return Err(PackError::Scale {
                row: i / groups,
                scale,
            });
        }
        // Offsets (affine groups) may be negative but must be finite and within MAX_SCALE.
        if let Some((i, scale)) = crate::bad_scale(offsets) {
            return Err(PackError::Scale {
                row: i / groups,
                scale,
            });
        }
        let l = &self.layout;
        let pad_k = (0..l.n).flat_map(|n| (l.k..l.k_pad()).map(move |k| (k, n)));
        let pad_n = (l.n..l.n_pad()).flat_map(|n| (0..l.k_pad()).map(move |k| (k, n)));
        for (k, n) in pad_k.chain(pad_n) {
            let element = l.index(k, n);
            if element_bits(l, &self.data, element) != 0 {
                return Err(PackError::Padding { element, k, n });
            }
        }
        Ok(())
    }

    /// Check blob and scale lengths; returns the number of scale groups along K.
    pub(crate) fn check_lengths(&self) -> Result<usize, PackError> {
        let l = &self.layout;
        let Some(bytes) = l.checked_blob_bytes() else {
            return Err(PackError::Shape {
                k: l.k,
                n: l.n,
                reason: "packed size overflows usize",
            });
        };
        expect_len("packed blob", bytes, self.data.len())?;
        if self.group != ScaleGroup::PerChannel && l.dtype == PackDtype::F16 {
            return Err(PackError::Group {
                group: self.group.size().unwrap_or(0),
                k: l.k,
                reason: "fp16 weights have no scales to group",
            });
        }
        expect_len(
            "scales",
            self.group.scales_len(l.k, l.n)?,
            self.scales.len(),
        )?;
        self.group.groups(l.k)
    }
}

/// The raw bits of one element (int8 byte, int4 nibble or fp16 half) at tiled index `e`.
fn element_bits(l: &TiledLayout, data: &[u8], e: usize) -> u16 {
    match l.dtype {
        PackDtype::I8 => u16::from(data[e]),
        PackDtype::I4 => unpack_nibbles(data[e / 2])[e % 2] as u8 as u16 & 0xF,
        PackDtype::F16 => u16::from_le_bytes([data[2 * e], data[2 * e + 1]]),
    }
}

/// The raw quantized codes of an int8 or int4 weight as a row-major `N × K` matrix (padding
/// dropped; int4 codes sign-extended).
///
/// # Errors
/// [`PackError::NotQuantized`] for fp16, [`PackError::Length`] / [`PackError::Shape`] if the
/// blob or scales do not match the layout.
pub fn untile_q(w: &PackedWeight) -> Result<Vec<i8>, PackError> {
    w.check_lengths()?;
    let l = &w.layout;
    let mut out = Vec::with_capacity(l.n * l.k);
    match l.dtype {
        PackDtype::I8 => {
            for n in 0..l.n {
                out.extend((0..l.k).map(|k| w.data[l.index(k, n)] as i8));
            }
        }
        PackDtype::I4 => {
            for n in 0..l.n {
                out.extend((0..l.k).map(|k| {
                    let e = l.index(k, n);
                    unpack_nibbles(w.data[e / 2])[e % 2]
                }));
            }
        }
        PackDtype::F16 => return Err(PackError::NotQuantized { dtype: l.dtype }),
    }
    Ok(out)
}

/// The weight dequantized back to f32 as a row-major `N × K` matrix (`code · scale[n]`, per group
/// `code · scale[n, k/g]`, affine `code · step[n, k/g] + offset[n, k/g]`, or the fp16 value),
/// padding dropped.
///
/// # Errors
/// [`PackError::Length`] / [`PackError::Shape`] if the blob or scales do not match the layout.
pub fn untile(w: &PackedWeight) -> Result<Vec<f32>, PackError> {
    let l = &w.layout;
    match l.dtype {
        PackDtype::I8 | PackDtype::I4 => {
            let q = untile_q(w)?;
            let groups = w.check_lengths()?;
            let (steps, offsets) = w.group.split(&w.scales);
            Ok(q.chunks_exact(l.k)
                .enumerate()
                .flat_map(|(n, row)| {
                    row.iter().enumerate().map(move |(k, &c)| {
                        let i = w.group.scale_index(groups, n, k);
                        let v = f32::from(c) * steps[i];
                        offsets.get(i).map_or(v, |&b| v + b)
                    })
                })
                .collect())
        }
        PackDtype::F16 => {
            w.check_lengths()?;
            let mut out = Vec::with_capacity(l.n * l.k);
            for n in 0..l.n {
                out.extend((0..l.k).map(|k| {
                    let e = 2 * l.index(k, n);
                    f16::from_le_bytes([w.data[e], w.data[e + 1]]).to_f32()
                }));
            }
            Ok(out)
        }
    }
}
