//! Run-time choice of the compiled variant of [`encode::encode_tile`]: the same safe source,
//! compiled once for the build's baseline target (SSE2 on a default x86-64 build, NEON on
//! aarch64) and, on x86-64, once more with AVX2 enabled, picked by CPU feature detection (cached
//! by `std`). On aarch64 the baseline build runs with its fp16 pieces converted by NEON's
//! `fcvtn`/`fcvtn2` (Armv8.0, always present) instead of `half`'s routine, which checks for
//! FEAT_FP16 on every four values. The `fcvtn` loop is ork-kernels'
//! (`ork_kernels::narrow`). This module holds the crate's only `unsafe`: the call into the AVX2
//! variant.

use crate::encode;
use crate::{PackError, TiledLayout};

/// [`encode::encode_tile`] in the fastest variant the CPU supports.
pub(crate) fn encode_tile(
    layout: &TiledLayout,
    first: usize,
    rows: &mut [f32],
    out: &mut [u8],
    scales: &mut [f32],
) -> Result<(), PackError> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (detected just above), which is the only requirement of
        // `encode_tile_avx2`.
        return unsafe { encode_tile_avx2(layout, first, rows, out, scales) };
    }
    #[cfg(target_arch = "aarch64")]
    return encode::encode_tile_with(layout, first, rows, out, scales, f16_piece_fcvtn);
    #[cfg(not(target_arch = "aarch64"))]
    encode_tile_portable(layout, first, rows, out, scales)
}

/// The aarch64 twin of [`crate::quant::f16_piece`]: the 32 values through ork-kernels' `fcvtn`
/// loop (round-to-nearest-even, tested bit for bit against `half` there).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn f16_piece_fcvtn(src: &[f32], dst: &mut [u8]) {
    let kt = crate::quant::KT;
    ork_kernels::narrow::f32_to_f16_le(&src[..kt], &mut dst[..2 * kt]);
}

/// [`encode::encode_tile`] compiled for the baseline target: the scalar twin of the AVX2 build
/// and of the aarch64 `fcvtn` pieces.
// On aarch64 only the twin tests call it (the `fcvtn` pieces run there).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
pub(crate) fn encode_tile_portable(
    layout: &TiledLayout,
    first: usize,
    rows: &mut [f32],
    out: &mut [u8],
    scales: &mut [f32],
) -> Result<(), PackError> {
    encode::encode_tile(layout, first, rows, out, scales)
}

/// [`encode::encode_tile`] compiled with AVX2. It performs the same IEEE f32 operations in the
/// same order as the baseline build (Rust never contracts or reassociates float math), so the
/// output is bit-identical; only the vector width differs.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_tile_avx2(
    layout: &TiledLayout,
    first: usize,
    rows: &mut [f32],
    out: &mut [u8],
    scales: &mut [f32],
) -> Result<(), PackError> {
    encode::encode_tile(layout, first, rows, out, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PackDtype;
    use proptest::prelude::*;

    /// Rows with a spread of magnitudes, ties (`x.5` after scaling), zeros and tiny values.
    fn rows(k: usize, n: usize) -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            4 => -1e3f32..1e3,
            1 => (-254i32..=254).prop_map(|h| h as f32 * 0.5),
            1 => Just(0.0f32),
            1 => (1u32..1000).prop_map(f32::from_bits),
        ];
        prop::collection::vec(value, k * n)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The dispatched variant (AVX2 on an x86-64 CPU that has it; on aarch64 the `fcvtn` fp16
        /// pieces) equals the baseline build bit for bit, codes and scales, for every dtype.
        #[test]
        fn dispatched_equals_portable(
            (k, n, w) in (1usize..130, 1usize..70)
                .prop_flat_map(|(k, n)| (Just(k), Just(n), rows(k, n)))
        ) {
            for dtype in [PackDtype::I8, PackDtype::I4, PackDtype::F16] {
                let layout = TiledLayout::new(dtype, k, n);
                let tn = dtype.n_tile();
                for (t, chunk) in w.chunks(tn * k).enumerate() {
                    let rows_in = chunk.len() / k;
                    let (mut a_rows, mut b_rows) = (chunk.to_vec(), chunk.to_vec());
                    let mut a = vec![0x5Au8; layout.n_tile_bytes()];
                    let mut b = vec![0xA5u8; layout.n_tile_bytes()];
                    let (mut sa, mut sb) = (vec![0f32; rows_in], vec![1f32; rows_in]);
                    let ra = encode_tile(&layout, t * tn, &mut a_rows, &mut a, &mut sa);
                    let rb = encode_tile_portable(&layout, t * tn, &mut b_rows, &mut b, &mut sb);
                    prop_assert!(ra.is_ok() && rb.is_ok());
                    prop_assert!(a == b, "{:?} tile {}", dtype, t);
                    prop_assert_eq!(
                        sa.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
                        sb.iter().map(|s| s.to_bits()).collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}
