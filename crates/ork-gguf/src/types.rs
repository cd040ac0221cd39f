//! ggml tensor types (numbering from ggml.h `enum ggml_type`).

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
}
