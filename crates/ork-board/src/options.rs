//! Execution choices beside the engine pairing, for judging a goal against its ceiling: the CPU
//! engine on its default big cores and on a core list with the little cores (ork's pool), and
//! the row-split decode (dense rows on the NPU at int8, the rest and every expert on the CPU)
//! with either. Each is projected for the same request, and each says whether ork runs it; each
//! is also a pairing [`crate::engines::choose`] weighs, so `--device auto` runs it where it is
//! fastest. Every figure is a projection (`docs/board-model.md`).

use serde::Serialize;

use crate::cpu::{
    decode_bounds, project, CpuBoard, CpuPlan, CpuShape, DecodeBounds, Kernels, Pool,
};
use crate::split::split_decode;

/// One execution choice, projected.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecOption {
    /// What runs where.
    pub mode: &'static str,
    /// Whether ork runs it, and how it is asked for.
    pub status: &'static str,
    /// Time to first token, seconds (`None`: a decode-only choice; prefill as chosen).
    pub ttft_s: Option<f64>,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
    /// What one decode step's time is made of (the CPU engine's choices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_bounds: Option<DecodeBounds>,
}

/// Bytes of the dense (non-expert) weights at int8 with per-output-channel f32 scales (ork's
/// pack): what the NPU holds for a row-split decode.
pub fn dense_int8_bytes(shape: &CpuShape) -> f64 {
    shape
        .weights
        .iter()
        .filter(|w| w.experts <= 1)
        .map(|w| (w.k * w.n + 4 * w.n) as f64)
        .sum()
}

/// The CPU engine's plan on `b`: `threads` threads in ork's pool, ork's kernels, `cache` bytes
/// of page cache.
pub fn ork_plan(threads: usize, cache: f64) -> CpuPlan {
    CpuPlan {
        threads,
        pool: Pool::Chunks,
        kernels: Kernels::Ork,
        cache_bytes: cache.max(0.0),
        kv_bytes: 2,
    }
}

/// The choices for a request of `prompt` tokens generating `gen` on `b`, the CPU alone having
/// `cache` bytes of page cache (the RAM less the system's reserve).
pub fn options(
    shape: &CpuShape,
    b: &CpuBoard,
    cache: f64,
    prompt: usize,
    gen: usize,
) -> Vec<ExecOption> {
    let big = b.cpu.big.0 as usize;
    let all = big + b.cpu.little.0 as usize;
    let mut out = Vec::new();
    let mut cpu = |threads: usize, mode, status| {
        let plan = ork_plan(threads, cache);
        let p = project(shape, b, &plan, prompt, gen);
        out.push(ExecOption {
            mode,
            status,
            ttft_s: Some(p.ttft_s),
            decode_tok_s: p.decode_tok_s,
            decode_bounds: Some(decode_bounds(shape, b, &plan, prompt + gen / 2)),
        });
    };
    cpu(
        big,
        "cpu: big cores",
        "runs: --device cpu (the default cores)",
    );
    if all > big {
        cpu(
            all,
            "cpu: big and little cores",
            "runs: --device cpu --cpus with every core (ork's pool: chunks taken as workers finish)",
        );
    }
    // The NPU holds the dense weights at int8; the page cache what is left.
    let left = cache - dense_int8_bytes(shape);
    let mut split = |threads: usize, mode, status| {
        if let Some(s) = split_decode(shape, b, &ork_plan(threads, left), prompt + gen / 2) {
            out.push(ExecOption {
                mode,
                status,
                ttft_s: None,
                decode_tok_s: s.decode_tok_s,
                decode_bounds: None,
            });
        }
    };
    split(
        big,
        "split decode: dense rows on the NPU (int8) and the big cores; experts, attention on the CPU",
        "runs: --device auto where fastest (cpu/split, the NPU holding the dense weights), or \
         --decode-device split (each dense weight at its own share: --split-rows auto)",
    );
    if all > big {
        split(
            all,
            "split decode, the CPU's share on big and little cores",
            "runs: --device auto where fastest (cpu/split on every core), or --decode-device \
             split --cpus with every core",
        );
    }
    out
}
