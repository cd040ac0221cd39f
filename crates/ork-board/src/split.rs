//! Both engines on one decode step or one prefill pass, and the one DDR bus they share.
//!
//! Issue 38 item 2 asks, in board time, whether splitting each decode matmul by output rows
//! between the NPU (int8 rows from the pack) and the CPU (the rest at the file's bits) projects
//! ≥ 1.15× the best single engine. Both halves read DDR at once, so the board's one bus is
//! shared: per weight, the step takes the longest of
//! - the NPU's share `f` of the rows: its device calls (`Chip::calls` of the share) × `call_s`
//!   plus the larger of its int8 bytes ÷ `npu_read_bw` and its operations ÷ `npu_int8_ops`
//!   (decode calls are read-bound, as in the replay);
//! - the CPU's share `1 − f`: its [`crate::cpu::weight_cost`] (compute and reads) scaled by the
//!   share;
//! - the bus: both shares' bytes ÷ the board's theoretical `ddr_bw` (the same cap the NPU
//!   replay's shared bus uses: an upper bound on what two readers can draw together);
//!
//! with `f` chosen per weight from 0, 1/32, …, 1 (0: the CPU alone, so a split never projects
//! slower than the CPU engine). Expert weights stay on the CPU (issue 38 item 3: routed experts
//! come from the GGUF's pages). Attention, norms and the fixed per-block cost run on the CPU
//! ([`crate::cpu::attention_s`]). Not modelled: the cost of joining the two halves of each
//! output (assumed hidden in `call_s`, which already includes waiting for the NPU), and any
//! slowdown of one reader by the other beyond the shared byte rate.
//!
//! The prefill split ([`split_prefill`], `--prefill-device split`) shares each dense matmul's
//! rows the same way over a prompt's passes of `M` rows (one pass for `ork run`; chunks for
//! `serve`): per weight and pass, the longest of the NPU's share (its calls × `call_s` plus
//! the larger of its traffic — its int8 rows, the activations once per call, f32 outputs, as
//! the replay charges a matmul — ÷ `npu_read_bw` and its `2·M·K·rows` operations ÷
//! `npu_int8_ops`), the CPU's share (the CPU's prefill cost of the weight at `M`,
//! [`crate::cpu::weight_cost`], scaled by `1 − f`) and both shares' bytes ÷ `ddr_bw`; one
//! share per weight for every pass, the best of the same grid. Attention, norms and the fixed
//! per-block cost run on the CPU as its prefill charges them ([`crate::cpu::attention_s`]);
//! experts stay on the CPU. Not modelled: the NPU share's activation quantization (a host
//! operation the replay charges at 3 flops per activation value, well under 1 % of a prefill)
//! and joining the rows.
//!
//! The same bus binds a pairing whose phases overlap: in `serve`, the NPU's prefill of one
//! request beside the CPU's decode of another. [`cpu_read_bw_beside`] gives the CPU's read rate
//! while the NPU draws its share. A single request's pairing runs prefill, then decode: the
//! phases never overlap and [`crate::engines::choose`] needs no bus term.
//!
//! Every figure is a projection (`docs/board-model.md`).

use serde::Serialize;

use crate::cpu::{attention_s, weight_cost, CpuBoard, CpuPlan, CpuShape};
use crate::events::WeightType;
use crate::Chip;

/// Steps of the row share tried per weight (`f` = i / `SHARES`).
pub const SHARES: usize = 32;

/// A row-split decode, projected.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SplitDecode {
    /// Decode tokens per second with every dense weight split at its best share.
    pub decode_tok_s: f64,
    /// The CPU alone, the same model (the split's `f` = 0 everywhere).
    pub cpu_decode_tok_s: f64,
    /// Share of the dense weights' rows (weighted by int8 bytes) the NPU takes.
    pub npu_row_share: f64,
    /// Share of the step's matmul time that is bus-bound (both readers at the bus's rate).
    pub bus_bound_share: f64,
}

/// One weight's step time with the NPU taking share `f` of its rows, and whether the bus is
/// what binds.
fn split_weight_s(
    chip: &Chip,
    k: usize,
    n: usize,
    cpu: &crate::cpu::WeightCost,
    ddr_bw: f64,
    f: f64,
) -> (f64, bool) {
    let cpu_s = (1.0 - f) * cpu.compute_s.max(cpu.read_s);
    let npu_s = if f > 0.0 {
        let rows = ((n as f64 * f).ceil() as usize).max(1);
        let bytes = (k * rows) as f64;
        let calls = chip.calls(k, rows, WeightType::Int8) as f64;
        calls * chip.call_s + (bytes / chip.npu_read_bw).max(2.0 * bytes / chip.npu_int8_ops)
    } else {
        0.0
    };
    let bus_s = (f * (k * n) as f64 + (1.0 - f) * cpu.bus_bytes) / ddr_bw;
    let engines = cpu_s.max(npu_s);
    (engines.max(bus_s), bus_s > engines && f > 0.0)
}

/// One dense weight's best share of rows for the NPU among 0, 1/[`SHARES`], …, 1, its step
/// time there, and whether the bus binds it; 0 (the CPU alone) unless a share is strictly
/// faster.
fn best_share(
    chip: &Chip,
    w: &crate::cpu::CpuWeight,
    cost: &crate::cpu::WeightCost,
    ddr_bw: f64,
) -> (f64, f64, bool) {
    best_of(cost.compute_s.max(cost.read_s), |f| {
        split_weight_s(chip, w.k, w.n, cost, ddr_bw, f)
    })
}

/// The share among 0, 1/[`SHARES`], …, 1 whose `time` (seconds, and whether the bus binds) is
/// least, its time and binding; 0 (the time `cpu_only`) unless a share is strictly faster.
fn best_of(cpu_only: f64, time: impl Fn(f64) -> (f64, bool)) -> (f64, f64, bool) {
    (0..=SHARES)
        .map(|i| i as f64 / SHARES as f64)
        .map(|f| (f, time(f)))
        .fold((0.0, cpu_only, false), |best, (f, (t, bound))| {
            if t < best.1 {
                (f, t, bound)
            } else {
                best
            }
        })
}

/// The NPU's share of each of `shape.weights`' rows (in its order) that [`split_decode`]
/// projects best on `b`, the CPU planned as `plan`, at `context` positions: what
/// `--split-rows auto` runs, weight by weight. Expert weights 0 (they stay on the CPU). `None`
/// without an NPU.
pub fn split_shares(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    context: usize,
) -> Option<Vec<f64>> {
    Some(split_weights(shape, b, plan, context)?.0)
}

/// The split decode of `shape` on `b` (which must have an NPU, `b.chip`), the CPU planned as
/// `plan` (its page cache: what the NPU's buffers leave), one decode step at `context`
/// positions. `None` without an NPU.
pub fn split_decode(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    context: usize,
) -> Option<SplitDecode> {
    Some(split_weights(shape, b, plan, context)?.1)
}

/// [`split_shares`] and [`split_decode`], from one pass over the weights.
fn split_weights(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    context: usize,
) -> Option<(Vec<f64>, SplitDecode)> {
    let chip = b.chip.as_ref()?;
    let rest = attention_s(shape, b, plan, 1, context);
    let (mut split, mut alone, mut bus, mut npu_bytes, mut all_bytes) = (rest, rest, 0.0, 0.0, 0.0);
    let mut shares = Vec::with_capacity(shape.weights.len());
    for w in &shape.weights {
        let cost = weight_cost(shape, w, b, plan, 1);
        let cpu_only = cost.compute_s.max(cost.read_s);
        alone += cpu_only;
        if w.experts > 1 {
            split += cpu_only;
            shares.push(0.0);
            continue;
        }
        let (f, t, bound) = best_share(chip, w, &cost, b.ddr_bw);
        split += t;
        if bound {
            bus += t;
        }
        shares.push(f);
        npu_bytes += f * (w.k * w.n) as f64;
        all_bytes += (w.k * w.n) as f64;
    }
    let decode = SplitDecode {
        decode_tok_s: 1.0 / split,
        cpu_decode_tok_s: 1.0 / alone,
        npu_row_share: if all_bytes > 0.0 {
            npu_bytes / all_bytes
        } else {
            0.0
        },
        bus_bound_share: bus / split,
    };
    Some((shares, decode))
}

/// A row-split prefill, projected: the prompt's passes with each dense matmul's rows shared by
/// the NPU (int8, resident) and the CPU (the file's bits) at once, each weight at the share the
/// clock projects best for it ([`split_prefill`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SplitPrefill {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Time to first token, every dense weight at its best share, seconds.
    pub ttft_s: f64,
    /// The CPU alone, the same passes (every share 0): for one pass,
    /// [`crate::cpu::prefill_s`].
    pub cpu_ttft_s: f64,
    /// Every dense weight on the NPU alone (every share 1; experts, attention on the CPU), in
    /// this model: beside the replay's NPU prefill, which charges the host's norms and
    /// activation quantization where this model charges the CPU's fixed cost per block.
    pub npu_ttft_s: f64,
    /// Share of the dense weights' rows (weighted by int8 bytes) the NPU takes.
    pub npu_row_share: f64,
    /// Share of the prefill's matmul time that is bus-bound.
    pub bus_bound_share: f64,
}

/// The passes (rows, context) of a prefill of `prompt` tokens in chunks of at most `chunk`
/// (`ork run` prefills in one pass: `chunk` ≥ `prompt`; `ork serve` in `--prefill-chunk`s).
pub fn prefill_passes(prompt: usize, chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    (0..prompt)
        .step_by(chunk)
        .map(|start| (chunk.min(prompt - start), start))
        .collect()
}

/// The NPU's share `f` of a `k × n` int8 weight in a pass of `m` activation rows, charged as
/// the replay charges a matmul: its calls × `call_s`, plus the larger of its traffic (the
/// rows' weights, the activations once per call, f32 outputs) ÷ `npu_read_bw` and its
/// operations ÷ `npu_int8_ops`. Returns the seconds and the bytes it moves over the bus.
fn npu_rows_s(chip: &Chip, (k, n): (usize, usize), m: usize, f: f64) -> (f64, f64) {
    if f <= 0.0 {
        return (0.0, 0.0);
    }
    let rows = ((n as f64 * f).ceil() as usize).clamp(1, n.max(1));
    let calls = chip.calls(k, rows, WeightType::Int8) as f64;
    let traffic = (k * rows) as f64 + (m * k) as f64 * calls + 4.0 * (m * rows) as f64;
    let compute = 2.0 * (m * k * rows) as f64 / chip.npu_int8_ops;
    (
        calls * chip.call_s + (traffic / chip.npu_read_bw).max(compute),
        traffic,
    )
}

/// One weight's prefill time over its passes (`runs`: the activation rows of each pass that
/// computes it and the CPU's cost there) with the NPU taking share `f` of its rows, and whether
/// the bus binds most of it. Per pass: the longest of the NPU's share, the CPU's share (its
/// cost scaled by `1 − f`) and both shares' bytes at the bus's rate.
fn prefill_weight_s(
    chip: &Chip,
    w: &crate::cpu::CpuWeight,
    runs: &[(usize, crate::cpu::WeightCost)],
    ddr_bw: f64,
    f: f64,
) -> (f64, bool) {
    let (mut total, mut bound) = (0.0, 0.0);
    for (m, cpu) in runs {
        let cpu_s = (1.0 - f) * cpu.compute_s.max(cpu.read_s);
        let (npu_s, npu_bytes) = npu_rows_s(chip, (w.k, w.n), *m, f);
        let bus_s = (npu_bytes + (1.0 - f) * cpu.bus_bytes) / ddr_bw;
        let engines = cpu_s.max(npu_s);
        total += engines.max(bus_s);
        if bus_s > engines && f > 0.0 {
            bound += bus_s;
        }
    }
    (total, bound > total / 2.0)
}

/// The row-split prefill of `shape` on `b` (which must have an NPU, `b.chip`; its weights
/// resident at int8), the CPU planned as `plan`, a prompt of `prompt` tokens in passes of at
/// most `chunk` rows ([`prefill_passes`]): each dense weight's best NPU share of its rows (in
/// `shape.weights`' order; experts 0: they stay on the CPU), what `--split-rows auto` runs for
/// the prefill, and the projection. Attention, norms and the fixed cost per block run on the
/// CPU as its prefill charges them ([`crate::cpu::attention_s`]); the output projection is
/// computed for the prompt's last row, in the last pass. `None` without an NPU.
pub fn split_prefill(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    prompt: usize,
    chunk: usize,
) -> Option<(Vec<f64>, SplitPrefill)> {
    let chip = b.chip.as_ref()?;
    let passes = prefill_passes(prompt, chunk);
    let rest: f64 = passes
        .iter()
        .map(|&(m, context)| attention_s(shape, b, plan, m, context))
        .sum();
    let (mut split, mut cpu, mut npu, mut bus) = (rest, rest, rest, 0.0);
    let (mut npu_bytes, mut all_bytes) = (0.0, 0.0);
    let mut shares = Vec::with_capacity(shape.weights.len());
    for w in &shape.weights {
        let last = passes.len().saturating_sub(1);
        let runs: Vec<(usize, crate::cpu::WeightCost)> = passes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !w.output || i == last)
            .map(|(_, &(m, _))| {
                let rows = if w.output { 1 } else { m };
                (rows, weight_cost(shape, w, b, plan, m))
            })
            .collect();
        let time = |f| prefill_weight_s(chip, w, &runs, b.ddr_bw, f);
        let cpu_only = time(0.0).0;
        cpu += cpu_only;
        if w.experts > 1 {
            split += cpu_only;
            npu += cpu_only;
            shares.push(0.0);
            continue;
        }
        npu += time(1.0).0;
        let (f, t, bound) = best_of(cpu_only, time);
        split += t;
        if bound {
            bus += t;
        }
        shares.push(f);
        npu_bytes += f * (w.k * w.n) as f64;
        all_bytes += (w.k * w.n) as f64;
    }
    let matmuls = split - rest;
    let projected = SplitPrefill {
        prompt_tokens: prompt,
        ttft_s: split,
        cpu_ttft_s: cpu,
        npu_ttft_s: npu,
        npu_row_share: if all_bytes > 0.0 {
            npu_bytes / all_bytes
        } else {
            0.0
        },
        bus_bound_share: if matmuls > 0.0 { bus / matmuls } else { 0.0 },
    };
    Some((shares, projected))
}

/// The CPU's all-core read rate while the NPU draws `npu_bytes_per_s` from the same bus: the
/// lesser of its own rate and what the bus (`ddr_bw`, theoretical) has left, never below a
/// fair half of the bus (two readers that both want more than half are assumed to get half
/// each).
pub fn cpu_read_bw_beside(b: &CpuBoard, npu_bytes_per_s: f64) -> f64 {
    let own = b.cpu.read_bw.min(b.ddr_bw);
    let left = (b.ddr_bw - npu_bytes_per_s.max(0.0)).max(b.ddr_bw / 2.0);
    own.min(left)
}
