use super::super::{Kernel, RowsFn, WeightType};
use super::fp16;
use crate::blocks::Isa;
use proptest::prelude::*;

const TYPES: [WeightType; 3] = [WeightType::F32, WeightType::F16, WeightType::BF16];

/// Activation values: ordinary, tiny, huge, zeros, the occasional subnormal.
fn value(r: u64) -> f32 {
    match r % 8 {
        0 => 0.0,
        1 => f32::from_bits((r >> 8) as u32 & 0x807f_ffff),
        2 => ((r >> 8) % 60_000) as f32 - 30_000.0,
        _ => ((r >> 8) % 20_001) as f32 / 1000.0 - 10.0,
    }
}

fn run(isa: Isa, ty: WeightType, k: usize, w: &[u8], rows: usize, x: &[f32]) -> Vec<f32> {
    let kern = Kernel::with_isa(ty, isa).unwrap();
    let m = x.len() / k;
    let mut a = vec![0u8; m * ty.act_type().row_bytes(k)];
    kern.quantize(x, k, &mut a);
    let mut out = vec![f32::NAN; rows * m];
    kern.rows(k, w, rows, &a, m, &mut out);
    out
}

/// Whether `ty`'s SIMD kernel here is the fp16-accumulating one (F16 on aarch64 with FEAT_FP16),
/// whose twin is `fp16::rows_scalar` rather than the `Isa::Scalar` kernel.
fn accumulates_in_fp16(ty: WeightType) -> bool {
    #[cfg(target_arch = "aarch64")]
    return ty == WeightType::F16 && std::arch::is_aarch64_feature_detected!("fp16");
    #[cfg(not(target_arch = "aarch64"))]
    return {
        let _ = ty;
        false
    };
}

/// What the twin of `ty`'s kernel on `isa` computes for the same inputs as [`run`].
fn twin(isa: Isa, ty: WeightType, k: usize, w: &[u8], rows: usize, x: &[f32]) -> Vec<f32> {
    if isa == Isa::Scalar || !accumulates_in_fp16(ty) {
        return run(Isa::Scalar, ty, k, w, rows, x);
    }
    rows_with(fp16::rows_scalar, ty, k, w, rows, x)
}

/// `rows_fn` on the activations `x` quantized for `ty`.
fn rows_with(
    rows_fn: RowsFn,
    ty: WeightType,
    k: usize,
    w: &[u8],
    rows: usize,
    x: &[f32],
) -> Vec<f32> {
    let kern = Kernel::with_isa(ty, Isa::Scalar).unwrap();
    let m = x.len() / k;
    let mut a = vec![0u8; m * ty.act_type().row_bytes(k)];
    kern.quantize(x, k, &mut a);
    let mut out = vec![f32::NAN; rows * m];
    rows_fn(k, w, rows, &a, m, &mut out);
    out
}

fn same(got: &[f32], want: &[f32]) -> bool {
    got.iter()
        .zip(want)
        .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
}

/// An f16 from a class picked by `r`: zero (either sign), ±65504, a subnormal, a value of a
/// small, middling or large exponent. The huge ones are rare (one in 64 and one in 32), so
/// that most sums stay finite in fp16 and some overflow.
fn extreme_f16(r: u64) -> f32 {
    let sign = if r & 0x100 != 0 { -1.0 } else { 1.0 };
    let bits = (r >> 9) as u16;
    let v = match r % 64 {
        0..=5 => 0.0,
        6 => 65504.0,
        7..=12 => half::f16::from_bits(bits & 0x3ff).to_f32(),
        13..=24 => half::f16::from_bits(0x0400 + bits % 0x1800).to_f32(), // 2⁻¹⁴ .. 2⁻⁸
        25 | 26 => half::f16::from_bits(0x5800 + bits % 0x2000).to_f32(), // 128 .. 65504
        _ => half::f16::from_bits(0x3000 + bits % 0x1000).to_f32(),       // 0.125 .. 2
    };
    sign * v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every SIMD kernel equals the scalar twin bit for bit (k not a multiple of 16, so the
    /// tail runs; decode's tiles of four weight rows and prefill's of four activation rows,
    /// with leftovers).
    #[test]
    fn every_isa_matches_scalar_twin(k in 1usize..300, rows in 1usize..10, m in 1usize..10, seed in any::<u64>()) {
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let x: Vec<f32> = (0..m * k).map(|_| value(next())).collect();
        for ty in TYPES {
            let w: Vec<u8> = (0..rows * ty.row_bytes(k)).map(|_| next() as u8).collect();
            for isa in Isa::available() {
                if Kernel::with_isa(ty, isa).is_none() { continue }
                let want = twin(isa, ty, k, &w, rows, &x);
                let got = run(isa, ty, k, &w, rows, &x);
                prop_assert!(same(&got, &want), "{:?} on {:?}: {:?} vs {:?}", ty, isa, got, want);
            }
        }
    }

    /// F16 with extreme values (±65504, subnormals, zeros, exponents from 2⁻²⁴ to 2¹⁵, so fp16
    /// sums overflow to ±inf and products vanish), all-zero weight rows, `k` across ggml's step
    /// of 32 (with and without leftovers): every ISA's kernel equals its twin (the fp16 twin on
    /// an aarch64 core with FEAT_FP16), and on aarch64 the f32-widening fallback equals the
    /// scalar twin whatever the CPU (so `-cpu cortex-a76` tests both kernels).
    #[test]
    fn f16_extremes_match_the_twins(k in 1usize..200, rows in 1usize..10, m in 1usize..7, zero_row in 0usize..12, seed in any::<u64>()) {
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let ty = WeightType::F16;
        let x: Vec<f32> = (0..m * k).map(|_| extreme_f16(next())).collect();
        let mut w: Vec<u8> = (0..rows * k)
            .flat_map(|_| half::f16::from_f32(extreme_f16(next())).to_le_bytes())
            .collect();
        if zero_row < rows {
            w[zero_row * 2 * k..][..2 * k].fill(0);
        }
        for isa in Isa::available() {
            let want = twin(isa, ty, k, &w, rows, &x);
            let got = run(isa, ty, k, &w, rows, &x);
            prop_assert!(same(&got, &want), "{:?}: {:?} vs {:?}", isa, got, want);
        }
        #[cfg(target_arch = "aarch64")]
        {
            let fallback = super::neon::widening(ty).unwrap();
            let got = rows_with(fallback, ty, k, &w, rows, &x);
            let want = run(Isa::Scalar, ty, k, &w, rows, &x);
            prop_assert!(same(&got, &want), "fallback: {:?} vs {:?}", got, want);
        }
    }
}

/// The twin against f64: every product is exact in f64 (f16/bf16 times f16/bf16, and f32 values
/// here with 12 significant bits), so the error is the summation's, within `k · 2⁻²⁴ · Σ|w a|`.
#[test]
fn twin_matches_f64_reference() {
    for ty in TYPES {
        for k in [1, 15, 16, 17, 100, 576] {
            let x: Vec<f32> = (0..k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0)
                .collect();
            let wv: Vec<f32> = (0..k)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 16.0)
                .collect();
            let w: Vec<u8> = match ty {
                WeightType::F32 => wv.iter().flat_map(|v| v.to_le_bytes()).collect(),
                WeightType::F16 => wv
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect(),
                _ => wv
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            };
            let got = run(Isa::Scalar, ty, k, &w, 1, &x)[0] as f64;
            let want: f64 = wv.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let bound: f64 = wv
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            assert!(
                (got - want).abs() <= k as f64 * 2f64.powi(-24) * bound,
                "{ty:?} k={k}: {got} vs {want}"
            );
        }
    }
}

/// The NaN rule for float types: IEEE arithmetic, so a NaN activation makes its row's outputs
/// NaN on every ISA, and an infinity times a nonzero weight gives ±inf or NaN, never a finite
/// value.
#[test]
fn a_nan_activation_makes_its_row_nan() {
    let k = 37;
    for ty in TYPES {
        let w: Vec<u8> = (0..2 * ty.row_bytes(k))
            .map(|i| (i % 7) as u8 + 0x30)
            .collect();
        let mut x: Vec<f32> = (0..2 * k).map(|i| i as f32 / 10.0).collect();
        x[k + 20] = f32::NAN;
        for isa in Isa::available() {
            if Kernel::with_isa(ty, isa).is_none() {
                continue;
            }
            let out = run(isa, ty, k, &w, 2, &x);
            assert!(!out[0].is_nan() && !out[2].is_nan(), "{ty:?} {isa:?}");
            assert!(out[1].is_nan() && out[3].is_nan(), "{ty:?} {isa:?}");
        }
    }
}

/// Which F16 kernel runs is the CPU's: 32·2049 products of 1 and four of 0.5 sum to 65538 in
/// ggml's fp16 order (each lane stops at 2048, `fp16::tests`) and to 65570 in f32. Where
/// `ORK_EXPECT_KERNELS` names `neon-dotprod` (the qemu run on `-cpu cortex-a76`, whose FEAT_FP16
/// comes with its dotprod), the fp16 kernel must be the one that runs, so that run cannot test
/// the fallback only.
#[test]
fn f16_accumulates_in_fp16_exactly_where_the_cpu_has_it() {
    let k = 32 * 2049 + 4;
    let w: Vec<u8> = (0..k)
        .flat_map(|i| half::f16::from_f32(if i < k - 4 { 1.0 } else { 0.5 }).to_le_bytes())
        .collect();
    let x = vec![1f32; k];
    let fp16 = accumulates_in_fp16(WeightType::F16);
    let expect = std::env::var("ORK_EXPECT_KERNELS").unwrap_or_default();
    if cfg!(target_arch = "aarch64") && expect.split(',').any(|n| n == "neon-dotprod") {
        assert!(
            fp16,
            "ORK_EXPECT_KERNELS={expect} but this CPU has no FEAT_FP16"
        );
    }
    for isa in Isa::available() {
        let got = run(isa, WeightType::F16, k, &w, 1, &x)[0];
        let want = if fp16 && isa != Isa::Scalar {
            65538.0
        } else {
            65570.0
        };
        assert_eq!(got, want, "{isa:?}");
    }
}
