//! Calibration of the CPU engine ([`crate::cpu`]): three parameters (the cores' read rate as a
//! fraction of the DDR bus, a fixed cost per block and pass, prefill's rate over its kernel's
//! llvm-mca estimate: ggml's repacked GEMM or vec_dot, [`crate::cpu::GGML_GEMM_CYCLES`]) fitted on three rows of llama.cpp's published RK3588 CPU figures (rk-llama.cpp's
//! README, `llama-bench`, 4 threads on the A76 cores: pp512 and tg128), by the same
//! Nelder–Mead as the NPU's fit; the other rows are predicted, never fitted. See
//! `docs/board-model.md`.

use crate::cpu::{
    decode_s, prefill_s, CpuBoard, CpuFitted, CpuPlan, CpuShape, CpuWeight, FileType, Kernels,
};
use crate::fit::nelder_mead;
use crate::{Board, BoardError};

/// A published model's dimensions and how its file stores them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuDims {
    /// Blocks.
    pub n_layer: usize,
    /// Width.
    pub d_model: usize,
    /// FFN width (one expert's for a MoE).
    pub ffn: usize,
    /// Query heads, KV heads, head dimension.
    pub heads: (usize, usize, usize),
    /// Vocabulary.
    pub vocab: usize,
    /// The output projection is the token embedding (tied).
    pub tied: bool,
    /// Experts and experts per token ((0, 0): dense).
    pub experts: (usize, usize),
    /// Sliding window and every how many blocks one is global ((0, 0): all global).
    pub window: (usize, usize),
}

/// Gemma 3 1B (google/gemma-3-1b-it `config.json`: 26 layers, hidden 1152, intermediate 6912,
/// 4 heads, 1 KV head of 256, vocabulary 262144, tied embeddings, sliding window 512 with one
/// global layer in 6).
pub const GEMMA3_1B: CpuDims = CpuDims {
    n_layer: 26,
    d_model: 1152,
    ffn: 6912,
    heads: (4, 1, 256),
    vocab: 262144,
    tied: true,
    experts: (0, 0),
    window: (512, 6),
};

/// Granite-4.0 350M (its GGUF's metadata as ollama's `ibm/granite4:350m` lists it: arch
/// `granite`, a llama-like dense transformer, 28 blocks, width 1024, FFN 2048, 16 heads, 4 KV
/// heads, head dimension 64, vocabulary 100352; tied embeddings assumed).
pub const GRANITE4_350M: CpuDims = CpuDims {
    n_layer: 28,
    d_model: 1024,
    ffn: 2048,
    heads: (16, 4, 64),
    vocab: 100352,
    tied: true,
    experts: (0, 0),
    window: (0, 0),
};

/// Qwen3-30B-A3B (its `config.json`: 48 blocks, hidden 2048, 32 / 4 heads of 128, 128 experts,
/// 8 per token, expert FFN 768, vocabulary 151936, untied output).
pub const QWEN3_30B_A3B: CpuDims = CpuDims {
    n_layer: 48,
    d_model: 2048,
    ffn: 768,
    heads: (32, 4, 128),
    vocab: 151936,
    tied: false,
    experts: (128, 8),
    window: (0, 0),
};

impl CpuDims {
    /// The shape with block weights of `ty` and the output of `out`.
    pub fn shape(&self, ty: FileType, out: FileType) -> CpuShape {
        let (h, kv, hd) = self.heads;
        let d = self.d_model;
        let w = |k, n, experts| CpuWeight {
            k,
            n,
            ty,
            experts,
            output: false,
        };
        let e = self.experts.0.max(1);
        let mut weights = Vec::new();
        for _ in 0..self.n_layer {
            weights.extend([w(d, h * hd, 1), w(d, kv * hd, 1), w(d, kv * hd, 1)]);
            weights.push(w(h * hd, d, 1));
            if e > 1 {
                weights.push(w(d, e, 1));
            }
            weights.extend([w(d, self.ffn, e), w(d, self.ffn, e), w(self.ffn, d, e)]);
        }
        weights.push(CpuWeight {
            k: d,
            n: self.vocab,
            ty: out,
            experts: 1,
            output: true,
        });
        let windows = (0..self.n_layer)
            .map(|l| match self.window {
                (0, _) => None,
                (w, every) => ((l + 1) % every != 0).then_some(w),
            })
            .collect();
        CpuShape {
            n_layer: self.n_layer,
            heads: self.heads,
            windows,
            weights,
            top_k: self.experts.1,
            bytes_scale: 1.0,
            other_bytes: if self.tied {
                0
            } else {
                crate::cpu::row_bytes(ty, d) * self.vocab as u64
            },
        }
    }
}

/// One published CPU row.
#[derive(Clone, Copy, Debug)]
pub struct CpuRow {
    /// The model and file as the source names them.
    pub model: &'static str,
    /// The board preset it ran on.
    pub board: &'static str,
    /// Its dimensions.
    pub dims: CpuDims,
    /// The block weights' type and the output's (llama.cpp's quantizer gives a tied output of a
    /// Q4_0 file Q6_K, or Q8_0 where the width is not a multiple of 256: `llama-quant.cpp`).
    pub types: (FileType, FileType),
    /// The file's published size, bytes, where its own type mix is not known (its weights'
    /// bytes are then scaled to it); `None`: the types are the file's.
    pub file_bytes: Option<f64>,
    /// Published pp512 and tg128, tokens per second.
    pub pp512: f64,
    /// Published tg128.
    pub tg128: f64,
    /// Where the figures are from.
    pub source: &'static str,
}

const RK_README: &str = "invisiofficial/rk-llama.cpp README (Orange Pi 5 Max, taskset 4-7 -t 4)";

const fn row(
    model: &'static str,
    dims: CpuDims,
    types: (FileType, FileType),
    pp512: f64,
    tg128: f64,
) -> CpuRow {
    CpuRow {
        model,
        board: "rk3588",
        dims,
        types,
        file_bytes: None,
        pp512,
        tg128,
        source: RK_README,
    }
}

/// The rows the fit uses.
pub const CPU_FIT_ROWS: [CpuRow; 3] = [
    row(
        "Gemma 3 1B Q4_0",
        GEMMA3_1B,
        (FileType::Q4_0, FileType::Q8_0),
        164.7,
        28.3,
    ),
    row(
        "Gemma 3 1B Q8_0",
        GEMMA3_1B,
        (FileType::Q8_0, FileType::Q8_0),
        73.3,
        19.5,
    ),
    row(
        "Granite-4.0 350M Q4_0",
        GRANITE4_350M,
        (FileType::Q4_0, FileType::Q6_K),
        340.4,
        55.2,
    ),
];

/// Rows predicted with the fitted parameters, never fitted.
pub const CPU_HOLDOUT_ROWS: [CpuRow; 3] = [
    row(
        "Gemma 3 1B F16",
        GEMMA3_1B,
        (FileType::F16, FileType::F16),
        68.5,
        11.1,
    ),
    row(
        "Granite-4.0 350M Q8_0",
        GRANITE4_350M,
        (FileType::Q8_0, FileType::Q8_0),
        163.4,
        40.6,
    ),
    CpuRow {
        model: "Qwen3-30B-A3B Q3_K_S (9.58 GiB)",
        board: "pi5-16g",
        dims: QWEN3_30B_A3B,
        types: (FileType::Q3_K, FileType::Q3_K),
        // 9.58 GiB published, less than every weight at Q3_K would take: the file's own mix
        // (lower-bit experts) is not known; its bytes are.
        file_bytes: Some(QWEN3_Q3KS_BYTES),
        pp512: 10.91,
        tg128: 7.99,
        source: "geerlingguy/ai-benchmarks #47 (Raspberry Pi 5 16 GB, llama.cpp b7651)",
    },
];

/// The published Qwen3-30B-A3B Q3_K_S file's size, bytes (9.58 GiB).
pub const QWEN3_Q3KS_BYTES: f64 = 9.58 * (1u64 << 30) as f64;

/// The board `row` ran on, with the fit `f`.
pub fn row_board(row: &CpuRow, f: &CpuFitted) -> Result<CpuBoard, BoardError> {
    if let Some(b) = CpuBoard::cpu_only(row.board, f) {
        return Ok(b);
    }
    CpuBoard::of(&Board::named(row.board)?, f).ok_or_else(|| BoardError::Unknown {
        name: row.board.into(),
        known: "rk3588, pi5-16g".into(),
    })
}

/// `row` as llama-bench runs it on its board with `f`: (pp512, tg128) tokens per second, ggml's
/// kernels on 4 big-core threads, the whole RAM less the reserve as page cache.
pub fn project_cpu_row(row: &CpuRow, f: &CpuFitted) -> Result<(f64, f64), BoardError> {
    let b = row_board(row, f)?;
    let mut shape = row.dims.shape(row.types.0, row.types.1);
    if let Some(file) = row.file_bytes {
        let scale = file / shape.file_bytes();
        shape.bytes_scale = scale;
        shape.other_bytes = (shape.other_bytes as f64 * scale) as u64;
    }
    let plan = CpuPlan {
        threads: 4,
        pool: crate::cpu::Pool::Even,
        kernels: Kernels::Ggml,
        cache_bytes: b.ram_bytes - b.reserved_bytes,
        kv_bytes: 2,
    };
    let pp = 512.0 / prefill_s(&shape, &b, &plan, 512);
    // tg128 starts from an empty context.
    Ok((pp, 128.0 / decode_s(&shape, &b, &plan, 0, 128)))
}

/// Sum of squared log errors of pp512 and tg128 over [`CPU_FIT_ROWS`].
pub fn cpu_loss(f: &CpuFitted) -> Result<f64, BoardError> {
    let mut sum = 0.0;
    for row in &CPU_FIT_ROWS {
        let (pp, tg) = project_cpu_row(row, f)?;
        sum += (pp / row.pp512).ln().powi(2) + (tg / row.tg128).ln().powi(2);
    }
    Ok(sum)
}

/// Fit the three parameters on [`CPU_FIT_ROWS`]: Nelder–Mead over their logarithms from a fixed
/// start, a fixed number of iterations (deterministic).
pub fn fit_cpu() -> Result<(CpuFitted, f64), BoardError> {
    let to = |x: &[f64; 3]| CpuFitted {
        read_frac: x[0].exp(),
        layer_s: x[1].exp(),
        gemm_gain: x[2].exp(),
    };
    let start = [(0.6f64).ln(), (100e-6f64).ln(), (1.0f64).ln()];
    let (x, loss) = nelder_mead(|x| cpu_loss(&to(x)), start, 200)?;
    Ok((to(&x), loss))
}
