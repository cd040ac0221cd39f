//! ggml tensor types (numbering from ggml.h `enum ggml_type`) and their block geometry.

use std::fmt;

/// A ggml tensor element type as stored in GGUF tensor infos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// 4-bit, 32-element blocks, f16 scale.
    Q4_0,
    /// 4-bit, 32-element blocks, f16 scale and min.
    Q4_1,
    /// 5-bit, 32-element blocks, f16 scale.
    Q5_0,
    /// 5-bit, 32-element blocks, f16 scale and min.
    Q5_1,
    /// 8-bit, 32-element blocks, f16 scale.
    Q8_0,
    /// 8-bit with sums (activation type).
    Q8_1,
    /// 2-bit k-quant, 256-element super-blocks.
    Q2_K,
    /// 3-bit k-quant.
    Q3_K,
    /// 4-bit k-quant.
    Q4_K,
    /// 5-bit k-quant.
    Q5_K,
    /// 6-bit k-quant.
    Q6_K,
    /// 8-bit k-quant (activation type).
    Q8_K,
    /// bfloat16.
    BF16,
    /// Any other ggml type id (IQ*, TQ*, integer types, …): recognised in the file, not decodable.
    Other(u32),
}

/// Block geometry of one type id: `(name, elements per block, bytes per block)`.
///
/// Source: the `type_traits` table in ggml's `ggml/src/ggml.c` (`blck_size`, `type_size` =
/// `sizeof(block_xxx)` from `ggml-common.h`), cross-checked against `GGML_QUANT_SIZES` in
/// gguf-py 0.19 `gguf/constants.py`. One deliberate difference: gguf-py lists Q8_1 as 40 bytes,
/// ggml's `block_q8_1` (two `ggml_half` + 32 × int8) is 36; ggml is what reads the files.
/// Ids 4, 5 (Q4_2, Q4_3) and 31–33, 36–38 (the repacked Q4_0_x_y / IQ4_NL_x_y) were removed
/// from ggml and are rejected by llama.cpp's reader; they are unknown here as well.
const GEOMETRY: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 2 + 16),
    (3, "Q4_1", 32, 2 + 2 + 16),
    (6, "Q5_0", 32, 2 + 4 + 16),
    (7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (8, "Q8_0", 32, 2 + 32),
    (9, "Q8_1", 32, 2 + 2 + 32),
    (10, "Q2_K", 256, 2 + 2 + 256 / 16 + 256 / 4),
    (11, "Q3_K", 256, 2 + 256 / 4 + 256 / 8 + 12),
    (12, "Q4_K", 256, 2 + 2 + 256 / 2 + 12),
    (13, "Q5_K", 256, 2 + 2 + 256 / 2 + 256 / 8 + 12),
    (14, "Q6_K", 256, 2 + 256 / 2 + 256 / 4 + 256 / 16),
    (15, "Q8_K", 256, 4 + 256 + 256 / 8),
    (16, "IQ2_XXS", 256, 2 + 256 / 4),
    (17, "IQ2_XS", 256, 2 + 256 / 4 + 256 / 32),
    (18, "IQ3_XXS", 256, 2 + 256 / 4 + 256 / 8),
    (19, "IQ1_S", 256, 2 + 256 / 8 + 256 / 16),
    (20, "IQ4_NL", 32, 2 + 16),
    (21, "IQ3_S", 256, 2 + 256 / 4 + 256 / 8 + 256 / 32 + 4),
    (22, "IQ2_S", 256, 2 + 256 / 4 + 256 / 16),
    (23, "IQ4_XS", 256, 2 + 2 + 256 / 2 + 256 / 64),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 256 / 8 + 256 / 16 + 256 / 32),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 2 + 4 * 13),
    (35, "TQ2_0", 256, 2 + 64),
    (39, "MXFP4", 32, 1 + 16),
    (40, "NVFP4", 64, 4 + 32),
    (41, "Q1_0", 128, 2 + 16),
];

impl GgmlType {
    /// From the on-disk type id.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            other => Self::Other(other),
        }
    }
    /// The on-disk type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::BF16 => 30,
            Self::Other(id) => id,
        }
    }

    fn geometry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        let id = self.id();
        GEOMETRY.iter().find(|g| g.0 == id)
    }

    /// ggml's name of the type (`"Q4_1"`, `"IQ2_XXS"`, …), `None` for an id ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        self.geometry().map(|g| g.1)
    }

    /// Elements per block (1 for plain scalar types), `None` for an unknown id.
    pub fn block_size(self) -> Option<u64> {
        self.geometry().map(|g| g.2)
    }

    /// Bytes per block, `None` for an unknown id.
    pub fn type_size(self) -> Option<u64> {
        self.geometry().map(|g| g.3)
    }

    /// Whether [`crate::dequant::dequantize`] can decode this type.
    pub fn is_decodable(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q5_1
                | Self::Q8_0
                | Self::Q2_K
                | Self::Q3_K
                | Self::Q4_K
                | Self::Q5_K
                | Self::Q6_K
        )
    }

    /// Bytes taken by `n_elements` values of this type, `None` if the type is unknown, the count is
    /// not a whole number of blocks, or the size overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let (bs, ts) = (self.block_size()?, self.type_size()?);
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(ts)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "type#{}", self.id()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_roundtrip_and_known_types_have_geometry() {
        for id in 0..64 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
        for &(id, name, bs, ts) in GEOMETRY {
            let ty = GgmlType::from_id(id);
            assert_eq!(ty.name(), Some(name));
            assert_eq!(ty.to_string(), name);
            assert!(bs >= 1 && ts >= 1);
        }
        // Every named variant has a geometry.
        for id in 0..64 {
            let ty = GgmlType::from_id(id);
            if !matches!(ty, GgmlType::Other(_)) {
                assert!(ty.block_size().is_some(), "{ty:?}");
            }
        }
        assert_eq!(GgmlType::Q4_1.type_size(), Some(20));
        assert_eq!(GgmlType::Q6_K.type_size(), Some(210));
        assert_eq!(GgmlType::Other(4).block_size(), None);
        assert_eq!(GgmlType::Other(99).to_string(), "type#99");
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
