//! The k-quant kernels: ggml's own bytes and values (fixture from `scripts/kquants_golden.py`),
//! an f64 reference, every SIMD kernel against the scalar twin bit for bit, and the NaN rule.

use proptest::prelude::*;

use super::super::act_k::quantize_row_q8_k;
use super::super::{Isa, Kernel, WeightType};
use super::{KType, Q8K_BSUMS, Q8K_BYTES, QK_K};

const TYPES: [WeightType; 6] = [
    WeightType::Q2_K,
    WeightType::Q3_K,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
    WeightType::IQ4_XS,
];

const GOLDEN: &str = include_str!("../../../tests/golden/kquants.json");

/// The bytes of the hex string `key` in the flat fixture object.
fn golden(key: &str) -> Vec<u8> {
    let tag = format!("\"{key}\": \"");
    let start = GOLDEN
        .find(&tag)
        .unwrap_or_else(|| panic!("fixture lacks {key}"))
        + tag.len();
    let hex = &GOLDEN[start..start + GOLDEN[start..].find('"').unwrap()];
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f16(b: &[u8], o: usize) -> f64 {
    f64::from(half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32())
}

/// The 6-bit scale and min `j` of Q4_K/Q5_K, as ggml's `get_scale_min_k4` defines them.
fn k4(q: &[u8], j: usize) -> (f64, f64) {
    let (s, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (f64::from(s), f64::from(m))
}

/// Dequantize one super-block in f64, following the loops of ggml's `dequantize_row_q*_K`
/// (written here independently of the kernels' decode).
fn deq(ty: WeightType, b: &[u8]) -> Vec<f64> {
    let mut y = Vec::with_capacity(QK_K);
    match ty {
        WeightType::Q2_K => {
            let (d, dmin) = (f16(b, 80), f16(b, 82));
            let mut is = 0;
            for n in 0..2 {
                let q = &b[16 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let sc = b[is];
                        is += 1;
                        for l in 0..16 {
                            let v = f64::from((q[l + 16 * half] >> shift) & 3);
                            y.push(d * f64::from(sc & 15) * v - dmin * f64::from(sc >> 4));
                        }
                    }
                }
            }
        }
        WeightType::Q3_K => {
            let d = f16(b, 108);
            let raw = &b[96..108];
            let mut sc = [0i32; 16];
            for (j, s) in sc.iter_mut().enumerate() {
                let lo = if j < 8 { raw[j] & 15 } else { raw[j - 8] >> 4 };
                let hi = (raw[8 + j % 4] >> (2 * (j / 4))) & 3;
                *s = i32::from(lo | (hi << 4)) - 32;
            }
            let (hm, mut m, mut is) = (&b[0..32], 1u8, 0);
            for n in 0..2 {
                let q = &b[32 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let dl = d * f64::from(sc[is]);
                        is += 1;
                        for l in 16 * half..16 * half + 16 {
                            let v =
                                i32::from((q[l] >> shift) & 3) - if hm[l] & m != 0 { 0 } else { 4 };
                            y.push(dl * f64::from(v));
                        }
                    }
                    m <<= 1;
                }
            }
        }
        WeightType::Q4_K | WeightType::Q5_K => {
            let five = ty == WeightType::Q5_K;
            let (d, dmin) = (f16(b, 0), f16(b, 2));
            let qs = if five { &b[48..176] } else { &b[16..144] };
            for c in 0..4 {
                for (part, j) in [(0, 2 * c), (1, 2 * c + 1)] {
                    let (sc, mn) = k4(&b[4..16], j);
                    for l in 0..32 {
                        let mut v = (qs[32 * c + l] >> (4 * part)) & 15;
                        if five && b[16 + l] & (1 << j) != 0 {
                            v += 16;
                        }
                        y.push(d * sc * f64::from(v) - dmin * mn);
                    }
                }
            }
        }
        WeightType::Q6_K => y.extend(deq_q6(b)),
        WeightType::IQ4_XS => y.extend(deq_iq4xs(b)),
        _ => unreachable!(),
    }
    y
}

/// Q6_K in f64, as ggml's `dequantize_row_q6_K`.
fn deq_q6(b: &[u8]) -> Vec<f64> {
    let d = f16(b, 208);
    let mut out = [0f64; QK_K];
    for n in 0..2 {
        let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 15) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (t, q) in q.into_iter().enumerate() {
                let s = f64::from(sc[is + 2 * t] as i8);
                out[128 * n + 32 * t + l] = d * s * f64::from(i32::from(q) - 32);
            }
        }
    }
    out.to_vec()
}

/// IQ4_XS in f64, as ggml's `dequantize_row_iq4_xs`.
fn deq_iq4xs(b: &[u8]) -> Vec<f64> {
    let mut y = Vec::with_capacity(QK_K);
    const KV: [i32; 16] = [
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    ];
    let d = f16(b, 0);
    let sh = u32::from(u16::from_le_bytes([b[2], b[3]]));
    for ib in 0..8 {
        let lo = u32::from(b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
        let ls = lo | (((sh >> (2 * ib)) & 3) << 4);
        let dl = d * (f64::from(ls) - 32.0);
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        y.extend(qs.iter().map(|&q| dl * f64::from(KV[usize::from(q & 15)])));
        y.extend(qs.iter().map(|&q| dl * f64::from(KV[usize::from(q >> 4)])));
    }
    y
}

/// A Q8_K row's values in f64 (`d·q`).
fn deq_act(a: &[u8]) -> Vec<f64> {
    a.chunks_exact(Q8K_BYTES)
        .flat_map(|b| {
            let d = f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            b[4..4 + QK_K].iter().map(move |&q| d * f64::from(q as i8))
        })
        .collect()
}

fn bytes_of(ty: WeightType) -> usize {
    ty.geometry().1
}

#[test]
fn block_sizes_match_ggml() {
    for (ty, t) in TYPES.iter().zip([
        KType::Q2,
        KType::Q3,
        KType::Q4,
        KType::Q5,
        KType::Q6,
        KType::Iq4Xs,
    ]) {
        assert_eq!(t.bytes(), bytes_of(*ty), "{}", ty.name());
        assert_eq!(KType::of(*ty), Some(t));
    }
}

#[test]
fn q8k_bytes_equal_ggml() {
    let x = f32s(&golden("x"));
    let want = golden("q8k");
    let mut got = vec![0xAAu8; want.len()];
    quantize_row_q8_k(&x, &mut got);
    for (b, (g, w)) in got
        .chunks(Q8K_BYTES)
        .zip(want.chunks(Q8K_BYTES))
        .enumerate()
    {
        assert_eq!(g, w, "block {b}");
    }
}

#[test]
fn test_dequant_equals_ggml() {
    for ty in TYPES {
        let w = golden(&format!("{}_w", ty.name()));
        let want = f32s(&golden(&format!("{}_deq", ty.name())));
        let got: Vec<f64> = w.chunks(bytes_of(ty)).flat_map(|b| deq(ty, b)).collect();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-6 * f64::from(w).abs().max(1e-3);
            assert!(
                (g - f64::from(w)).abs() <= tol,
                "{} value {i}: {g} vs ggml {w}",
                ty.name()
            );
        }
    }
}

/// ork's result on ggml's blocks is within rounding of ggml's own `vec_dot` (a different float
/// order: the bound is relative to `Σ|w·a|`).
#[test]
fn dot_close_to_ggml_vec_dot() {
    let acts = golden("q8k");
    let k = acts.len() / Q8K_BYTES * QK_K;
    let a = deq_act(&acts);
    for ty in TYPES {
        let w = golden(&format!("{}_w", ty.name()));
        let ggml = f64::from(f32s(&golden(&format!("{}_dot", ty.name())))[0]);
        let wd: Vec<f64> = w.chunks(bytes_of(ty)).flat_map(|b| deq(ty, b)).collect();
        let mag: f64 = wd.iter().zip(&a).map(|(x, y)| (x * y).abs()).sum();
        for isa in Isa::available() {
            let Some(kern) = Kernel::with_isa(ty, isa) else {
                continue;
            };
            let mut out = [0f32];
            kern.rows(k, &w, 1, &acts, 1, &mut out);
            let d = (f64::from(out[0]) - ggml).abs();
            assert!(
                d <= 1e-5 * mag,
                "{} {}: {} vs ggml {ggml}",
                ty.name(),
                isa.name(),
                out[0]
            );
        }
    }
}

/// Random generator for test data (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn f16_scale(&mut self, extreme: bool) -> [u8; 2] {
        let h = match (extreme, self.next() % 8) {
            (true, 0) => half::f16::MAX,
            (true, 1) => half::f16::from_bits(1),
            (true, 2) => half::f16::ZERO,
            (true, 3) => half::f16::from_bits(0x8001),
            (true, 4) => half::f16::MIN,
            _ => half::f16::from_f32((self.next() % 2000) as f32 * 1e-4 - 0.05),
        };
        h.to_le_bytes()
    }
}

/// `rows` random weight rows of `nb` super-blocks; `extreme` puts f16 max / subnormal / zero
/// scales in some blocks, and a few blocks are all zero.
fn weights(ty: WeightType, nb: usize, rows: usize, rng: &mut Rng, extreme: bool) -> Vec<u8> {
    let size = bytes_of(ty);
    let scales: &[usize] = match ty {
        WeightType::Q2_K => &[80, 82],
        WeightType::Q3_K => &[108],
        WeightType::Q6_K => &[208],
        WeightType::IQ4_XS => &[0],
        _ => &[0, 2],
    };
    let mut w: Vec<u8> = (0..nb * rows * size).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(size) {
        if rng.next().is_multiple_of(16) {
            blk.fill(0);
            continue;
        }
        for &o in scales {
            let s = rng.f16_scale(extreme);
            blk[o..o + 2].copy_from_slice(&s);
        }
    }
    w
}

/// `m` Q8_K rows of random quants (the whole int8 range, −128 included), their true group
/// sums, and scales that include extremes.
fn acts(nb: usize, m: usize, rng: &mut Rng) -> Vec<u8> {
    let mut a = vec![0u8; m * nb * Q8K_BYTES];
    for blk in a.chunks_exact_mut(Q8K_BYTES) {
        let d: f32 = match rng.next() % 6 {
            0 => 0.0,
            1 => f32::MAX,
            2 => 1e-40,
            _ => (rng.next() % 1000) as f32 * 1e-3,
        };
        blk[0..4].copy_from_slice(&d.to_le_bytes());
        let zero = rng.next().is_multiple_of(10);
        for g in 0..16 {
            let mut sum = 0i32;
            for l in 0..16 {
                let q = if zero { 0 } else { rng.next() as i8 };
                blk[4 + 16 * g + l] = q as u8;
                sum += i32::from(q);
            }
            let o = 4 + QK_K + 2 * g;
            blk[o..o + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
    a
}

fn run(ty: WeightType, isa: Isa, k: usize, w: &[u8], rows: usize, a: &[u8], m: usize) -> Vec<f32> {
    let kern = Kernel::with_isa(ty, isa).expect("kernel");
    let mut out = vec![f32::NAN; rows * m];
    kern.rows(k, w, rows, a, m, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every available SIMD kernel equals the scalar twin bit for bit (NaN payloads aside: a NaN
    /// must be NaN on both), M = 1 and M > 1, with extreme and zero scales and all-zero blocks;
    /// row counts up to 18 reach the x86 M > 1 panels (eight rows) with and without leftovers.
    #[test]
    fn every_isa_matches_scalar_twin(t in 0usize..6, nb in 1usize..5, rows in 1usize..19, m in 1usize..7, extreme in any::<bool>(), seed in any::<u64>()) {
        let ty = TYPES[t];
        let mut rng = Rng(seed | 1);
        let w = weights(ty, nb, rows, &mut rng, extreme);
        let a = acts(nb, m, &mut rng);
        let k = nb * QK_K;
        let want = run(ty, Isa::Scalar, k, &w, rows, &a, m);
        for isa in Isa::available() {
            if Kernel::with_isa(ty, isa).is_none() { continue; }
            let got = run(ty, isa, k, &w, rows, &a, m);
            for (i, (g, s)) in got.iter().zip(&want).enumerate() {
                prop_assert!(g.to_bits() == s.to_bits() || (g.is_nan() && s.is_nan()),
                    "{} {} out {i}: {g} vs scalar {s}", ty.name(), isa.name());
            }
            // M > 1 rows equal the same row computed alone (M = 1 path).
            for i in 0..m {
                let one = run(ty, isa, k, &w, rows, &a[i * nb * Q8K_BYTES..(i + 1) * nb * Q8K_BYTES], 1);
                for r in 0..rows {
                    let (g, s) = (got[r * m + i], one[r]);
                    prop_assert!(g.to_bits() == s.to_bits() || (g.is_nan() && s.is_nan()));
                }
            }
        }
    }

    /// The scalar twin against an f64 reference (ggml's dequantization in f64 times the Q8_K
    /// values): relative to `Σ|w·a|`, within a few f32 roundings per super-block.
    #[test]
    fn scalar_matches_f64_reference(t in 0usize..6, nb in 1usize..9, seed in any::<u64>()) {
        let ty = TYPES[t];
        let mut rng = Rng(seed | 1);
        let w = weights(ty, nb, 2, &mut rng, false);
        let k = nb * QK_K;
        let x: Vec<f32> = (0..k).map(|_| (rng.next() % 20001) as f32 * 1e-4 - 1.0).collect();
        let mut a = vec![0u8; nb * Q8K_BYTES];
        quantize_row_q8_k(&x, &mut a);
        let ad = deq_act(&a);
        let got = run(ty, Isa::Scalar, k, &w, 2, &a, 1);
        for (r, wrow) in w.chunks(nb * bytes_of(ty)).enumerate() {
            let wd: Vec<f64> = wrow.chunks(bytes_of(ty)).flat_map(|b| deq(ty, b)).collect();
            let want: f64 = wd.iter().zip(&ad).map(|(x, y)| x * y).sum();
            let mag: f64 = wd.iter().zip(&ad).map(|(x, y)| (x * y).abs()).sum();
            let err = (f64::from(got[r]) - want).abs();
            prop_assert!(err <= 4e-7 * (nb as f64 + 2.0) * mag + 1e-30, "{} row {r}: {} vs {want} (mag {mag})", ty.name(), got[r]);
        }
    }
}

/// A NaN or an infinity among the activations makes every output of that activation row NaN,
/// on every ISA; the other rows are untouched.
#[test]
fn non_finite_activations_give_nan() {
    let mut rng = Rng(7);
    for ty in TYPES {
        let nb = 2;
        let k = nb * QK_K;
        let w = weights(ty, nb, 3, &mut rng, false);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x: Vec<f32> = (0..2 * k).map(|i| (i % 7) as f32 - 3.0).collect();
            x[k + 300] = bad;
            for isa in Isa::available() {
                let Some(kern) = Kernel::with_isa(ty, isa) else {
                    continue;
                };
                let mut a = vec![0u8; 2 * nb * Q8K_BYTES];
                kern.quantize(&x, k, &mut a);
                let mut out = vec![0f32; 3 * 2];
                kern.rows(k, &w, 3, &a, 2, &mut out);
                for r in 0..3 {
                    assert!(out[r * 2].is_finite(), "{} {}", ty.name(), isa.name());
                    assert!(
                        out[r * 2 + 1].is_nan(),
                        "{} {} {bad}",
                        ty.name(),
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Zero activations or all-zero weight blocks give +0 exactly.
#[test]
fn zeros_give_zero() {
    let mut rng = Rng(11);
    for ty in TYPES {
        let k = 2 * QK_K;
        let w = weights(ty, 2, 1, &mut rng, false);
        let zw = vec![0u8; w.len()];
        let mut a = vec![0u8; 2 * Q8K_BYTES];
        quantize_row_q8_k(&[0.0; 512], &mut a);
        let x: Vec<f32> = (0..k).map(|i| i as f32 - 100.0).collect();
        let mut b = vec![0u8; 2 * Q8K_BYTES];
        quantize_row_q8_k(&x, &mut b);
        for isa in Isa::available() {
            if Kernel::with_isa(ty, isa).is_none() {
                continue;
            }
            assert_eq!(run(ty, isa, k, &w, 1, &a, 1)[0].to_bits(), 0);
            assert_eq!(run(ty, isa, k, &zw, 1, &b, 1)[0].to_bits(), 0);
        }
    }
}

/// Every ISA with a k-quant kernel is offered where the CPU has it (so the twin tests above run
/// it: `neon-dotprod` under qemu's cortex-a76, `neon` under cortex-a53, `avx2`, `avx-vnni` and
/// `avx512-vnni` on x86).
#[test]
fn kernels_exist_for_every_implemented_isa() {
    for isa in Isa::available() {
        let implemented = matches!(
            isa,
            Isa::Scalar | Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni | Isa::Neon | Isa::NeonDot
        );
        for ty in TYPES {
            let k = Kernel::with_isa(ty, isa);
            assert_eq!(k.is_some(), implemented, "{} {}", ty.name(), isa.name());
        }
    }
    let simd = Isa::available()
        .into_iter()
        .any(|i| matches!(i, Isa::Avx2 | Isa::Neon | Isa::NeonDot));
    let best = Kernel::best(WeightType::Q4_K).expect("a Q4_K kernel");
    assert_eq!(
        best.isa() != Isa::Scalar,
        simd,
        "a SIMD kernel is chosen where one exists"
    );
}

/// The interleaved activations `Engine::tile` reads: byte `16c + 4i + t` of a block is row
/// `i`'s quant `4c + t`, i16 `4g + i` after the quants row `i`'s `bsum_g`, then the rows' `d`;
/// rows past the last group of four are left out.
#[test]
fn interleave_lays_four_rows_side_by_side() {
    let (nb, m) = (2, 6);
    let a = acts(nb, m, &mut Rng(7));
    let mut out = Vec::new();
    super::interleave(&a, nb, &mut out);
    assert_eq!(out.len(), nb * super::TILE_BLOCK);
    for b in 0..nb {
        let blk = &out[b * super::TILE_BLOCK..];
        for i in 0..4 {
            let row = &a[i * nb * Q8K_BYTES + b * Q8K_BYTES..][..Q8K_BYTES];
            for c in 0..64 {
                assert_eq!(
                    blk[16 * c + 4 * i..16 * c + 4 * i + 4],
                    row[4 + 4 * c..8 + 4 * c]
                );
            }
            for g in 0..16 {
                let o = 1024 + 2 * (4 * g + i);
                assert_eq!(blk[o..o + 2], row[Q8K_BSUMS + 2 * g..Q8K_BSUMS + 2 * g + 2]);
            }
            assert_eq!(
                blk[super::TILE_D + 4 * i..super::TILE_D + 4 * i + 4],
                row[..4]
            );
        }
    }
}

/// Q3_K's six-bit scale codes (`sc + 32`, `0..=63`) written into a block's 12 scale bytes, the
/// inverse of `super::q3_words`: code `g`'s low nibble in byte `g mod 8` (the high nibble for
/// `g ≥ 8`), its two high bits in byte `8 + g mod 4` at bit `2·(g div 4)`.
#[cfg(target_arch = "aarch64")]
fn set_q3_codes(blk: &mut [u8], codes: &[u8; 16]) {
    let sb = &mut blk[96..108];
    sb.fill(0);
    for (g, &c) in codes.iter().enumerate() {
        sb[g % 8] |= (c & 0xF) << (4 * (g / 8));
        sb[8 + g % 4] |= (c >> 4) << (2 * (g / 4));
    }
}

/// The NEON folded Q3_K decode equals its plain-Rust form (`super::decode` then the fold
/// `super::neon::decode_q3_folded`'s docs give: `u ← (q − 4)·(−sc)`, `sc ← −1`, `mn ← 0`,
/// signed) in every field, byte for byte.
#[cfg(target_arch = "aarch64")]
fn check_q3_folded(blk: &[u8]) -> Result<(), TestCaseError> {
    let mut want = super::Super::zero();
    super::decode(KType::Q3, blk, &mut want);
    for g in 0..16 {
        let f = (want.sc[g] as i8).wrapping_neg();
        for u in &mut want.u[16 * g..16 * g + 16] {
            *u = (*u as i8).wrapping_sub(4).wrapping_mul(f) as u8;
        }
    }
    let mut got = super::Super::zero();
    got.sc = [7; 16];
    got.mn = [7; 16];
    got.d = f32::NAN;
    got.dmin = 1.0;
    super::neon::decode_q3_folded(blk, &mut got);
    prop_assert_eq!(&got.u[..], &want.u[..], "quants of {:?}", blk);
    prop_assert_eq!(got.sc, [-1; 16]);
    prop_assert_eq!(got.mn, [0; 16]);
    prop_assert!(got.signed);
    prop_assert_eq!(got.d.to_bits(), want.d.to_bits());
    prop_assert_eq!(got.dmin.to_bits(), 0.0f32.to_bits());
    Ok(())
}

#[cfg(target_arch = "aarch64")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Random Q3_K blocks (quants, high bits and scale codes; `mode` 1–3 puts every code at
    /// −32, at 31, or each at one of the two; `mode` 4 clears the quants and high bits) through
    /// the NEON folded decode and its plain-Rust form.
    #[test]
    fn neon_q3_folded_decode_matches_plain(seed in any::<u64>(), mode in 0u8..6, extreme in any::<bool>()) {
        let mut rng = Rng(seed | 1);
        let mut blk: Vec<u8> = (0..110).map(|_| rng.next() as u8).collect();
        let codes: [u8; 16] = std::array::from_fn(|_| match mode {
            1 => 0,
            2 => 63,
            3 => if rng.next().is_multiple_of(2) { 0 } else { 63 },
            _ => (rng.next() % 64) as u8,
        });
        set_q3_codes(&mut blk, &codes);
        if mode == 4 {
            blk[..96].fill(0);
        }
        let d = rng.f16_scale(extreme);
        blk[108..110].copy_from_slice(&d);
        check_q3_folded(&blk)?;
    }
}

/// Every scale code in every group, with quants and high bits all zero, all ones and mixed, and
/// the all-zero block (codes 0: `sc = −32`, `v = −4`, the product 128's wrap to −128).
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_q3_folded_decode_every_scale_code() {
    let mut rng = Rng(5);
    check_q3_folded(&[0u8; 110]).unwrap();
    for code in 0..64u8 {
        for fill in [0x00u8, 0xFF, 0x55, 0xAA] {
            let mut blk = vec![fill; 110];
            let codes: [u8; 16] = std::array::from_fn(|g| code.wrapping_add(g as u8 * 5) % 64);
            set_q3_codes(&mut blk, &codes);
            blk[108..110].copy_from_slice(&rng.f16_scale(true));
            check_q3_folded(&blk).unwrap();
        }
    }
}
