//! The row-split prefill (`ork_board::split::split_prefill`): never projected slower than either
//! engine alone in its own model, its CPU side the CPU engine's prefill exactly, each weight's
//! share where its two engines' times meet, and the issue 38 goal rows' figures.

use ork_board::cpu::{prefill_s, CpuBoard, CpuPlan, FileType, Kernels, Pool, FITTED_CPU};
use ork_board::cpu_fit::{CpuDims, GEMMA3_1B, QWEN3_30B_A3B};
use ork_board::split::{prefill_passes, split_prefill, SHARES};
use ork_board::Board;

fn board(name: &str) -> CpuBoard {
    CpuBoard::of(&Board::named(name).unwrap(), &FITTED_CPU).unwrap()
}

/// ork's CPU engine on the big cores, `cache` bytes of page cache.
fn plan(b: &CpuBoard, cache: f64) -> CpuPlan {
    CpuPlan {
        threads: b.cpu.big.0 as usize,
        pool: Pool::Chunks,
        kernels: Kernels::Ork,
        cache_bytes: cache,
        kv_bytes: 2,
    }
}

/// Qwen2.5-1.5B (its `config.json`: 28 blocks, hidden 1536, intermediate 8960, 12 / 2 heads of
/// 128, vocabulary 151936, untied output).
const QWEN25_1_5B: CpuDims = CpuDims {
    n_layer: 28,
    d_model: 1536,
    ffn: 8960,
    heads: (12, 2, 128),
    vocab: 151936,
    tied: false,
    experts: (0, 0),
    window: (0, 0),
};

#[test]
fn passes_cover_the_prompt_in_order() {
    assert_eq!(prefill_passes(512, 512), vec![(512, 0)]);
    assert_eq!(prefill_passes(100, 1000), vec![(100, 0)]);
    assert_eq!(prefill_passes(130, 64), vec![(64, 0), (64, 64), (2, 128)]);
    assert!(prefill_passes(0, 64).is_empty());
}

#[test]
fn a_split_prefill_is_never_slower_than_either_engine_alone() {
    let shapes = [
        GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0),
        QWEN25_1_5B.shape(FileType::Q4_0, FileType::Q6_K),
        QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K),
    ];
    for b in [board("orangepi5-16g"), board("rk3576-8g")] {
        for shape in &shapes {
            for (prompt, chunk) in [(1, 1), (128, 128), (512, 512), (512, 64), (300, 128)] {
                // The page cache whole, and starved (the rest from storage).
                for cache in [b.ram_bytes - b.reserved_bytes, 0.3 * shape.file_bytes()] {
                    let p = plan(&b, cache);
                    let (shares, s) = split_prefill(shape, &b, &p, prompt, chunk).unwrap();
                    let tol = 1e-12 * s.cpu_ttft_s;
                    assert!(s.ttft_s <= s.cpu_ttft_s + tol, "{s:?}");
                    assert!(s.ttft_s <= s.npu_ttft_s + tol, "{s:?}");
                    assert!(s.ttft_s > 0.0 && s.ttft_s.is_finite(), "{s:?}");
                    assert_eq!(shares.len(), shape.weights.len());
                    for (w, f) in shape.weights.iter().zip(&shares) {
                        assert!((0.0..=1.0).contains(f));
                        if w.experts > 1 {
                            assert_eq!(*f, 0.0, "experts stay on the CPU");
                        }
                    }
                    assert!((0.0..=1.0).contains(&s.npu_row_share));
                    assert!((0.0..=1.0).contains(&s.bus_bound_share));
                    if chunk >= prompt {
                        // Every share 0 is the CPU engine's own prefill.
                        let cpu = prefill_s(shape, &b, &p, prompt);
                        assert!((s.cpu_ttft_s / cpu - 1.0).abs() < 1e-12, "{s:?} {cpu}");
                    }
                }
            }
        }
    }
    // No NPU, no split.
    let pi5 = CpuBoard::resolve("pi5-16g").unwrap().unwrap();
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    assert!(split_prefill(&shape, &pi5, &plan(&pi5, 1e10), 128, 128).is_none());
}

/// A stated case, by hand: Gemma 3 1B Q4_0 on orangepi5-16g, 512 prompt tokens in one pass.
/// `ffn_gate` (K 1152, N 6912) computes 512 × 1152 × 6912 = 4.08 G multiply-adds. On the CPU:
/// ÷ 256 × 30.6 cycles (ork's Q4_0 A76 prefill column, `ORK_GEMM_CYCLES`) ÷ 2.352 GHz ÷ 4 cores
/// ÷ the fitted 0.786 `gemm_gain` ≈ 65.9 ms (compute-bound: its 4.48 MB read take 0.2 ms). On
/// the NPU: 2 calls × 25.4 µs + 2 × 4.08 G ÷ 1.1985 TOPS ≈ 6.85 ms. They meet where 0.05 +
/// 6.80 f = 65.9 (1 − f), f ≈ 0.906 of its rows on the NPU, each engine ≈ 6.2 ms: the grid's
/// nearest share is 29/32 (30/32 accepted).
#[test]
fn each_weight_takes_the_share_where_its_engines_meet() {
    let b = board("orangepi5-16g");
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let p = plan(&b, b.ram_bytes - b.reserved_bytes);
    let (shares, s) = split_prefill(&shape, &b, &p, 512, 512).unwrap();
    let gate = shape
        .weights
        .iter()
        .position(|w| (w.k, w.n) == (1152, 6912))
        .unwrap();
    let f = shares[gate] * SHARES as f64;
    assert!((29.0..=30.0).contains(&f), "gate share {f}/32");
    // Both engines busy: the split beats the faster engine (by little since the CPU is charged
    // its own M > 1 kernel: about 3 %), short of both engines' rates added.
    assert!(s.ttft_s < 0.99 * s.npu_ttft_s, "{s:?}");
    let added = 1.0 / (1.0 / s.npu_ttft_s + 1.0 / s.cpu_ttft_s);
    assert!(s.ttft_s > added, "{s:?}");
    assert!(s.npu_row_share > 0.6 && s.npu_row_share < 0.95, "{s:?}");
    // Prefill is compute-bound: only the output projection (one row) may be read-bound.
    assert!(s.bus_bound_share < 0.05, "{s:?}");
}

#[test]
#[ignore = "prints the issue 38 goal rows of docs/board-model.md"]
fn split_prefill_report() {
    let b = board("orangepi5-16g");
    let rows = [
        (
            "Gemma 3 1B Q4_0",
            GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0),
            512,
        ),
        (
            "Qwen2.5-1.5B Q4_0",
            QWEN25_1_5B.shape(FileType::Q4_0, FileType::Q6_K),
            128,
        ),
        (
            "Qwen3-30B-A3B Q3_K",
            QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K),
            512,
        ),
    ];
    for (name, shape, prompt) in rows {
        let dense = ork_board::options::dense_int8_bytes(&shape);
        let p = plan(&b, b.ram_bytes - b.reserved_bytes - dense);
        let (_, s) = split_prefill(&shape, &b, &p, prompt, prompt).unwrap();
        println!("{name} ({prompt}): {s:?}");
    }
}
