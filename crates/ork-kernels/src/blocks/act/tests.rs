use super::super::golden;
use super::*;
use proptest::prelude::*;

fn quantize(isa: Isa, act: ActType, x: &[f32]) -> Vec<u8> {
    let f = quantizer(act, isa).unwrap();
    let mut out = vec![0xa5u8; act.row_bytes(x.len())];
    f(x, &mut out);
    out
}

/// ork's Q8_0 / Q8_1 bytes equal ggml-cpu's own `quantize_row_q8_0` / `_q8_1` on every ISA
/// (goldens from `scripts/blocks_golden.py`; they include exact halves, where x86 ggml rounds
/// to even).
#[test]
fn q8_matches_ggml_cpu() {
    for (tag, act) in [("q8_0", ActType::Q8_0), ("q8_1", ActType::Q8_1)] {
        let lines = golden::lines(tag);
        assert_eq!(lines.len(), 5);
        for l in lines {
            let x = golden::floats(&l.head);
            let want = golden::bytes(l.fields[0][0]);
            for isa in Isa::available() {
                assert_eq!(quantize(isa, act, &x), want, "{tag} on {isa:?}");
            }
        }
    }
}

/// Values that stress the quantizer: every magnitude, halves, zeros, subnormals, f32 extremes.
fn value(r: u64) -> f32 {
    match r % 10 {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits((r >> 8) as u32 & 0x807f_ffff),
        3 => ((r >> 8) % 255) as f32 - 127.0 + 0.5,
        4 => f32::MAX,
        5 => -f32::MAX,
        _ => f32::from_bits((r >> 8) as u32 & 0xbfff_ffff) * if r & 1 == 0 { 1.0 } else { -1.0 },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Each SIMD quantizer equals its scalar twin byte for byte, NaN and infinities included.
    #[test]
    fn every_isa_matches_scalar_twin(blocks in 1usize..6, seed in any::<u64>(), non_finite in 0usize..4) {
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let mut x: Vec<f32> = (0..32 * blocks).map(|_| value(next())).collect();
        let at = (next() % x.len() as u64) as usize;
        x[at] = [x[at], f32::NAN, f32::INFINITY, f32::NEG_INFINITY][non_finite];
        for act in [ActType::Q8_0, ActType::Q8_1, ActType::F16, ActType::BF16, ActType::F32] {
            let want = quantize(Isa::Scalar, act, &x);
            for isa in Isa::available() {
                prop_assert_eq!(&quantize(isa, act, &x), &want, "{:?} on {:?}", act, isa);
            }
        }
    }
}

/// The stated rules: a block with a NaN or an infinity is `d = s = NaN`, `q = 0`; other blocks
/// of the row are untouched; int8 never −128; `s = d · Σq`.
#[test]
fn non_finite_blocks_and_ranges() {
    let mut x: Vec<f32> = (0..64).map(|i| i as f32 - 31.5).collect();
    x[40] = f32::NAN;
    for isa in Isa::available() {
        let y = quantize(isa, ActType::Q8_1, &x);
        let d0 = half::f16::from_le_bytes([y[0], y[1]]);
        assert_eq!(d0, half::f16::from_f32(31.5 / 127.0), "{isa:?}");
        assert!(y[4..36].iter().all(|&q| q != 0x80));
        let qsum: i32 = y[4..36].iter().map(|&q| q as i8 as i32).sum();
        let s0 = half::f16::from_le_bytes([y[2], y[3]]).to_f32();
        assert_eq!(s0, half::f16::from_f32(31.5 / 127.0 * qsum as f32).to_f32());
        assert!(half::f16::from_le_bytes([y[36], y[37]]).is_nan());
        assert!(half::f16::from_le_bytes([y[38], y[39]]).is_nan());
        assert!(y[40..].iter().all(|&q| q == 0), "{isa:?}");
    }
}

/// bf16 rounding (ggml's `GGML_FP32_TO_BF16`): to nearest even, NaN made quiet.
#[test]
fn bf16_rounds_to_nearest_even() {
    assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
}
