//! ork layer 2 — **pack**: dequantize → requantize (int8 / int4 per-output-channel, or fp16) →
//! tile into the RK3588 native weight layout.
//!
//! API CONTRACT (other crates rely on these names): [`PackDtype`], [`LayoutId`], [`TiledLayout`],
//! [`PackedWeight`], [`RowSource`], [`pack`], [`untile`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod layout;

pub use layout::{LayoutId, PackDtype, TiledLayout, INT4_EVEN_K_IN_LOW_NIBBLE};

/// A weight packed into the native layout, host side.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// Tiled bytes, exactly `layout.blob_bytes()` long, padding zero.
    pub data: Vec<u8>,
    /// One f32 scale per output channel (`layout.n` entries; fp16 → all 1.0).
    pub scales: Vec<f32>,
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
}
