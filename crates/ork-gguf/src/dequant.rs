//! Block decoders (to be filled in).
use crate::{GgmlType, GgufError};

/// Decode whole blocks of `ty` from `src` into `dst`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let _ = (ty, src, dst);
    unimplemented!("skeleton")
}
