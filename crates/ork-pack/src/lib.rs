//! ork layer 2 — **pack**: dequantize → requantize (int8 / int4 per-output-channel, or fp16) →
//! tile into the RK3588 native weight layout.
//!
//! API CONTRACT (other crates rely on these names): [`PackDtype`], [`LayoutId`], [`TiledLayout`],
//! [`PackedWeight`], [`ScaleGroup`], [`RowSource`], [`pack`], [`pack_grouped`], [`pack_affine`],
//! [`untile()`].
//!
//! [`pack_grouped`] quantizes with one scale per output channel and group of `g` consecutive k
//! (the chip's per-group mode, `docs/chip.md`) into the same native layout.
//!
//! The kernel ([`pack`], [`pack_into`], [`pack_in`]) is fused and streaming: it runs in parallel
//! over the output's N-tiles; each task decodes the `tn` source rows of its tile through
//! [`RowSource::read_rows`] into a per-thread scratch of `tn × K` f32, computes the rows' scales,
//! quantizes and writes the tile. No f32 copy of the whole tensor is ever made. The quantization
//! rule (scale, rounding, clamping) is spelled out in the `quant` module and on [`pack`].
//!
//! Sources: [`MatrixRows`] (an f32 matrix in memory) and [`GgufRows`] (a GGUF tensor decoded
//! block row by block row through `ork_gguf::dequant`). [`untile()`] / [`untile_q`] invert the
//! tiling for checks; [`bench_pack`] measures throughput.
//!
//! Speed: the per-tile encoder is safe code written to autovectorize (no `roundf` call, no
//! float-to-int conversion: codes come out of a magic-constant add). On x86-64 it is compiled a
//! second time with AVX2 and picked at run time (the crate's only `unsafe`, in `dispatch`),
//! checked bit-exact against the baseline build by a property test.
// `unsafe` is confined to `dispatch` (calling the AVX2 build of the encoder).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

mod bench;
#[allow(unsafe_code)]
mod dispatch;
mod encode;
mod group;
mod kernel;
mod layout;
mod quant;
mod source;
mod untile;

pub use bench::{bench_pack, PackBenchResult};
pub use group::{pack_affine, pack_grouped, ScaleGroup};
pub use kernel::{pack, pack_in, pack_into};
pub use layout::{LayoutId, PackDtype, TiledLayout, INT4_EVEN_K_IN_LOW_NIBBLE};
pub use source::{GgufRows, MatrixRows};
pub use untile::{untile, untile_q};

/// The largest magnitude a stored scale (or affine offset) may have: 65504, the largest fp16
/// value. Weights are refused above fp16's range when packed ([`PackError::F16Overflow`]), so a
/// scale (at most the largest weight / 7) and an offset (between a group's smallest and largest
/// weight) never exceed it; a stored scale beyond it is damage, not a model (readers refuse it
/// as they refuse a non-finite one; the chip takes offsets as fp16 values).
pub const MAX_SCALE: f32 = 65504.0;

/// The first scale of `scales` that is not finite or beyond ±[`MAX_SCALE`], with its index.
pub fn bad_scale(scales: &[f32]) -> Option<(usize, f32)> {
    scales
        .iter()
        .copied()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && s.abs() <= MAX_SCALE))
}

/// A weight packed into the native layout, host side.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// Tiled bytes, exactly `layout.blob_bytes()` long, padding zero.
    pub data: Vec<u8>,
    /// The scales: with [`ScaleGroup::PerChannel`] one f32 per output channel (`layout.n`
    /// entries; fp16 → all 1.0); with [`ScaleGroup::Group`]`(g)` one per output channel and group
    /// of `g` consecutive k, `layout.n · k/g` entries in the order `[N][K/g]` (the order the
    /// vendor runtime most likely expects; unverified on a board, see `docs/chip.md`); with
    /// [`ScaleGroup::Affine`]`(g)` those steps followed by as many offsets, same order
    /// ([`ScaleGroup::split`]).
    pub scales: Vec<f32>,
    /// How the scales cover K.
    pub group: ScaleGroup,
}

/// Where the pack kernel reads rows of the source weight from (rows = output channels, each of
/// `k()` values). Implemented over GGUF tensors (decode one block row on demand) and over plain
/// f32 matrices in tests.
pub trait RowSource: Sync {
    /// Length of a row (reduction dim K).
    fn k(&self) -> usize;
    /// Number of rows (output channels N).
    fn n(&self) -> usize;
    /// Decode rows `first .. first + out.len() / k()` into `out` as f32.
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), PackError>;
}

/// Pack-layer errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// The source could not be decoded.
    #[error("decoding source rows: {0}")]
    Source(String),
    /// The source contains NaN or infinity at a row (quantizing it would give garbage).
    #[error("non-finite value in output channel {row}")]
    NonFinite {
        /// Output channel index.
        row: usize,
    },
    /// Shapes that the layout cannot hold.
    #[error("bad shape k={k} n={n}: {reason}")]
    Shape {
        /// K.
        k: usize,
        /// N.
        n: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A row holds a finite value too large for fp16 (it would become ±Inf).
    #[error("output channel {row}: {value} overflows fp16")]
    F16Overflow {
        /// Output channel index.
        row: usize,
        /// The row's largest magnitude.
        value: f32,
    },
    /// Decoding a GGUF tensor's blocks failed.
    #[error("tensor '{tensor}': {source}")]
    Tensor {
        /// Tensor name.
        tensor: String,
        /// What the GGUF layer reported.
        #[source]
        source: ork_gguf::GgufError,
    },
    /// A GGUF tensor's dimensions or byte size do not describe a matmul weight.
    #[error("tensor '{tensor}' (dims {dims:?}): {reason}")]
    TensorShape {
        /// Tensor name.
        tensor: String,
        /// Its GGUF dims, ne0 first.
        dims: Vec<u64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A buffer (output blob, scales, source rows) has the wrong length.
    #[error("{what}: expected {expected} entries, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Length the layout requires.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A packed weight has a non-zero byte where the layout has padding.
    #[error("non-zero padding at element {element} (k={k}, n={n})")]
    Padding {
        /// Element index in the tiled order.
        element: usize,
        /// Padded k coordinate.
        k: usize,
        /// Padded n coordinate.
        n: usize,
    },
    /// A packed weight carries a scale that is negative, NaN or infinite.
    #[error("output channel {row}: invalid scale {scale}")]
    Scale {
        /// Output channel index.
        row: usize,
        /// The stored scale.
        scale: f32,
    },
    /// Raw quantized codes were asked of a weight that is not quantized (fp16).
    #[error("{dtype:?} weights have no quantized codes")]
    NotQuantized {
        /// The weight's dtype.
        dtype: PackDtype,
    },
    /// A scale group that does not fit the weight (not a positive multiple of 32, or not a
    /// divisor of K), or a dtype without per-group quantization.
    #[error("scale group {group} for k={k}: {reason}")]
    Group {
        /// The group size asked for.
        group: usize,
        /// The weight's K.
        k: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The thread pool for a measured run could not be built.
    #[error("building the pack thread pool: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
}
