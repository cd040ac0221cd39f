//! `cargo run --release -p ork-pack --example group_error [MODEL.gguf]`: quantization error of
//! per-channel vs per-group scales on the real model's weights (RMS of the dequantized weight
//! minus the GGUF's own f32 dequantization, relative to the RMS of the latter), per tensor family.
//!
//! Groups must divide K: SmolLM2's K = 1536 weights (`ffn_down`) take g128 / g256 / g512; its
//! K = 576 weights (576 = 4.5 · 128) take none of the chip's int8 group sizes, only g32 / g64.

use ork_pack::{pack, pack_grouped, untile, MatrixRows, PackDtype};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("ORK_MODEL").ok())
        .ok_or("usage: group_error MODEL.gguf (or set ORK_MODEL)")?;
    let file = ork_gguf::GgufFile::open(std::path::Path::new(&path))?;
    let families = [
        "ffn_down",
        "ffn_up",
        "ffn_gate",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
    ];
    println!("relative RMS error of the dequantized weight vs the GGUF's f32 (all 30 blocks)");
    println!(
        "{:<12} {:>5} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "tensor",
        "K",
        "N",
        "i8 channel",
        "i8 g128",
        "i8 g256",
        "i8 g512",
        "i4 channel",
        "i4 g32",
        "i4 g64"
    );
    for fam in families {
        // Sums of squared errors and squared values over the blocks, per variant.
        let variants: [(PackDtype, Option<usize>); 7] = [
            (PackDtype::I8, None),
            (PackDtype::I8, Some(128)),
            (PackDtype::I8, Some(256)),
            (PackDtype::I8, Some(512)),
            (PackDtype::I4, None),
            (PackDtype::I4, Some(32)),
            (PackDtype::I4, Some(64)),
        ];
        let mut err = [0f64; 7];
        let mut sig = 0f64;
        let (mut k, mut n) = (0, 0);
        for b in 0..30 {
            let name = format!("blk.{b}.{fam}.weight");
            let Some(t) = file.tensor(&name) else {
                continue;
            };
            let dense = file.dequantize_tensor(t)?;
            (k, n) = (t.row_len() as usize, t.n_rows() as usize);
            let rows = MatrixRows::new(&dense, k, n)?;
            sig += dense.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>();
            for (e, &(dtype, group)) in err.iter_mut().zip(&variants) {
                let pw = match group {
                    None => pack(&rows, dtype)?,
                    Some(g) if k % g == 0 => pack_grouped(&rows, dtype, g)?,
                    Some(_) => {
                        *e = f64::NAN;
                        continue;
                    }
                };
                let deq = untile(&pw)?;
                *e += deq
                    .iter()
                    .zip(&dense)
                    .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                    .sum::<f64>();
            }
        }
        let cells: Vec<String> = err
            .iter()
            .map(|&e| {
                if e.is_nan() {
                    "n/a".to_owned()
                } else {
                    format!("{:.4}%", 100.0 * (e / sig).sqrt())
                }
            })
            .collect();
        println!(
            "{:<12} {:>5} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            fam, k, n, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]
        );
    }
    Ok(())
}
