//! Calibration: the three free parameters of the RK3588 (effective int8 NPU throughput, the NPU's
//! weight read rate, the fixed cost per call) fitted on three rows of rkllm v1.3.0's RK3588 w8a8
//! table by replaying ork's schedule for models of the same shapes; and the published rows the
//! fit is judged on without refitting. See `docs/board-model.md`.

use crate::events::WeightType;
use crate::params::{Board, Chip};
use crate::projection::Projection;
use crate::replay::{replay, ReplayOptions};
use crate::schedule::{schedule, Dims, ModelShape, Plan};
use crate::BoardError;

/// The fitted parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fitted {
    /// Effective int8 NPU ops per second.
    pub npu_int8_ops: f64,
    /// NPU weight read rate, bytes per second.
    pub npu_read_bw: f64,
    /// Fixed cost per matmul call, seconds.
    pub call_s: f64,
}

/// The RK3588 fit, as [`fit_rk3588`] computes it (a test recomputes it).
pub const FITTED_RK3588: Fitted = Fitted {
    npu_int8_ops: 1.1985e12,
    npu_read_bw: 30.764e9,
    call_s: 25.377e-6,
};

/// One published row: a model's shape, its weight type on the chip, and rkllm's figures.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The model as the table names it.
    pub model: &'static str,
    /// The chip.
    pub chip: &'static str,
    /// rkllm's dtype (w8a8, w4a16).
    pub dtype: &'static str,
    /// The shape ork replays (the real architecture's dimensions).
    pub dims: Dims,
    /// What the shape stands for, where it is an approximation.
    pub note: &'static str,
    /// Published TTFT, seconds (128 prompt tokens).
    pub ttft_s: f64,
    /// Published decode tokens per second (64 new tokens).
    pub decode_tok_s: f64,
    /// The rkllm version of the figure.
    pub source: &'static str,
}

const fn dims(
    n_layer: usize,
    d_model: usize,
    ffn: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    vocab: usize,
) -> Dims {
    Dims {
        n_layer,
        d_model,
        ffn,
        n_head,
        n_head_kv,
        head_dim,
        vocab,
    }
}

const V130: &str = "rkllm v1.3.0 benchmark.md";

/// The three rows the fit uses (rkllm v1.3.0, RK3588, w8a8).
pub const FIT_ROWS: [Row; 3] = [
    Row {
        model: "Qwen2-0.5B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(24, 896, 4864, 14, 2, 64, 151936),
        note: "",
        ttft_s: 0.14590,
        decode_tok_s: 41.58,
        source: V130,
    },
    Row {
        model: "Qwen2.5-1.5B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(28, 1536, 8960, 12, 2, 128, 151936),
        note: "",
        ttft_s: 0.37831,
        decode_tok_s: 16.69,
        source: V130,
    },
    Row {
        model: "Phi3-3.8B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(32, 3072, 8192, 32, 32, 96, 32064),
        note: "phi3 modelled as a llama shape with its dimensions (fused qkv and gate/up split)",
        ttft_s: 1.01728,
        decode_tok_s: 7.45,
        source: V130,
    },
];

/// Rows not used by the fit: predicted with the fitted parameters, never tuned per row.
pub const HOLDOUT_ROWS: [Row; 8] = [
    Row {
        model: "Qwen3-0.6B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(28, 1024, 3072, 16, 8, 128, 151936),
        note: "q/k norms not modelled",
        ttft_s: 0.19909,
        decode_tok_s: 32.91,
        source: V130,
    },
    Row {
        model: "TinyLLAMA-1.1B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(22, 2048, 5632, 32, 4, 64, 32000),
        note: "",
        ttft_s: 0.24393,
        decode_tok_s: 24.43,
        source: V130,
    },
    Row {
        model: "InternLM2-1.8B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(24, 2048, 8192, 16, 8, 128, 92544),
        note: "",
        ttft_s: 0.38014,
        decode_tok_s: 15.45,
        source: V130,
    },
    Row {
        model: "Gemma2-2B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(26, 2304, 9216, 8, 4, 256, 256000),
        note: "logit soft-capping, sliding window and the extra norms not modelled",
        ttft_s: 0.59841,
        decode_tok_s: 10.37,
        source: V130,
    },
    Row {
        model: "ChatGLM3-6B",
        chip: "rk3588",
        dtype: "w8a8",
        dims: dims(28, 4096, 13696, 32, 2, 128, 65024),
        note: "modelled as a llama shape with its dimensions",
        ttft_s: 1.35294,
        decode_tok_s: 4.98,
        source: V130,
    },
    Row {
        model: "Qwen2-0.5B",
        chip: "rk3576",
        dtype: "w4a16",
        dims: FIT_ROWS[0].dims,
        note: "RK3576 parameters partly assumed",
        ttft_s: 0.34237,
        decode_tok_s: 32.56,
        source: V130,
    },
    Row {
        model: "Qwen2.5-1.5B",
        chip: "rk3576",
        dtype: "w4a16",
        dims: FIT_ROWS[1].dims,
        note: "RK3576 parameters partly assumed",
        ttft_s: 0.959,
        decode_tok_s: 14.5,
        source: "rkllm v1.2.1 benchmark.md",
    },
    Row {
        model: "Phi3-3.8B",
        chip: "rk3576",
        dtype: "w4a16",
        dims: FIT_ROWS[2].dims,
        note: "RK3576 parameters partly assumed",
        ttft_s: 1.82912,
        decode_tok_s: 6.58,
        source: V130,
    },
];

/// The projection of `row` (128 prompt tokens, 64 generated, resident) with `chip`, an RK3588
/// model (an RK3576 row derives its chip from it, [`Chip::rk3576_from`]).
pub fn project_row(row: &Row, chip: &Chip) -> Result<Projection, BoardError> {
    let ty = match row.dtype {
        "w4a16" => WeightType::Int4,
        _ => WeightType::Int8,
    };
    let chip = match row.chip {
        "rk3576" => Chip::rk3576_from(chip.clone()),
        _ => chip.clone(),
    };
    let board = Board {
        chip,
        ..Board::named(row.chip)?
    };
    let shape = ModelShape::from_dims(&row.dims, ty, &board.chip);
    let plan = Plan {
        resident: true,
        slots: 0,
        budget_bytes: shape.total_bytes(),
        prompt_tokens: 128,
        gen_tokens: 64,
        kv_bytes: 2,
    };
    let events = schedule(&shape, &plan)?;
    let timeline = replay(
        &events,
        &board,
        ReplayOptions {
            preload: true,
            device_bytes: shape.total_bytes() as f64,
            prefetch_slots: None,
        },
    )?;
    Ok(Projection::new(&timeline, &board, 128, 64))
}

/// The rk3588 chip with `f`'s parameters.
pub fn with_fit(f: &Fitted) -> Chip {
    Chip {
        npu_int8_ops: f.npu_int8_ops,
        npu_read_bw: f.npu_read_bw,
        call_s: f.call_s,
        ..Chip::rk3588()
    }
}

/// Sum of squared log errors of TTFT and decode over [`FIT_ROWS`].
pub fn loss(f: &Fitted) -> Result<f64, BoardError> {
    let chip = with_fit(f);
    let mut sum = 0.0;
    for row in &FIT_ROWS {
        let p = project_row(row, &chip)?;
        let d = p.decode_tok_s.unwrap_or(0.0).max(1e-9);
        sum += (p.ttft_s / row.ttft_s).ln().powi(2) + (d / row.decode_tok_s).ln().powi(2);
    }
    Ok(sum)
}

/// Fit the three parameters on [`FIT_ROWS`]: Nelder–Mead over their logarithms from a fixed
/// start, a fixed number of iterations (deterministic).
pub fn fit_rk3588() -> Result<(Fitted, f64), BoardError> {
    let to = |x: &[f64; 3]| Fitted {
        npu_int8_ops: x[0].exp(),
        npu_read_bw: x[1].exp(),
        call_s: x[2].exp(),
    };
    let start = [(1e12f64).ln(), (25e9f64).ln(), (30e-6f64).ln()];
    let (x, loss) = nelder_mead(|x| loss(&to(x)), start, 120)?;
    Ok((to(&x), loss))
}

/// Nelder–Mead minimization of `f` over three coordinates from `start` (steps of 0.3 in each),
/// `iterations` times: deterministic. The best point and its value.
pub(crate) fn nelder_mead(
    f: impl Fn(&[f64; 3]) -> Result<f64, BoardError>,
    start: [f64; 3],
    iterations: usize,
) -> Result<([f64; 3], f64), BoardError> {
    let mut simplex: Vec<([f64; 3], f64)> = Vec::new();
    for i in 0..4 {
        let mut x = start;
        if i > 0 {
            x[i - 1] += 0.3;
        }
        simplex.push((x, f(&x)?));
    }
    for _ in 0..iterations {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let centroid: [f64; 3] =
            std::array::from_fn(|j| simplex[..3].iter().map(|s| s.0[j]).sum::<f64>() / 3.0);
        let worst = simplex[3];
        let at = |t: f64| -> [f64; 3] {
            std::array::from_fn(|j| centroid[j] + t * (worst.0[j] - centroid[j]))
        };
        let r = at(-1.0);
        let fr = f(&r)?;
        if fr < simplex[0].1 {
            let e = at(-2.0);
            let fe = f(&e)?;
            simplex[3] = if fe < fr { (e, fe) } else { (r, fr) };
        } else if fr < simplex[2].1 {
            simplex[3] = (r, fr);
        } else {
            let c = at(0.5);
            let fc = f(&c)?;
            if fc < worst.1 {
                simplex[3] = (c, fc);
            } else {
                let best = simplex[0].0;
                for s in simplex.iter_mut().skip(1) {
                    s.0 = std::array::from_fn(|j| best[j] + 0.5 * (s.0[j] - best[j]));
                    s.1 = f(&s.0)?;
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(simplex[0])
}
