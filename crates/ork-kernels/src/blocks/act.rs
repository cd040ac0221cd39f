//! Activation quantizers (ggml's `quantize_row_q8_0`, `quantize_row_q8_1`, `quantize_row_q8_K`,
//! f16/bf16/f32 copies), each with its scalar twin.
use super::{ActType, Isa, QuantFn};

/// The quantizer for `act` on `isa`, if that ISA has one.
pub(super) fn quantizer(act: ActType, isa: Isa) -> Option<QuantFn> {
    match act {
        ActType::Q8_K => super::act_k::quantizer(isa),
        _ => None,
    }
}
