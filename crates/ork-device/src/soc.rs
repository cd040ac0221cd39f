//! What each Rockchip chip's NPU can multiply, as data in one place (see `docs/chip.md`).
//!
//! [`Soc::caps`] is the table: the matmul type triples (activation × weight → output), the
//! per-group weight-scale modes and the shape limits of each chip, restated from Rockchip's RKNPU
//! User Guide (tables 3-6 and 3-7) and the rkllm quantization lists. [`Soc::check`] refuses a
//! [`MatmulShape`] the chip cannot run with [`DeviceError::Chip`], naming the chip, the type
//! pair and the violated [`ChipLimit`]. The emulator enforces it (`EmuConfig::soc`).

use std::fmt;

use ork_pack::{PackDtype, ScaleGroup};

use crate::{ActPrecision, DeviceError};

/// A Rockchip SoC whose NPU ork models.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Soc {
    /// RK3588 (3 NPU cores): w8a8 and fp16 only; no fp16 × int8/int4.
    #[default]
    Rk3588,
    /// RK3576 (2 NPU cores): the RK3588's types plus fp16 × int8, fp16 × int4 and int8 × int4.
    Rk3576,
}

/// Element type of a matmul operand, in the vendor's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElemType {
    /// IEEE binary16.
    Fp16,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 4-bit integer (two per byte).
    Int4,
    /// Signed 16-bit integer (the output of int4 × int4).
    Int16,
    /// Signed 32-bit integer accumulators.
    Int32,
    /// IEEE binary32.
    Fp32,
}

impl ElemType {
    /// Short name ("fp16", "int8", …).
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::Fp16 => "fp16",
            ElemType::Int8 => "int8",
            ElemType::Int4 => "int4",
            ElemType::Int16 => "int16",
            ElemType::Int32 => "int32",
            ElemType::Fp32 => "fp32",
        }
    }

    /// The element type of a packed weight's dtype.
    pub const fn of_weight(d: PackDtype) -> ElemType {
        match d {
            PackDtype::I8 => ElemType::Int8,
            PackDtype::I4 => ElemType::Int4,
            PackDtype::F16 => ElemType::Fp16,
        }
    }

    /// The element type of activations in `p`.
    pub const fn of_activations(p: ActPrecision) -> ElemType {
        match p {
            ActPrecision::Int8 => ElemType::Int8,
            ActPrecision::F16 => ElemType::Fp16,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One matmul type of a chip: activation (A) × weight (B) → output (C).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulType {
    /// Activation type.
    pub a: ElemType,
    /// Weight type.
    pub b: ElemType,
    /// Output type.
    pub c: ElemType,
}

/// A per-group weight-scale mode: the types it runs in and the group sizes along K it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupMode {
    /// The type triple it runs in.
    pub ty: MatmulType,
    /// Accepted group sizes (k values per scale).
    pub sizes: &'static [usize],
}

/// Shape limits of one chip's matmul: its row of the one table of chip limits,
/// `ork_board::CHIP_LIMITS` (why that table lives in `ork-board`: its doc comment). Per weight
/// type: [`Soc::n_align`], [`Soc::n_max`].
pub type Limits = ork_board::ChipLimits;

/// Everything one chip's matmul can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caps {
    /// Supported type triples.
    pub types: &'static [MatmulType],
    /// Supported per-group weight-scale modes.
    pub groups: &'static [GroupMode],
    /// Shape limits.
    pub limits: Limits,
}

const fn t(a: ElemType, b: ElemType, c: ElemType) -> MatmulType {
    MatmulType { a, b, c }
}

use ElemType::{Fp16, Fp32, Int16, Int32, Int4, Int8};

/// RK3588 types (RKNPU User Guide table 3-6).
const RK3588_TYPES: &[MatmulType] = &[
    t(Fp16, Fp16, Fp16),
    t(Fp16, Fp16, Fp32),
    t(Int8, Int8, Int32),
    t(Int8, Int8, Fp32),
    t(Int8, Int8, Int8),
    t(Int4, Int4, Int16),
];

/// RK3576 types: the RK3588's plus the mixed ones.
const RK3576_TYPES: &[MatmulType] = &[
    t(Fp16, Fp16, Fp16),
    t(Fp16, Fp16, Fp32),
    t(Int8, Int8, Int32),
    t(Int8, Int8, Fp32),
    t(Int8, Int8, Int8),
    t(Int4, Int4, Int16),
    t(Fp16, Int8, Fp32),
    t(Fp16, Int4, Fp16),
    t(Fp16, Int4, Fp32),
    t(Int8, Int4, Int32),
];

/// rkllm's w8a8_g128 / g256 / g512.
const W8A8_GROUPS: GroupMode = GroupMode {
    ty: t(Int8, Int8, Fp32),
    sizes: &[128, 256, 512],
};

/// rkllm's w4a16_g32 / g64 / g128 (RK3576 only).
const W4A16_GROUPS: GroupMode = GroupMode {
    ty: t(Fp16, Int4, Fp32),
    sizes: &[32, 64, 128],
};

const RK3588_CAPS: Caps = Caps {
    types: RK3588_TYPES,
    groups: &[W8A8_GROUPS],
    limits: ork_board::RK3588_LIMITS,
};

const RK3576_CAPS: Caps = Caps {
    types: RK3576_TYPES,
    groups: &[W8A8_GROUPS, W4A16_GROUPS],
    limits: ork_board::RK3576_LIMITS,
};

impl Soc {
    /// Every modelled chip.
    pub const ALL: [Soc; 2] = [Soc::Rk3588, Soc::Rk3576];

    /// Lower-case name ("rk3588").
    pub const fn name(self) -> &'static str {
        self.table().name
    }

    /// NPU cores of the chip.
    pub const fn cores(self) -> u32 {
        self.table().npu_cores
    }

    /// The chip's row of the one table of chip limits (`ork_board::CHIP_LIMITS`).
    pub const fn table(self) -> &'static Limits {
        &self.caps().limits
    }

    /// N must be a multiple of this for weights of type `b` (int8 32, fp16 16, int4 64).
    pub const fn n_align(b: ElemType) -> usize {
        match b {
            ElemType::Int4 => 64,
            ElemType::Fp16 => 16,
            _ => 32,
        }
    }

    /// Largest N for weights of type `b`, `None` where unknown.
    pub const fn n_max(self, b: ElemType) -> Option<usize> {
        let l = self.table();
        match b {
            ElemType::Int8 => l.n_max_int8,
            ElemType::Fp16 => l.n_max_fp16,
            ElemType::Int4 => l.n_max_int4,
            _ => None,
        }
    }

    /// The chip's table.
    pub const fn caps(self) -> &'static Caps {
        match self {
            Soc::Rk3588 => &RK3588_CAPS,
            Soc::Rk3576 => &RK3576_CAPS,
        }
    }

    /// Output types the chip offers for activations `a` × weights `b` (empty: the pair does
    /// not exist on this chip).
    pub fn outputs(self, a: ElemType, b: ElemType) -> Vec<ElemType> {
        self.caps()
            .types
            .iter()
            .filter(|ty| ty.a == a && ty.b == b)
            .map(|ty| ty.c)
            .collect()
    }

    /// Group sizes the chip accepts for per-group weight scales with `a` × `b` (empty: no
    /// per-group mode for the pair).
    pub fn group_sizes(self, a: ElemType, b: ElemType) -> &'static [usize] {
        self.caps()
            .groups
            .iter()
            .find(|g| g.ty.a == a && g.ty.b == b)
            .map_or(&[], |g| g.sizes)
    }

    /// Check that the chip has the task's type pair (and, for per-group scales, a per-group mode
    /// with its group size; for affine groups fp16 activations and the fp16 × fp16 → fp32 matmul
    /// of the offsets, [`MatmulShape::offsets`]).
    ///
    /// # Errors
    /// [`DeviceError::Chip`] with [`ChipLimit::TypePair`], [`ChipLimit::Group`] or
    /// [`ChipLimit::AffineActivations`].
    pub fn check_types(self, s: &MatmulShape) -> Result<(), DeviceError> {
        if self.outputs(s.a, s.b).is_empty() {
            return Err(self.refuse(s, ChipLimit::TypePair));
        }
        if s.group.is_affine() && s.a != ElemType::Fp16 {
            return Err(self.refuse(s, ChipLimit::AffineActivations));
        }
        if let Some(g) = s.group.size() {
            if !self.group_sizes(s.a, s.b).contains(&g) {
                return Err(self.refuse(s, ChipLimit::Group { group: g }));
            }
        }
        if let Some(off) = s.offsets() {
            if !self.outputs(off.a, off.b).contains(&ElemType::Fp32) {
                return Err(self.refuse(&off, ChipLimit::TypePair));
            }
        }
        Ok(())
    }

    /// Check the task's K and N against the chip's limits.
    ///
    /// # Errors
    /// [`DeviceError::Chip`] with [`ChipLimit::KAlign`], [`ChipLimit::KMax`],
    /// [`ChipLimit::NAlign`] or [`ChipLimit::NMax`].
    pub fn check_limits(self, s: &MatmulShape) -> Result<(), DeviceError> {
        let l = &self.caps().limits;
        if !s.k.is_multiple_of(l.k_align) {
            return Err(self.refuse(s, ChipLimit::KAlign { align: l.k_align }));
        }
        if s.k > l.k_max {
            return Err(self.refuse(s, ChipLimit::KMax { max: l.k_max }));
        }
        let align = Soc::n_align(s.b);
        if !s.n.is_multiple_of(align) {
            return Err(self.refuse(s, ChipLimit::NAlign { align }));
        }
        if let Some(max) = self.n_max(s.b) {
            if s.n > max {
                return Err(self.refuse(s, ChipLimit::NMax { max }));
            }
        }
        Ok(())
    }

    /// [`Soc::check_types`], then [`Soc::check_limits`].
    ///
    /// # Errors
    /// As those two.
    pub fn check(self, s: &MatmulShape) -> Result<(), DeviceError> {
        self.check_types(s)?;
        self.check_limits(s)
    }

    /// Every rule the chip applies to a matmul of shape `s` whose weight is stored padded to
    /// `k_pad` × `n_pad` (its tiled layout's [`ork_pack::TiledLayout::k_pad`] and `n_pad`), as
    /// the device checks it when the matmul runs: [`Soc::check_types`], [`Soc::check_limits`] of
    /// the padded shape as submitted, and for affine groups the types and limits of the offsets
    /// matmul ([`MatmulShape::offsets`]). The one rule both the emulator and the checks made
    /// before converting (`ork plan`, `convert`, `run`) apply to every weight part.
    ///
    /// # Errors
    /// As those checks.
    pub fn check_as_run(
        self,
        s: &MatmulShape,
        k_pad: usize,
        n_pad: usize,
    ) -> Result<(), DeviceError> {
        self.check_types(s)?;
        self.check_limits(&MatmulShape {
            k: k_pad,
            n: n_pad,
            ..*s
        })?;
        if let Some(off) = s.offsets() {
            self.check_types(&off)?;
            self.check_limits(&off)?;
        }
        Ok(())
    }

    pub(crate) fn refuse(self, s: &MatmulShape, limit: ChipLimit) -> DeviceError {
        DeviceError::Chip {
            soc: self,
            a: s.a,
            b: s.b,
            k: s.k,
            n: s.n,
            limit,
        }
    }
}

impl fmt::Display for Soc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Soc {
    type Err = DeviceError;

    /// Parse "rk3588" or "rk3576" (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, DeviceError> {
        Soc::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| DeviceError::UnknownSoc { name: s.to_owned() })
    }
}

/// What a chip refuses about a matmul (carried by [`DeviceError::Chip`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChipLimit {
    /// The chip has no matmul for this activation × weight type pair.
    TypePair,
    /// The chip has no per-group weight scales for this type pair, or not this group size.
    Group {
        /// The group size asked for.
        group: usize,
    },
    /// K is not a multiple of `align`.
    KAlign {
        /// Required multiple.
        align: usize,
    },
    /// K exceeds `max` (split the weight into K-segments).
    KMax {
        /// Largest K.
        max: usize,
    },
    /// N is not a multiple of `align` for this weight type.
    NAlign {
        /// Required multiple.
        align: usize,
    },
    /// N exceeds `max` for this weight type (split the weight into N-chunks).
    NMax {
        /// Largest N.
        max: usize,
    },
    /// Affine weight groups (step and offset per group) with activations that are not fp16:
    /// the offsets run as an fp16 × fp16 matmul of the activations' group sums.
    AffineActivations,
    /// An operand of an affine weight's offsets matmul does not fit fp16 (it would become ±Inf
    /// on the chip).
    Fp16Range(Fp16Operand),
}

/// Which fp16 operand of an affine weight's offsets matmul is out of range
/// ([`ChipLimit::Fp16Range`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fp16Operand {
    /// A weight offset `b[n, j]`.
    Offset,
    /// An activation group sum `A[m, j]`.
    GroupSum,
}

impl fmt::Display for Fp16Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fp16Operand::Offset => "a weight offset",
            Fp16Operand::GroupSum => "an activation group sum",
        })
    }
}

impl fmt::Display for ChipLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ChipLimit::TypePair => f.write_str("no matmul of this type pair on the chip"),
            ChipLimit::Group { group } => write!(
                f,
                "no per-group weight scales with group size {group} for this type pair"
            ),
            ChipLimit::KAlign { align } => write!(f, "K must be a multiple of {align}"),
            ChipLimit::KMax { max } => write!(f, "K exceeds {max} (split into K-segments)"),
            ChipLimit::NAlign { align } => write!(f, "N must be a multiple of {align}"),
            ChipLimit::NMax { max } => write!(f, "N exceeds {max} (split into N-chunks)"),
            ChipLimit::AffineActivations => f.write_str(
                "affine weight groups (step and offset) need fp16 activations: the offsets run \
                 as an fp16 × fp16 matmul of the activations' group sums",
            ),
            ChipLimit::Fp16Range(what) => write!(
                f,
                "{what} of the affine offsets matmul exceeds the fp16 range (±65504)"
            ),
        }
    }
}

/// The part of a matmul a chip's table speaks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulShape {
    /// Activation type.
    pub a: ElemType,
    /// Weight type.
    pub b: ElemType,
    /// Reduction dim.
    pub k: usize,
    /// Output channels.
    pub n: usize,
    /// Weight-scale granularity.
    pub group: ScaleGroup,
}

impl MatmulShape {
    /// For affine weight groups ([`ScaleGroup::Affine`]) the shape of the second matmul the chip
    /// runs (`docs/chip.md`): the activations' group sums (`M × K/g`, padded with zeros to a
    /// multiple of 32 in K) × the offsets (`K/g × N`), fp16 × fp16 with one scale per channel;
    /// `None` otherwise (or for a group that does not divide K, which other checks refuse).
    pub fn offsets(&self) -> Option<MatmulShape> {
        let ScaleGroup::Affine(g) = self.group else {
            return None;
        };
        let groups = self.k.checked_div(g)?;
        Some(MatmulShape {
            a: ElemType::Fp16,
            b: ElemType::Fp16,
            k: groups.div_ceil(32) * 32,
            n: self.n,
            group: ScaleGroup::PerChannel,
        })
    }

    /// The shape of `task`.
    pub fn of_task(task: &crate::MatmulTask<'_>) -> Self {
        let l = task.weight.layout;
        MatmulShape {
            a: ElemType::of_activations(task.activations.precision()),
            b: ElemType::of_weight(l.dtype),
            k: l.k,
            n: l.n,
            group: task.weight.group,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's chips and the cost model's are the same chips with the same limits: both
    /// read `ork_board::CHIP_LIMITS`, and the board model's figures are the table's (its assumed
    /// RK3576 N limits are the RK3588's, the one place the table says "unknown").
    #[test]
    fn the_device_and_the_board_model_read_one_table_of_chip_limits() {
        assert_eq!(Soc::ALL.len(), ork_board::CHIP_LIMITS.len());
        assert_eq!(ork_board::CHIPS.len(), ork_board::CHIP_LIMITS.len());
        for (soc, t) in Soc::ALL.into_iter().zip(ork_board::CHIP_LIMITS) {
            assert_eq!(soc.name(), t.name);
            assert_eq!(ork_board::CHIPS.iter().filter(|c| **c == t.name).count(), 1);
            let l = soc.caps().limits;
            assert_eq!(l, t);
            let chip = ork_board::Board::named(soc.name()).unwrap().chip;
            assert_eq!(chip.name, soc.name());
            assert_eq!(chip.npu_cores, f64::from(soc.cores()));
            assert_eq!(chip.k_max, l.k_max as f64);
            assert_eq!(chip.k_segment, l.k_segment as f64);
            let n = |b: ElemType| soc.n_max(b).or(Soc::Rk3588.n_max(b)).unwrap() as f64;
            assert_eq!(chip.n_max, n(ElemType::Int8));
            assert_eq!(chip.n_max, n(ElemType::Fp16));
            assert_eq!(chip.n_max_int4, n(ElemType::Int4));
        }
    }
}
