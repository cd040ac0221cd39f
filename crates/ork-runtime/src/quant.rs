//! A quantization mode: weight dtype, activation precision and scale groups under one name.

use ork_device::ActPrecision;
use ork_pack::PackDtype;

/// A quantization mode, named as rkllm names them (`docs/chip.md`): weights × activations and
/// how the weight scales cover K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Quant {
    /// int8 weights, per-channel scales, int8 activations (the default).
    W8a8,
    /// int8 weights with one scale per 128 / 256 / 512 consecutive k, int8 activations (the
    /// chip's int8 × int8 → fp32 per-group mode). Weights whose K the group does not divide keep
    /// per-channel scales.
    W8a8G(usize),
    /// fp16 weights and activations.
    W16a16,
    /// int4 weights, per-channel scales, fp16 activations (RK3576 only).
    W4a16,
    /// int4 weights with affine groups of 32 / 64 / 128 consecutive k (a step and an offset per
    /// group, [`ork_pack::ScaleGroup::Affine`]), fp16 activations (RK3576 only; the chip's
    /// fp16 × int4 → fp32 per-group mode plus an fp16 × fp16 matmul of the offsets,
    /// `docs/chip.md`). Weights whose K the group does not divide keep per-channel scales.
    W4a16G(usize),
}

impl Quant {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: [Quant; 9] = [
        Quant::W8a8,
        Quant::W8a8G(128),
        Quant::W8a8G(256),
        Quant::W8a8G(512),
        Quant::W16a16,
        Quant::W4a16,
        Quant::W4a16G(32),
        Quant::W4a16G(64),
        Quant::W4a16G(128),
    ];

    /// Weight dtype, activation precision and scale group.
    pub fn parts(self) -> (PackDtype, ActPrecision, ork_pack::ScaleGroup) {
        use ork_pack::ScaleGroup::{Affine, Group, PerChannel};
        match self {
            Quant::W8a8 => (PackDtype::I8, ActPrecision::Int8, PerChannel),
            Quant::W8a8G(g) => (PackDtype::I8, ActPrecision::Int8, Group(g)),
            Quant::W16a16 => (PackDtype::F16, ActPrecision::F16, PerChannel),
            Quant::W4a16 => (PackDtype::I4, ActPrecision::F16, PerChannel),
            Quant::W4a16G(g) => (PackDtype::I4, ActPrecision::F16, Affine(g)),
        }
    }

    /// The name (`w8a8`, `w8a8-g128`, …).
    pub fn name(self) -> String {
        match self {
            Quant::W8a8 => "w8a8".to_owned(),
            Quant::W8a8G(g) => format!("w8a8-g{g}"),
            Quant::W16a16 => "w16a16".to_owned(),
            Quant::W4a16 => "w4a16".to_owned(),
            Quant::W4a16G(g) => format!("w4a16-g{g}"),
        }
    }
}

impl std::fmt::Display for Quant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Quant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Quant::ALL
            .iter()
            .copied()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                let names: Vec<String> = Quant::ALL.iter().map(|q| q.name()).collect();
                format!("unknown quant '{s}' (one of: {})", names.join(", "))
            })
    }
}
