//! Single-thread speed of the k-quant block kernels (`scripts/kquant_speed.py` runs this and
//! ggml's own `vec_dot` on the same shapes in one run and prints the ratios).
//!
//! `cargo run --release -p ork-kernels --example kquant_speed -- TYPE ROWS K M REPS` prints
//! one line per available ISA: `isa seconds_per_call` (the best of REPS calls). Weights are
//! random blocks with sane f16 scales; activations are random values quantized to Q8_K.

use std::time::Instant;

use ork_kernels::blocks::{Isa, Kernel, WeightType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: kquant_speed TYPE ROWS K M REPS";
    let ty = WeightType::ALL
        .into_iter()
        .find(|t| Some(t.name()) == args.first().map(String::as_str))
        .expect(usage);
    let num = |i: usize| -> usize { args.get(i).and_then(|s| s.parse().ok()).expect(usage) };
    let (rows, k, m, reps) = (num(1), num(2), num(3), num(4));
    let (len, bytes) = ty.geometry();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut w: Vec<u8> = (0..rows * ty.row_bytes(k)).map(|_| next() as u8).collect();
    // Sane f16 scales (0.001 .. 0.002) wherever a type keeps them: every 2-byte slot that
    // decodes to a non-finite f16 is replaced, which is enough for timing.
    for blk in w.chunks_exact_mut(bytes) {
        for c in blk.chunks_exact_mut(2) {
            let h = half::f16::from_le_bytes([c[0], c[1]]);
            if !h.is_finite() {
                c.copy_from_slice(&half::f16::from_f32(0.0015).to_le_bytes());
            }
        }
    }
    let x: Vec<f32> = (0..m * k)
        .map(|_| (next() % 2001) as f32 * 1e-3 - 1.0)
        .collect();
    assert!(k.is_multiple_of(len));
    for isa in Isa::available() {
        let Some(kern) = Kernel::with_isa(ty, isa) else {
            continue;
        };
        let mut a = vec![0u8; m * kern.act_type().row_bytes(k)];
        kern.quantize(&x, k, &mut a);
        let mut out = vec![0f32; rows * m];
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = Instant::now();
            kern.rows(k, &w, rows, &a, m, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{} {best:.9} {}", isa.name(), out[0]);
    }
}
