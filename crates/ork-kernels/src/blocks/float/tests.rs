use super::super::{Kernel, WeightType};
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
            let want = run(Isa::Scalar, ty, k, &w, rows, &x);
            for isa in Isa::available() {
                if Kernel::with_isa(ty, isa).is_none() { continue }
                let got = run(isa, ty, k, &w, rows, &x);
                let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
                prop_assert!(same, "{:?} on {:?}: {:?} vs {:?}", ty, isa, got, want);
            }
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
