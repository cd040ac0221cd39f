//! Decode throughput (ignored; run with
//! `cargo test -p ork-gguf --test ork-gguf -- --ignored --nocapture throughput`).
use crate::common::{model_path, Rng};
use ork_gguf::dequant::dequantize;
use ork_gguf::{GgmlType, GgufFile};
use std::time::Instant;

#[test]
#[ignore = "benchmark: prints decode throughput, asserts nothing about speed"]
fn throughput_per_type() {
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    let n_values = 1 << 20; // 4 MiB of f32 output per pass: stays in L2/L3-ish
    let mut rng = Rng(1);
    let mut out = vec![0f32; n_values];
    for ty in types {
        let bytes = ty.bytes_for(n_values as u64).unwrap() as usize;
        let mut src = rng.bytes(bytes);
        // Finite scales: clear the top exponent bit of every f16 pair (harmless for the timing).
        for b in src.iter_mut().skip(1).step_by(2) {
            *b &= 0xBF;
        }
        let passes = 64;
        dequantize(ty, &src, &mut out).unwrap();
        let start = Instant::now();
        for _ in 0..passes {
            dequantize(ty, std::hint::black_box(&src), &mut out).unwrap();
            std::hint::black_box(&out);
        }
        let secs = start.elapsed().as_secs_f64();
        let out_gb = (passes * n_values * 4) as f64 / secs / 1e9;
        let melem = (passes * n_values) as f64 / secs / 1e6;
        println!("{ty:>5}: {out_gb:6.2} GB/s f32 out, {melem:7.0} Mvalues/s");
    }
}

#[test]
#[ignore = "benchmark: decodes every tensor of the real model once"]
fn throughput_real_model() {
    let file = GgufFile::open(&model_path()).unwrap();
    let mut buf = Vec::new();
    let start = Instant::now();
    let mut values = 0u64;
    for t in file.tensors() {
        buf.resize(t.n_elements() as usize, 0f32);
        file.dequantize_rows(t, 0, &mut buf).unwrap();
        values += t.n_elements();
    }
    let secs = start.elapsed().as_secs_f64();
    println!("whole model (first touch, page cache warm): {values} values in {secs:.3} s = {:.2} GB/s f32 out", values as f64 * 4.0 / secs / 1e9);
}
