//! The Q8_K activation quantizer (ggml's `block_q8_K`: f32 `d`, 256 int8, 16 i16 group sums),
//! the activations of every k-quant kernel.
//!
//! What ggml's CPU backend runs: `quantize_row_q8_K` in `ggml-cpu/arch/x86/quants.c` and
//! `ggml-cpu/arch/arm/quants.c` both call `quantize_row_q8_K_ref` (`ggml/src/ggml-quants.c`;
//! llama.cpp as vendored by llama-cpp-python 0.3.36), so x86 and aarch64 compute the same bytes,
//! and so does this one scalar quantizer (no SIMD variant: it runs once per activation row, not
//! per weight row). Per 256 values:
//!
//! * `max` = the first value of largest magnitude (signed), `amax = |max|`;
//! * `amax = 0`: `d = 0`, all quants and sums 0;
//! * else `iscale = −127 / max` (f32), `q = int8(min(127, nearest_int(iscale·x)))` (ggml's
//!   `+ 12582912` trick, [`nearest_int`]: half to even for ordinary values), the 16 group sums
//!   of the int8 quants, and `d = 1 / iscale` (f32).
//!
//! The fixture test compares these bytes with ggml's own `from_float` for Q8_K (through
//! llama-cpp-python's `libggml-cpu`, `scripts/q8k_fixture.py`).
//!
//! NaN rule: a block holding a NaN gets `d = NaN` (quants and sums 0), so every output computed
//! from it is NaN. ggml skips NaN in the max and quantizes it to 0, silently dropping it; ork
//! makes it visible instead. An infinity follows ggml's arithmetic (`iscale = −0`, `d = ∓∞`,
//! quants 0), which also gives NaN outputs (`∞ · 0`).

use super::{Isa, QuantFn};

/// Values per block.
const QK_K: usize = 256;
/// Bytes per block.
const BLOCK: usize = 292;

/// The Q8_K quantizer for `isa`: the one scalar quantizer, which every ISA runs.
pub(super) fn quantizer(isa: Isa) -> Option<QuantFn> {
    let _ = isa;
    Some(quantize_row_q8_k)
}

/// Quantize `x` (a multiple of 256 values) into `x.len() / 256` Q8_K blocks in `dst`.
///
/// # Panics
/// If `dst` is not exactly `x.len() / 256 · 292` bytes or `x.len()` is not a multiple of 256.
pub(crate) fn quantize_row_q8_k(x: &[f32], dst: &mut [u8]) {
    assert!(x.len().is_multiple_of(QK_K) && dst.len() == x.len() / QK_K * BLOCK);
    for (xb, yb) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BLOCK)) {
        quantize_block(xb, yb);
    }
}

/// ggml's `nearest_int`: the low 23 bits of `v + 1.5·2²³` minus `2²²`. For `|v| < 2²²` that is
/// `v` rounded half to even; it is reproduced bit for bit rather than with `round_ties_even`
/// because blocks whose largest magnitude is below ~1e-37 make `iscale` infinite, and ggml's
/// trick then turns `±∞` and NaN into quants that, truncated to int8 (C's conversion, Rust's
/// `as i8`), are 0.
fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// One block (see the module docs).
fn quantize_block(x: &[f32], y: &mut [u8]) {
    let (mut max, mut amax, mut nan) = (0.0f32, 0.0f32, false);
    for &v in x {
        let av = v.abs();
        if av > amax {
            amax = av;
            max = v;
        }
        nan |= v.is_nan();
    }
    y.fill(0);
    if nan {
        y[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        return;
    }
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0f32 / max;
    let (qs, bsums) = y[4..].split_at_mut(QK_K);
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for (g, out) in bsums.chunks_exact_mut(2).enumerate() {
        let sum: i32 = qs[16 * g..16 * g + 16]
            .iter()
            .map(|&q| i32::from(q as i8))
            .sum();
        out.copy_from_slice(&(sum as i16).to_le_bytes());
    }
    y[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
}
