//! ork layer 0 — **kernels**: the CPU's hot loops, each SIMD variant beside its scalar twin and a
//! property test comparing them bit for bit, with the ISA detected once at run time
//! (`docs/kernels.md`).
//!
//! - [`tile`]: int8 and float tile dot products over the RK3588 tiled weight layout (AVX2,
//!   AVX-VNNI, AVX-512 VNNI, NEON, NEON dotprod, scalar) and the per-group (`w8a8_gN`,
//!   `w4a16_gN`) partial sums; the emulated NPU (ork-device) and through it the rknn stand-in
//!   run them.
//! - [`widen`]: f16 → f32 for the executor's KV cache (F16C, `fcvtl`, scalar).
//! - [`wide`]: an f32 loop compiled for AVX2 and FMA where the CPU has them (the executor's
//!   attention and SwiGLU).
//! - [`attend`]: attention's inner loops (scores, softmax pieces, weighted sums of values).
//! - [`narrow`]: f32 → f16 pieces for the pack kernel's fp16 tiles (`fcvtn` on aarch64).
//! - [`blocks`]: matmuls straight from GGUF's quantized blocks with ggml's activation
//!   quantizers, for the CPU engine (`--device cpu`).
//!
//! The bottom layer: it depends on no other ork crate. Adding a kernel touches this crate (and
//! the dispatcher of the layer that calls it) only.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod act_i8;
pub mod attend;
pub mod blocks;
pub mod narrow;
pub mod tile;
pub mod wide;
pub mod widen;

/// Nibble order of int4 values inside a byte: `true` = the even-k element sits in the low nibble.
/// Not documented by Rockchip; unverified until run on a board (`docs/chip.md`). ork-pack writes
/// this order and re-exports the constant; [`tile::unpack_i4_tile`] reads it.
pub const INT4_EVEN_K_IN_LOW_NIBBLE: bool = true;
