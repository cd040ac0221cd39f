use super::super::golden;
use super::super::{Kernel, WeightType};
use super::*;
use proptest::prelude::*;

const TYPES: [WeightType; 6] = [
    WeightType::Q4_0,
    WeightType::Q4_1,
    WeightType::Q5_0,
    WeightType::Q5_1,
    WeightType::Q8_0,
    WeightType::IQ4_NL,
];

/// A xorshift stream (the tile tests' generator).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// An f16 scale, often an extreme one: 0, ±f16 max, subnormals, or an ordinary value.
    fn scale(&mut self) -> [u8; 2] {
        let r = self.next();
        let bits: u16 = match r % 8 {
            0 => 0,
            1 => 0x7bff,
            2 => 0xfbff,
            3 => 0x0001,
            4 => (r >> 8) as u16 & 0x83ff,
            _ => (r >> 8) as u16 & 0xbfff,
        };
        bits.to_le_bytes()
    }
}

/// Random weight rows: random bytes, scales drawn by [`Rng::scale`], one block in five zeroed.
fn weights(rng: &mut Rng, ty: WeightType, rows: usize, k: usize) -> Vec<u8> {
    let (_, bytes) = ty.geometry();
    let mut w: Vec<u8> = (0..ty.row_bytes(k) * rows)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_exact_mut(bytes) {
        if rng.next().is_multiple_of(5) {
            blk.fill(0);
            continue;
        }
        blk[..2].copy_from_slice(&rng.scale());
        if matches!(ty, WeightType::Q4_1 | WeightType::Q5_1) {
            blk[2..4].copy_from_slice(&rng.scale());
        }
    }
    w
}

/// Random activation rows in Q8_0/Q8_1 form: extreme scales, int8 in −127..=127 (what the
/// quantizer writes), one block in five zeroed.
fn acts(rng: &mut Rng, min: bool, m: usize, nb: usize) -> Vec<u8> {
    let (ab, qs) = act_geometry(min);
    let mut a = vec![0u8; m * nb * ab];
    for blk in a.chunks_exact_mut(ab) {
        if rng.next().is_multiple_of(5) {
            continue;
        }
        blk[..2].copy_from_slice(&rng.scale());
        if min {
            blk[2..4].copy_from_slice(&rng.scale());
        }
        for q in &mut blk[qs..] {
            *q = match rng.next() % 6 {
                0 => 127,
                1 => (-127i8) as u8,
                _ => ((rng.next() % 255) as i32 - 127) as i8 as u8,
            };
        }
    }
    a
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every SIMD kernel equals the scalar twin bit for bit: block counts that mix groups of
    /// eight with tails, decode (M = 1) and prefill (M up to 9: the 4-row tiles and leftovers;
    /// rows up to 35: the x86 sixteen- and eight-row panels and the rows beyond them).
    #[test]
    fn every_isa_matches_scalar_twin(nb in 1usize..27, rows in 1usize..36, m in 1usize..10, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let k = 32 * nb;
        for ty in TYPES {
            let w = weights(&mut rng, ty, rows, k);
            let a = acts(&mut rng, ty.act_type() == super::super::ActType::Q8_1, m, nb);
            let twin = Kernel::with_isa(ty, Isa::Scalar).unwrap();
            let mut want = vec![0f32; rows * m];
            twin.rows(k, &w, rows, &a, m, &mut want);
            for isa in Isa::available() {
                let Some(kern) = Kernel::with_isa(ty, isa) else { continue };
                let mut got = vec![f32::NAN; rows * m];
                kern.rows(k, &w, rows, &a, m, &mut got);
                prop_assert!(same_bits(&got, &want), "{ty:?} on {isa:?}: {got:?} vs {want:?}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Decode (M = 1), where the x86 kernels take four weight rows at a time and pack their
    /// last one or two blocks into one group: every tail length (`nb % 8` from 0 to 7), row
    /// counts around the groups of four, the scalar twin's bits.
    #[test]
    fn decode_matches_scalar_twin(groups in 0usize..4, tail in 0usize..8, rows in 1usize..14, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let nb = (8 * groups + tail).max(1);
        let k = 32 * nb;
        for ty in TYPES {
            let w = weights(&mut rng, ty, rows, k);
            let a = acts(&mut rng, ty.act_type() == super::super::ActType::Q8_1, 1, nb);
            let twin = Kernel::with_isa(ty, Isa::Scalar).unwrap();
            let mut want = vec![0f32; rows];
            twin.rows(k, &w, rows, &a, 1, &mut want);
            for isa in Isa::available() {
                let Some(kern) = Kernel::with_isa(ty, isa) else { continue };
                let mut got = vec![f32::NAN; rows];
                kern.rows(k, &w, rows, &a, 1, &mut got);
                prop_assert!(same_bits(&got, &want), "{ty:?} on {isa:?}: {got:?} vs {want:?}");
            }
        }
    }
}

/// The integer weights of one block and whether the type has a min.
fn ints(ty: WeightType, blk: &[u8]) -> ([i8; 32], bool) {
    match ty {
        WeightType::Q4_0 => (Q4_0::weights(blk), false),
        WeightType::Q4_1 => (Q4_1::weights(blk), true),
        WeightType::Q5_0 => (Q5_0::weights(blk), false),
        WeightType::Q5_1 => (Q5_1::weights(blk), true),
        WeightType::Q8_0 => (Q8_0::weights(blk), false),
        _ => (Iq4Nl::weights(blk), false),
    }
}

/// Dequantized weights of one block (scalar twin's decoding): `d · q (+ m)`.
fn dequant(ty: WeightType, blk: &[u8]) -> Vec<f64> {
    let (q, min) = ints(ty, blk);
    let d = f16_at(blk, 0) as f64;
    let m = if min { f16_at(blk, 2) as f64 } else { 0.0 };
    q.iter().map(|&q| d * q as f64 + m).collect()
}

/// The block decoding equals gguf-py's `dequantize` (goldens from `scripts/blocks_golden.py`).
#[test]
fn decoding_matches_gguf_py() {
    let lines = golden::lines("deq");
    assert_eq!(lines.len(), 18);
    for l in lines {
        let ty = TYPES.iter().find(|t| t.name() == l.head[0]).unwrap();
        let blk = golden::bytes(l.head[1]);
        let want = golden::floats(&l.fields[0]);
        let got = dequant(*ty, &blk);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(*g as f32, *w, "{} block {}", l.tag, l.head[1]);
        }
    }
}

/// The twin against ggml-cpu's own `vec_dot` (goldens): the activation row quantized by ork
/// equals ggml's bytes, so the results differ only by the order of the f32 additions.
#[test]
fn twin_matches_ggml_vec_dot() {
    let lines = golden::lines("dot");
    assert_eq!(lines.len(), 18);
    for l in lines {
        let ty = *TYPES.iter().find(|t| t.name() == l.head[0]).unwrap();
        let k: usize = l.head[1].parse().unwrap();
        let w = golden::bytes(l.head[2]);
        let x = golden::floats(&l.fields[0]);
        let want = golden::floats(&l.fields[1])[0];
        let kern = Kernel::with_isa(ty, Isa::Scalar).unwrap();
        let mut a = vec![0u8; ty.act_type().row_bytes(k)];
        kern.quantize(&x, k, &mut a);
        let mut got = [0f32];
        kern.rows(k, &w, 1, &a, 1, &mut got);
        let scale: f32 = (0..k / 32).map(|b| terms(ty, &w, &a, b)).sum();
        let tol = scale * k as f32 * f32::EPSILON;
        assert!(
            (got[0] - want).abs() <= tol,
            "{ty:?} k={k}: {got:?} vs ggml {want} (tol {tol})"
        );
    }
}

/// A bound of block `b`'s value: `|d_w d_a| Σ|q_w q_a| + |m_w s_a|`.
fn terms(ty: WeightType, w: &[u8], a: &[u8], b: usize) -> f32 {
    let (_, wbytes) = ty.geometry();
    let (ab, qs) = act_geometry(matches!(ty, WeightType::Q4_1 | WeightType::Q5_1));
    let (wb, abk) = (&w[b * wbytes..][..wbytes], &a[b * ab..][..ab]);
    let (q, min) = ints(ty, wb);
    let s: f64 = (0..32)
        .map(|j| (q[j] as f64 * abk[qs + j] as i8 as f64).abs())
        .sum();
    let mut t = (f16_at(wb, 0) as f64 * f16_at(abk, 0) as f64).abs() * s;
    if min {
        t += (f16_at(wb, 2) as f64 * f16_at(abk, 2) as f64).abs();
    }
    t as f32
}

/// The twin against an f64 reference: each block's `d_w d_a Σ q_w q_a (+ m_w s_a)` summed in
/// f64; the f32 result is within the summation bound `(nb + 2) · 2⁻²⁴ · Σ|terms|`.
#[test]
fn twin_matches_f64_reference() {
    let mut rng = Rng(0x5eed);
    for ty in TYPES {
        for nb in [1, 7, 8, 9, 18, 40] {
            let k = 32 * nb;
            let x: Vec<f32> = (0..k)
                .map(|_| (rng.next() % 2001) as f32 / 100.0 - 10.0)
                .collect();
            let mut w = weights(&mut rng, ty, 1, k);
            for blk in w.chunks_exact_mut(ty.geometry().1) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            let kern = Kernel::with_isa(ty, Isa::Scalar).unwrap();
            let mut a = vec![0u8; ty.act_type().row_bytes(k)];
            kern.quantize(&x, k, &mut a);
            let mut got = [0f32];
            kern.rows(k, &w, 1, &a, 1, &mut got);
            let min = matches!(ty, WeightType::Q4_1 | WeightType::Q5_1);
            let (ab, qs) = act_geometry(min);
            let (wbytes, mut want, mut bound) = (ty.geometry().1, 0f64, 0f64);
            for b in 0..nb {
                let (wb, abk) = (&w[b * wbytes..][..wbytes], &a[b * ab..][..ab]);
                let (q, _) = ints(ty, wb);
                let dd = f16_at(wb, 0) as f64 * f16_at(abk, 0) as f64;
                let v: f64 = (0..32)
                    .map(|j| dd * q[j] as f64 * (abk[qs + j] as i8 as f64))
                    .sum();
                let v = v + if min {
                    f16_at(wb, 2) as f64 * f16_at(abk, 2) as f64
                } else {
                    0.0
                };
                want += v;
                bound += terms(ty, &w, &a, b) as f64;
            }
            let tol = (nb as f64 + 2.0) * 2f64.powi(-24) * bound;
            assert!(
                (got[0] as f64 - want).abs() <= tol,
                "{ty:?} nb={nb}: {} vs {want}",
                got[0]
            );
        }
    }
}

/// The NaN rule: a NaN or an infinity in an activation row makes that row's outputs NaN on
/// every ISA, and leaves the other rows alone.
#[test]
fn a_non_finite_activation_makes_its_row_nan() {
    let k = 96;
    let mut rng = Rng(7);
    for ty in TYPES {
        let w = weights(&mut rng, ty, 3, k);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x: Vec<f32> = (0..2 * k).map(|i| (i % 13) as f32 - 6.0).collect();
            x[k + 40] = bad;
            for isa in Isa::available() {
                let Some(kern) = Kernel::with_isa(ty, isa) else {
                    continue;
                };
                let mut a = vec![0u8; 2 * ty.act_type().row_bytes(k)];
                kern.quantize(&x, k, &mut a);
                let mut out = [0f32; 6];
                kern.rows(k, &w, 3, &a, 2, &mut out);
                for r in 0..3 {
                    assert!(!out[2 * r].is_nan(), "{ty:?} {isa:?}: clean row");
                    assert!(out[2 * r + 1].is_nan(), "{ty:?} {isa:?}: row with {bad}");
                }
            }
        }
    }
}

/// Every ISA this CPU runs has a kernel and an activation quantizer for every type here, so
/// the property tests above compare real SIMD kernels (none is skipped).
#[test]
fn every_available_isa_has_every_kernel() {
    let all = [WeightType::F32, WeightType::F16, WeightType::BF16];
    for isa in Isa::available() {
        for ty in TYPES.iter().chain(&all) {
            let k = Kernel::with_isa(*ty, isa);
            assert_eq!(k.map(|k| k.isa()), Some(isa), "{ty:?} on {isa:?}");
        }
    }
}

/// `Format::WMAX` is each type's largest `|w|`: no block, random or made of one repeated byte,
/// decodes past it, and one of them reaches it (the AVX2 panel sizes its 16-bit sums by it).
#[test]
fn wmax_is_each_types_largest_weight() {
    fn largest<F: Format>() -> i32 {
        let mut rng = Rng(0x5eed);
        let mut blocks: Vec<Vec<u8>> = (0..4096)
            .map(|_| (0..F::BYTES).map(|_| rng.next() as u8).collect())
            .collect();
        blocks.extend((0..=255u8).map(|b| vec![b; F::BYTES]));
        let abs = |b: &Vec<u8>| F::weights(b).iter().map(|&w| i32::from(w).abs()).max();
        blocks.iter().filter_map(abs).max().unwrap_or(0)
    }
    assert_eq!(largest::<Q4_0>(), Q4_0::WMAX);
    assert_eq!(largest::<Q4_1>(), Q4_1::WMAX);
    assert_eq!(largest::<Q5_0>(), Q5_0::WMAX);
    assert_eq!(largest::<Q5_1>(), Q5_1::WMAX);
    assert_eq!(largest::<Q8_0>(), Q8_0::WMAX);
    assert_eq!(largest::<Iq4Nl>(), Iq4Nl::WMAX);
}

/// The largest block sums every kernel can meet: weight blocks with every quant bit set (the
/// largest `u` of the unsigned decodings, which size the AVX2 kernels' 16-bit lane sums) or
/// every bit clear, against activations all +127 or all −127, scales 1. Every ISA's bits equal
/// the scalar twin's, and the twin's equal the exact sum.
#[test]
fn largest_block_sums_match_scalar_twin() {
    let one = 0x3c00u16.to_le_bytes();
    for ty in TYPES {
        let (_, bytes) = ty.geometry();
        let min = ty.act_type() == super::super::ActType::Q8_1;
        let (ab, _) = act_geometry(min);
        for fill in [0xffu8, 0x00] {
            for q in [127i8, -127] {
                for nb in [8usize, 16, 18, 27] {
                    let k = 32 * nb;
                    let mut w = vec![fill; bytes * nb * 5];
                    for blk in w.chunks_exact_mut(bytes) {
                        blk[..2].copy_from_slice(&one);
                        if matches!(ty, WeightType::Q4_1 | WeightType::Q5_1) {
                            blk[2..4].copy_from_slice(&[0, 0]);
                        }
                    }
                    let mut a = vec![q as u8; nb * ab];
                    for blk in a.chunks_exact_mut(ab) {
                        blk[..2].copy_from_slice(&one);
                        if min {
                            blk[2..4].copy_from_slice(&[0, 0]);
                        }
                    }
                    let (block, _) = ints(ty, &w[..bytes]);
                    let per_block: i32 = block.iter().map(|&x| i32::from(x) * i32::from(q)).sum();
                    let exact = per_block as f32 * nb as f32;
                    let twin = Kernel::with_isa(ty, Isa::Scalar).unwrap();
                    for m in [1usize, 4] {
                        let aa = a.repeat(m);
                        let mut want = vec![0f32; 5 * m];
                        twin.rows(k, &w, 5, &aa, m, &mut want);
                        assert!(
                            want.iter().all(|&v| v == exact),
                            "{ty:?}: twin {want:?} vs {exact}"
                        );
                        for isa in Isa::available() {
                            let Some(kern) = Kernel::with_isa(ty, isa) else {
                                continue;
                            };
                            let mut got = vec![f32::NAN; 5 * m];
                            kern.rows(k, &w, 5, &aa, m, &mut got);
                            assert!(
                                same_bits(&got, &want),
                                "{ty:?} on {isa:?} nb {nb} m {m}: {got:?} vs {want:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
