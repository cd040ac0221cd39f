//! `GgufLinear`'s matmuls on real weights, against the f32 reference computed from the same
//! blocks (so the only differences are the activations' quantization and the order of sums).

use std::sync::Arc;

use ork_cpu::GgufLinear;
use ork_exec::{CpuF32Linear, Linear, WeightSpec};
use ork_gguf::GgmlType;
use ork_kernels::blocks::ActType;

use super::fixtures::{open, pool, smollm2_in};

/// The legacy and float types the fixtures are made in.
pub const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
];

/// Activation rows: smooth values with a few outliers, as hidden states have.
fn acts(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = ork_testkit::Rng::new(seed);
    (0..m * k)
        .map(|i| {
            let v = rng.f32() * 2.0 - 1.0;
            if i % 97 == 0 {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

/// How far one product may be from the exact one for activations stored as `act`.
///
/// Quantized activations (Q8_0, Q8_1, Q8_K): each value of a block is rounded to a multiple of
/// `d = amax/127` (at most `d/2 = amax/254` off), and Q8_0/Q8_1 store `d` as f16 (relative
/// error 2⁻¹¹, so up to `127·d·2⁻¹¹ = amax·2⁻¹¹` more per value). Weight types with a
/// minimum (Q4_1, Q5_1 against Q8_1; the k-quants' sub-block minimums against Q8_K) multiply
/// it by the block's quantized sum (`s`, or Q8_K's `bsums`) instead of `Σx`: with `w = d·q + m`
/// and `|m| ≤ max|w|`, that adds up to `2·len·step·max|w|` per block, and Q8_1's f16 `s` up to
/// `2⁻¹¹·len·amax·max|w|`. f16/bf16 activations are rounded to 11/8 significant bits. On top,
/// f32 sums in another order: 1e-5 of `Σ|x·w|`.
fn bound(act: ActType, x: &[f32], w: &[f32]) -> f32 {
    let exact: f32 = x.iter().zip(w).map(|(a, b)| (a * b).abs()).sum();
    let float = 1e-5 * exact + 1e-6;
    let rel = |r: f32| x.iter().zip(w).map(|(a, b)| (a * b).abs() * r).sum::<f32>();
    match act {
        ActType::F32 => float,
        ActType::F16 => rel(2f32.powi(-11)) + float,
        ActType::BF16 => rel(2f32.powi(-8)) + float,
        _ => {
            let (len, _) = act.geometry();
            let per_block: f32 = x
                .chunks(len)
                .zip(w.chunks(len))
                .map(|(xb, wb)| {
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let wmax = wb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let step = amax * (1.0 / 254.0 + 2f32.powi(-11));
                    let mins = if act == ActType::Q8_0 {
                        0.0
                    } else {
                        (2.0 * step + 2f32.powi(-11) * amax) * len as f32 * wmax
                    };
                    step * wb.iter().map(|v| v.abs()).sum::<f32>() + mins
                })
                .sum();
            per_block + float
        }
    }
}

/// A few weights of different shapes (K 576 and 1536; the tied output, Q4_1 in every fixture).
fn some_weights(specs: &[WeightSpec]) -> Vec<&WeightSpec> {
    [
        "blk.0.attn_q.weight",
        "blk.1.attn_k.weight",
        "blk.0.ffn_down.weight",
        "blk.1.ffn_up.weight",
    ]
    .iter()
    .map(|n| specs.iter().find(|s| s.name == *n).unwrap())
    .collect()
}

fn check_close(cpu: &GgufLinear, reference: &CpuF32Linear, spec: &WeightSpec, m: usize) {
    let x = acts(m, spec.k, spec.id.index() as u64 * 31 + m as u64);
    let mut y = vec![f32::NAN; m * spec.n];
    cpu.matmul(spec.id, &x, m, &mut y).unwrap();
    let act = cpu.weight_type(spec.id).unwrap().act_type();
    let w = reference.weight(spec.id).unwrap();
    for i in 0..m {
        let xr = &x[i * spec.k..][..spec.k];
        for j in 0..spec.n {
            let wr = &w[j * spec.k..][..spec.k];
            let exact: f64 = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let err = (f64::from(y[i * spec.n + j]) - exact).abs();
            let b = f64::from(bound(act, xr, wr));
            assert!(
                err <= b,
                "{} ({act:?}) row {j} of {} at m={m}: |{} - {exact}| = {err} > {b}",
                spec.name,
                spec.n,
                y[i * spec.n + j]
            );
        }
    }
}

#[test]
fn every_fixture_type_is_within_the_activation_bound() {
    for ty in TYPES {
        let (model, cpu, reference) = open(&smollm2_in(ty), 2);
        let specs = model.matmul_weights();
        for spec in some_weights(specs) {
            for m in [1, 3, 17] {
                check_close(&cpu, &reference, spec, m);
            }
        }
        let out = model.manifest().output().unwrap();
        let out = specs.iter().find(|s| s.id == out).unwrap();
        check_close(&cpu, &reference, out, 2);
    }
}

#[test]
fn threads_split_rows_without_changing_a_bit() {
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        let path = smollm2_in(ty);
        let gguf = Arc::new(ork_gguf::GgufFile::open(&path).unwrap());
        let model = ork_exec::Model::load(&gguf).unwrap();
        let specs = model.matmul_weights();
        let one = GgufLinear::open(Arc::clone(&gguf), specs, pool(1)).unwrap();
        let two = GgufLinear::open(Arc::clone(&gguf), specs, pool(2)).unwrap();
        let three = GgufLinear::open(Arc::clone(&gguf), specs, pool(3)).unwrap();
        for spec in some_weights(specs) {
            for m in [1, 5] {
                let x = acts(m, spec.k, 7);
                let run = |l: &GgufLinear| {
                    let mut y = vec![0.0; m * spec.n];
                    l.matmul(spec.id, &x, m, &mut y).unwrap();
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                assert_eq!(run(&one), run(&two), "{} m={m}", spec.name);
                assert_eq!(run(&one), run(&three), "{} m={m}", spec.name);
            }
        }
    }
}

#[test]
fn matmul_many_is_matmul_on_each() {
    let (model, cpu, _) = open(&smollm2_in(GgmlType::Q4_1), 2);
    let specs = model.matmul_weights();
    let find = |n: &str| specs.iter().find(|s| s.name == n).unwrap();
    let ws = [
        find("blk.0.attn_q.weight"),
        find("blk.0.attn_k.weight"),
        find("blk.0.attn_v.weight"),
    ];
    for m in [1, 4] {
        let x = acts(m, ws[0].k, 3);
        let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.n]).collect();
        let mut refs: Vec<&mut [f32]> = many.iter_mut().map(Vec::as_mut_slice).collect();
        let ids: Vec<_> = ws.iter().map(|w| w.id).collect();
        cpu.matmul_many(&ids, &x, m, &mut refs).unwrap();
        for (w, got) in ws.iter().zip(&many) {
            let mut y = vec![0.0; m * w.n];
            cpu.matmul(w.id, &x, m, &mut y).unwrap();
            assert_eq!(&y, got, "{}", w.name);
        }
    }
    // Shapes are checked, never trusted.
    let mut y = vec![0.0; ws[0].n];
    let err = cpu.matmul(ws[0].id, &[0.0; 3], 1, &mut y).unwrap_err();
    assert!(matches!(err, ork_exec::ExecError::MatmulShape { .. }));
    let err = cpu
        .matmul(
            ork_exec::WeightId::from_test_index(u32::MAX),
            &[0.0; 576],
            1,
            &mut y,
        )
        .unwrap_err();
    assert!(matches!(err, ork_exec::ExecError::UnknownWeight { .. }));
}

/// `n` rows of `k` random k-quant blocks of `ty` whose f16 scales are set to sane values (random
/// scale bytes would include NaN and infinities), as a one-tensor GGUF.
fn random_kquant(ty: GgmlType, k: usize, n: usize, seed: u64) -> Arc<ork_gguf::GgufFile> {
    let (len, bytes) = (256, ty.bytes_for(256).unwrap() as usize);
    // Offsets of the f16 `d` (and `dmin`) in each block (ggml-common.h's block_q*_K).
    let scales: &[usize] = match ty {
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => unreachable!("not a k-quant: {ty}"),
    };
    let mut rng = ork_testkit::Rng::new(seed);
    let mut data = rng.bytes(n * k / len * bytes);
    for block in data.chunks_exact_mut(bytes) {
        for &at in scales {
            let v = half::f16::from_f32(0.002 + 0.03 * rng.f32());
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    let b = ork_gguf::writer::GgufBuilder::new().tensor("w", &[k as u64, n as u64], ty, data);
    Arc::new(ork_gguf::GgufFile::from_bytes("kquant.gguf", b.to_bytes().unwrap()).unwrap())
}

#[test]
fn k_quants_are_within_the_activation_bound() {
    for (i, ty) in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let spec = WeightSpec {
            id: ork_exec::WeightId::from_test_index(0),
            name: "w".to_owned(),
            k: 512,
            n: 40,
        };
        let gguf = random_kquant(ty, spec.k, spec.n, i as u64);
        let specs = [spec.clone()];
        let cpu = GgufLinear::open(Arc::clone(&gguf), &specs, pool(2)).unwrap();
        let reference = CpuF32Linear::from_gguf(&gguf, &specs).unwrap();
        for m in [1, 4] {
            check_close(&cpu, &reference, &spec, m);
        }
    }
}
