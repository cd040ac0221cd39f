//! `ork plan --project`: engines per phase. The NPU's projection (the board clock's replay)
//! beside the CPU engine's (`ork_board::cpu`, the GGUF's blocks at their own bits), every
//! pairing of the two, and the fastest by `ork_board::engines::RULE`. Every figure projected.

use std::path::Path;

use anyhow::{Context, Result};
use ork_board::cpu::{project, CpuBoard, CpuPlan, CpuShape, CpuWeight, Kernels};
use ork_board::engines::{
    choose, Choice, Cores, CpuInputs, Engine, EngineInputs, NpuHolds, Phases,
};
use ork_board::split::{
    cpu_read_bw_beside, split_decode, split_prefill, split_shares, SplitDecode, SplitPrefill,
};
use ork_board::Projection;
use ork_residency::{Mode, Plan as Placement};

/// The CPU engine's shape of the model at `path`: every matmul weight of `manifest` at its GGUF
/// type (an expert tensor once, with its expert count), the output projection computed for the
/// last row of a pass; the untied token embedding's bytes beside them.
pub fn cpu_shape(
    path: &Path,
    manifest: &ork_manifest::Manifest,
    c: &ork_exec::ModelConfig,
) -> Result<CpuShape> {
    let mut weights = Vec::new();
    let mut output_tensor = None;
    for w in shape_order(manifest) {
        let ty = w.slice.ty;
        let name = ty.name().unwrap_or("unknown");
        let ty = ork_board::cpu::file_type(name).with_context(|| {
            format!(
                "{}: tensor '{}' has type {name}, which the board clock's CPU model does not cost",
                path.display(),
                w.tensor
            )
        })?;
        let output = w.layer.is_none();
        if output {
            output_tensor = Some(w.tensor.clone());
        }
        weights.push(CpuWeight {
            k: w.k,
            n: w.n,
            ty,
            experts: if w.expert.is_some() {
                manifest.n_expert() as usize
            } else {
                1
            },
            output,
        });
    }
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let other_bytes = gguf
        .tensor("token_embd.weight")
        .filter(|_| output_tensor.as_deref() != Some("token_embd.weight"))
        .map_or(0, |t| t.size);
    Ok(CpuShape {
        n_layer: c.n_layer,
        heads: (c.n_head, c.n_head_kv, c.head_dim_k),
        windows: crate::cmd_project::windows(c),
        weights,
        top_k: manifest.n_expert_used() as usize,
        bytes_scale: 1.0,
        other_bytes,
    })
}

/// The manifest's weights in the order of [`cpu_shape`]'s: execution order, an expert tensor
/// once (its first slice).
fn shape_order(
    manifest: &ork_manifest::Manifest,
) -> impl Iterator<Item = &ork_manifest::Weight> + '_ {
    manifest
        .execution_order()
        .filter(|w| w.expert.is_none_or(|e| e == 0))
}

/// One kind of dense weight (its K, N and file type) and the NPU's share of its rows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ShapeShare {
    /// Inner dimension.
    pub k: usize,
    /// Output rows.
    pub n: usize,
    /// The file's type.
    #[serde(rename = "type")]
    pub ty: String,
    /// Weights of this kind.
    pub weights: usize,
    /// The NPU's share of their rows.
    pub share: f64,
}

/// The row split the board clock projects, each weight at its own best share.
#[derive(Clone, Debug)]
pub struct BoardSplit {
    /// The projection.
    pub decode: SplitDecode,
    /// Each weight's NPU share of its rows, by manifest weight index (expert slices 0: they
    /// stay on the CPU).
    pub shares: Vec<f64>,
    /// The shares by kind of dense weight, in execution order.
    pub by_shape: Vec<ShapeShare>,
}

/// The row split on `b` of the model whose CPU shape is `shape` (of `manifest`), the NPU's
/// buffers holding `npu_bytes` of the RAM, one decode step at `context` positions, the CPU on
/// its big cores. `None` without an NPU.
pub fn board_split(
    manifest: &ork_manifest::Manifest,
    shape: &CpuShape,
    b: &CpuBoard,
    npu_bytes: f64,
    context: usize,
) -> Option<BoardSplit> {
    board_split_on(manifest, shape, b, (npu_bytes, Cores::Big), context)
}

/// [`board_split`] with the CPU's share on `cores`.
pub fn board_split_on(
    manifest: &ork_manifest::Manifest,
    shape: &CpuShape,
    b: &CpuBoard,
    (npu_bytes, cores): (f64, Cores),
    context: usize,
) -> Option<BoardSplit> {
    let plan = cpu_plan_on(b, b.ram_bytes - b.reserved_bytes - npu_bytes, cores);
    let decode = split_decode(shape, b, &plan, context)?;
    let per_shape = split_shares(shape, b, &plan, context)?;
    let (shares, by_shape) = per_weight(manifest, shape, &per_shape);
    Some(BoardSplit {
        decode,
        shares,
        by_shape,
    })
}

/// The row-split prefill the board clock projects, each weight at its own best share.
#[derive(Clone, Debug)]
pub struct BoardPrefillSplit {
    /// The projection.
    pub prefill: SplitPrefill,
    /// Each weight's NPU share of its rows, by manifest weight index (expert slices 0).
    pub shares: Vec<f64>,
    /// The shares by kind of dense weight, in execution order.
    pub by_shape: Vec<ShapeShare>,
}

/// The row-split prefill on `b` of the model whose CPU shape is `shape` (of `manifest`), the
/// NPU's buffers holding `npu_bytes` of the RAM, the CPU's share on `cores`, a prompt of
/// `prompt` tokens in one pass (as `ork run` prefills). `None` without an NPU.
pub fn board_prefill_split(
    manifest: &ork_manifest::Manifest,
    shape: &CpuShape,
    b: &CpuBoard,
    (npu_bytes, cores): (f64, Cores),
    prompt: usize,
) -> Option<BoardPrefillSplit> {
    let plan = cpu_plan_on(b, b.ram_bytes - b.reserved_bytes - npu_bytes, cores);
    let (per_shape, prefill) = split_prefill(shape, b, &plan, prompt, prompt)?;
    let (shares, by_shape) = per_weight(manifest, shape, &per_shape);
    Some(BoardPrefillSplit {
        prefill,
        shares,
        by_shape,
    })
}

/// The shares `per_shape` (in `shape`'s weight order) by manifest weight index, and by kind of
/// dense weight.
fn per_weight(
    manifest: &ork_manifest::Manifest,
    shape: &CpuShape,
    per_shape: &[f64],
) -> (Vec<f64>, Vec<ShapeShare>) {
    let mut shares = vec![0.0; manifest.weights().len()];
    for (w, &f) in shape_order(manifest).zip(per_shape) {
        if let Some(slot) = shares.get_mut(w.id.index()) {
            *slot = f;
        }
    }
    let mut by_shape: Vec<ShapeShare> = Vec::new();
    for (w, &share) in shape.weights.iter().zip(per_shape) {
        if w.experts > 1 {
            continue;
        }
        let ty = format!("{:?}", w.ty);
        match by_shape
            .iter_mut()
            .find(|s| (s.k, s.n, s.ty.as_str(), s.share) == (w.k, w.n, ty.as_str(), share))
        {
            Some(s) => s.weights += 1,
            None => by_shape.push(ShapeShare {
                k: w.k,
                n: w.n,
                ty,
                weights: 1,
                share,
            }),
        }
    }
    (shares, by_shape)
}

/// The CPU engine's phases on `b` with `cache_bytes` of page cache on `cores`, ork's kernels
/// (ggml's cycles where ork's are not estimated).
fn cpu_phases(
    shape: &CpuShape,
    b: &CpuBoard,
    (cache_bytes, cores): (f64, Cores),
    prompt: usize,
    gen: usize,
) -> Phases {
    let p = project(shape, b, &cpu_plan_on(b, cache_bytes, cores), prompt, gen);
    Phases {
        ttft_s: p.ttft_s,
        decode_tok_s: p.decode_tok_s,
    }
}

/// The CPU engine's plan on `cores`: one thread per core (the big ones: llama.cpp's `taskset
/// 4-7 -t 4`; or every one in ork's pool, chunks taken as workers finish), ork's kernels,
/// `cache_bytes` of page cache.
pub(crate) fn cpu_plan_on(b: &CpuBoard, cache_bytes: f64, cores: Cores) -> CpuPlan {
    let threads = match cores {
        Cores::Big => b.cpu.big.0,
        Cores::All => b.cpu.big.0 + b.cpu.little.0,
    };
    CpuPlan {
        threads: threads as usize,
        pool: ork_board::cpu::Pool::Chunks,
        kernels: Kernels::Ork,
        cache_bytes: cache_bytes.max(0.0),
        kv_bytes: 2,
    }
}

/// A row split projected for one pairing: the CPU's cores and what the NPU holds.
#[derive(Clone, Debug)]
pub struct PairedSplit {
    /// The CPU's cores.
    pub cores: Cores,
    /// What the NPU's buffers hold.
    pub npu_holds: NpuHolds,
    /// The split.
    pub split: BoardSplit,
}

/// A prefill row split projected for one pairing: the CPU's cores and what the NPU holds.
#[derive(Clone, Debug)]
pub struct PairedPrefillSplit {
    /// The CPU's cores.
    pub cores: Cores,
    /// What the NPU's buffers hold.
    pub npu_holds: NpuHolds,
    /// The split.
    pub split: BoardPrefillSplit,
}

/// What [`engines`] projected: the choice, the CPU's shape of the model, and every row split
/// weighed, decode and prefill (each weight's share, by manifest weight index).
type Projected = (
    Choice,
    CpuShape,
    (Vec<PairedSplit>, Vec<PairedPrefillSplit>),
);

/// The RAM the NPU's buffers hold, bytes: the pack as planned (`None`: no NPU projection), and
/// the dense weights alone when they are resident (`None`: they are not, or no NPU).
#[derive(Clone, Copy, Debug, Default)]
pub struct NpuBytes {
    /// The pack as planned, and whether it is resident (the NPU's weights stay in its buffers).
    pub pack: Option<(f64, bool)>,
    /// The dense weights, resident.
    pub dense: Option<f64>,
}

/// Every pairing and the choice, for the model at `path` on `b`: the NPU's projection `npu`
/// with the RAM its device buffers hold, the CPU on its big cores and on every core (where the
/// board has little ones), alone or beside the NPU's buffers, and the row splits: the NPU
/// holding the whole pack (resident) or only the dense weights (resident).
pub fn engines(
    path: &Path,
    manifest: &ork_manifest::Manifest,
    b: &CpuBoard,
    (npu, bytes): (Option<&Projection>, NpuBytes),
    prompt: usize,
    gen: usize,
) -> Result<Projected> {
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let c =
        ork_exec::ModelConfig::from_gguf(&gguf).with_context(|| format!("{}", path.display()))?;
    let shape = cpu_shape(path, manifest, &c)?;
    let cache = b.ram_bytes - b.reserved_bytes;
    let context = prompt + gen / 2;
    let pack = bytes.pack.filter(|_| npu.is_some());
    let (mut splits, mut prefills) = (Vec::new(), Vec::new());
    let mut on = |cores: Cores| {
        let mut prefill = |(npu_bytes, holds): (f64, NpuHolds)| {
            let s = board_prefill_split(manifest, &shape, b, (npu_bytes, cores), prompt)?;
            let ttft = s.prefill.ttft_s;
            prefills.push(PairedPrefillSplit {
                cores,
                npu_holds: holds,
                split: s,
            });
            Some(ttft)
        };
        let split_prefill_ttft_s = pack
            .filter(|&(_, resident)| resident)
            .and_then(|(n, _)| prefill((n, NpuHolds::Pack)));
        let dense_split_prefill_ttft_s = bytes.dense.and_then(|n| prefill((n, NpuHolds::Dense)));
        let phases =
            |npu_bytes: f64| cpu_phases(&shape, b, (cache - npu_bytes, cores), prompt, gen);
        let mut split = |(npu_bytes, holds): (f64, NpuHolds)| {
            let s = board_split_on(manifest, &shape, b, (npu_bytes, cores), context)?;
            let rate = s.decode.decode_tok_s;
            splits.push(PairedSplit {
                cores,
                npu_holds: holds,
                split: s,
            });
            Some(rate)
        };
        CpuInputs {
            alone: Some(phases(0.0)),
            beside_npu: pack.map(|(n, _)| phases(n)),
            // The split needs the NPU's rows resident and the GGUF's pages beside them.
            split_decode_tok_s: pack
                .filter(|&(_, resident)| resident)
                .and_then(|(n, _)| split((n, NpuHolds::Pack))),
            beside_dense: bytes.dense.map(phases),
            dense_split_decode_tok_s: bytes.dense.and_then(|n| split((n, NpuHolds::Dense))),
            split_prefill_ttft_s,
            dense_split_prefill_ttft_s,
        }
    };
    let big = on(Cores::Big);
    let all = (b.cpu.little.0 > 0.0).then(|| on(Cores::All));
    let inputs = EngineInputs {
        npu: npu.and_then(|p| {
            Some(Phases {
                ttft_s: p.ttft_s,
                decode_tok_s: p.decode_tok_s?,
            })
        }),
        big,
        all,
    };
    let choice = choose(&inputs, gen).with_context(|| {
        format!(
            "{}: no engine could be projected on {}",
            path.display(),
            b.name
        )
    })?;
    Ok((choice, shape, (splits, prefills)))
}

/// What `ork plan --project` reports of the engines: the pairings and the choice, the CPU's
/// shape of the model, and the row-split decode (`ork_board::split`; `None` without an NPU
/// plan that holds its split's weights resident).
#[derive(Debug)]
pub struct PlanEngines {
    /// Every pairing and the choice.
    pub choice: Choice,
    /// The CPU engine's shape of the model.
    pub shape: CpuShape,
    /// Decode split by rows between the NPU and the CPU (`--decode-device split` runs it): the
    /// chosen pairing's when it splits, else the fastest projected.
    pub split: Option<SplitDecode>,
    /// That split with each weight's share of its rows for the NPU (what `--split-rows auto`
    /// runs when `--device auto` chooses the split), its cores and what the NPU holds.
    pub split_shares: Option<PairedSplit>,
    /// The prefill split: the chosen pairing's when it splits its prefill, else the fastest
    /// projected, with each weight's share (what `--split-rows auto` runs for the prefill).
    pub prefill_split: Option<PairedPrefillSplit>,
    /// The CPU's decode tok/s while the NPU prefills another request on the same bus (`serve`'s
    /// overlap): its read rate is what the NPU's prefill reads leave (`None` without an NPU).
    pub cpu_decode_beside_prefill: Option<f64>,
    /// The execution choices beside the pairing (`ork_board::options`): core lists, the row
    /// split with only the dense weights on the NPU.
    pub options: Vec<ork_board::options::ExecOption>,
}

/// The NPU's buffers for placement `p` (a resident pack's bytes, or the budget in each domain
/// used).
fn npu_bytes(p: &Placement, budget: u64) -> u64 {
    match p.mode {
        Mode::Resident => p.model_bytes,
        Mode::Streamed => budget * u64::from(p.domains_used.max(1)),
    }
}

/// [`engines`] for `ork plan`'s placement `p` (the NPU's buffers: a resident pack's bytes, or
/// the budget in each domain used) and `dense`, the placement of the dense weights alone (a
/// dense-only split's NPU; `None`: the model has no experts, so `p` is it), `None` without a
/// CPU board.
pub fn for_plan(
    path: &Path,
    manifest: &ork_manifest::Manifest,
    cpu_board: Option<&CpuBoard>,
    (p, dense): (&Placement, Option<&Placement>),
    budget: u64,
    npu: Option<&Projection>,
    (prompt, gen): (usize, usize),
) -> Result<Option<PlanEngines>> {
    let Some(cb) = cpu_board else {
        return Ok(None);
    };
    let npu_bytes = npu_bytes(p, budget);
    let dense = dense.unwrap_or(p);
    let bytes = NpuBytes {
        pack: Some((npu_bytes as f64, p.mode == Mode::Resident)),
        dense: (npu.is_some() && dense.mode == Mode::Resident && dense.runnable)
            .then_some(dense.model_bytes as f64),
    };
    let (choice, shape, (splits, prefills)) =
        engines(path, manifest, cb, (npu, bytes), prompt, gen)?;
    let chosen = choice.engines;
    let prefill_split = prefills
        .iter()
        .find(|s| {
            chosen.prefill == Engine::Split
                && (Some(s.cores), Some(s.npu_holds)) == (chosen.cores, chosen.npu_holds)
        })
        .or_else(|| {
            prefills
                .iter()
                .fold(None, |best: Option<&PairedPrefillSplit>, s| match best {
                    Some(b) if b.split.prefill.ttft_s <= s.split.prefill.ttft_s => Some(b),
                    _ => Some(s),
                })
        })
        .cloned();
    let split_shares = splits
        .iter()
        .find(|s| {
            chosen.decode == Engine::Split
                && (Some(s.cores), Some(s.npu_holds)) == (chosen.cores, chosen.npu_holds)
        })
        .or_else(|| {
            splits
                .iter()
                .fold(None, |best: Option<&PairedSplit>, s| match best {
                    Some(b) if b.split.decode.decode_tok_s >= s.split.decode.decode_tok_s => {
                        Some(b)
                    }
                    _ => Some(s),
                })
        })
        .cloned();
    let split = split_shares.as_ref().map(|s| s.split.decode);
    // The NPU's prefill reads its weights once per pass: that rate, while it runs.
    let cpu_decode_beside_prefill = npu.filter(|pr| pr.ttft_s > 0.0).map(|pr| {
        let mut beside = cb.clone();
        beside.cpu.read_bw = cpu_read_bw_beside(cb, npu_bytes as f64 / pr.ttft_s);
        let cache = cb.ram_bytes - cb.reserved_bytes - npu_bytes as f64;
        cpu_phases(&shape, &beside, (cache, Cores::Big), prompt, gen).decode_tok_s
    });
    let options =
        ork_board::options::options(&shape, cb, cb.ram_bytes - cb.reserved_bytes, prompt, gen);
    Ok(Some(PlanEngines {
        choice,
        shape,
        split,
        split_shares,
        prefill_split,
        cpu_decode_beside_prefill,
        options,
    }))
}

/// RAM ork's own process holds beside the weights (KV cache, activations, tables): 0.5 GiB, a
/// judgment (docs/board-model.md), used to decide whether a resident plan fits a board.
pub const PROCESS_BYTES: f64 = (1u64 << 29) as f64;

/// Add the engines' fields under `projected` (made, for a board without an NPU, with the
/// chosen pairing's TTFT and decode rate and the labels).
pub fn add_json(projected: &mut serde_json::Value, e: &PlanEngines, b: &CpuBoard) {
    let (choice, shape) = (&e.choice, &e.shape);
    if !projected.is_object() {
        let best = choice.chosen();
        *projected = serde_json::json!({
            "label": "projected",
            "board": b.name,
            "model_version": ork_board::cpu::CPU_MODEL,
            "ttft_s": best.map(|p| p.ttft_s),
            "decode_tok_s": best.map(|p| p.decode_tok_s),
        });
    }
    if let (Some(obj), serde_json::Value::Object(add)) =
        (projected.as_object_mut(), json(choice, shape, b))
    {
        obj.extend(add);
        obj.insert("split_decode".into(), split_json(e));
        obj.insert("split_prefill".into(), split_prefill_json(e));
        obj.insert(
            "options".into(),
            serde_json::to_value(&e.options).unwrap_or_default(),
        );
        obj.insert(
            "cpu_decode_tok_s_beside_npu_prefill".into(),
            e.cpu_decode_beside_prefill.into(),
        );
    }
}

/// `projected.split_decode`: the row split's decode beside the best single engine's, or null.
fn split_json(e: &PlanEngines) -> serde_json::Value {
    let (Some(s), Some(on)) = (e.split, e.split_shares.as_ref()) else {
        return serde_json::Value::Null;
    };
    let alone = |p: Engine| {
        e.choice
            .alternatives
            .iter()
            .filter(|a| a.decode == p)
            .map(|a| a.decode_tok_s)
            .fold(0.0, f64::max)
    };
    let best = alone(Engine::Npu).max(alone(Engine::Cpu));
    serde_json::json!({
        "label": "projected",
        "built": true,
        "decode_tok_s": s.decode_tok_s,
        "best_single_engine_decode_tok_s": best,
        "gain": s.decode_tok_s / best,
        "npu_row_share": s.npu_row_share,
        "bus_bound_share": s.bus_bound_share,
        "cores": on.cores,
        "npu_holds": on.npu_holds,
    })
}

/// `projected.split_prefill`: the row split's prefill beside each engine's alone, or null.
fn split_prefill_json(e: &PlanEngines) -> serde_json::Value {
    let Some(on) = &e.prefill_split else {
        return serde_json::Value::Null;
    };
    let alone = |p: Engine| {
        e.choice
            .alternatives
            .iter()
            .filter(|a| a.prefill == p)
            .map(|a| a.ttft_s)
            .fold(f64::INFINITY, f64::min)
    };
    let best = alone(Engine::Npu).min(alone(Engine::Cpu));
    let p = &on.split.prefill;
    serde_json::json!({
        "label": "projected",
        "built": true,
        "ttft_s": p.ttft_s,
        "best_single_engine_ttft_s": best,
        "gain": best / p.ttft_s,
        "model_npu_ttft_s": p.npu_ttft_s,
        "model_cpu_ttft_s": p.cpu_ttft_s,
        "npu_row_share": p.npu_row_share,
        "bus_bound_share": p.bus_bound_share,
        "cores": on.cores,
        "npu_holds": on.npu_holds,
    })
}

/// The JSON fields `engines` adds under `projected`.
fn json(choice: &Choice, shape: &CpuShape, b: &CpuBoard) -> serde_json::Value {
    serde_json::json!({
        "engines": choice.engines,
        "alternatives": choice.alternatives,
        "engine_rule": choice.rule,
        "cpu": {
            "label": "projected",
            "board": b.name,
            "cores": b.cpu,
            "kernels": match b.cpu.kinds.0 {
                ork_board::cpu::Core::A72 | ork_board::cpu::Core::A53 => {
                    "ggml's plain-NEON cycles (no dotprod on these cores; ork's kernels need it)"
                }
                _ => "ork's cycles",
            },
            "file_bytes": shape.file_bytes(),
            "active_bytes_per_token": shape.active_bytes(),
            "ceiling_tok_s": b.ddr_bw / shape.active_bytes(),
            "cpu_model_version": ork_board::cpu::CPU_MODEL,
        },
    })
}

/// A pairing in words: `cpu/split (cpu: every core; npu: dense weights)`.
pub fn pairing_name(e: &ork_board::engines::Engines) -> String {
    let name = |e: Engine| format!("{e:?}").to_lowercase();
    let mut on = Vec::new();
    if let Some(c) = e.cores {
        on.push(match c {
            Cores::Big => "cpu: big cores",
            Cores::All => "cpu: every core",
        });
    }
    if let Some(h) = e.npu_holds {
        on.push(match h {
            NpuHolds::Pack => "npu: the pack",
            NpuHolds::Dense => "npu: dense weights",
        });
    }
    format!("{}/{} ({})", name(e.prefill), name(e.decode), on.join("; "))
}

/// One line for the text output.
pub fn line(choice: &Choice) -> String {
    let alts: Vec<String> = choice
        .alternatives
        .iter()
        .map(|p| {
            format!(
                "{} TTFT {:.2} s, decode {:.2} tok/s",
                pairing_name(&p.engines()),
                p.ttft_s,
                p.decode_tok_s
            )
        })
        .collect();
    format!(
        "engines (projected): {}; considered: {}",
        pairing_name(&choice.engines),
        alts.join("; ")
    )
}
