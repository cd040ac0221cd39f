//! The board clock: board files, names, replay sensitivity, calibration.

use ork_board::fit::{self, FITTED_RK3588, FIT_ROWS, HOLDOUT_ROWS};
use ork_board::moe::{moe_schedule, ExpertPrefetch, MoeDims, MoePlan, MoeSchedule};
use ork_board::spec::{spec_schedule, SpecPlan};
use ork_board::{
    replay, replay_warm, schedule, Board, BoardError, Dims, ModelShape, Plan, Projection,
    ReplayOptions, Timeline, WeightType,
};

#[path = "board/files.rs"]
mod files;

/// Print the fit and every row's prediction (`cargo test -p ork-board --test board -- --ignored
/// --nocapture fit_report`).
#[test]
#[ignore]
fn fit_report() {
    let (f, loss) = fit::fit_rk3588().unwrap();
    println!("fitted {f:?} loss {loss:.5}");
    let chip = fit::with_fit(&f);
    for row in FIT_ROWS.iter().chain(&HOLDOUT_ROWS) {
        let p = fit::project_row(row, &chip).unwrap();
        let d = p.decode_tok_s.unwrap();
        println!(
            "| {} | {} {} | {:.0} | {:.0} | {:+.0} % | {:.2} | {:.2} | {:+.0} % | {:?}",
            row.model,
            row.chip,
            row.dtype,
            p.ttft_s * 1e3,
            row.ttft_s * 1e3,
            (p.ttft_s / row.ttft_s - 1.0) * 100.0,
            d,
            row.decode_tok_s,
            (d / row.decode_tok_s - 1.0) * 100.0,
            p.per_token.unwrap()
        );
    }
}

/// The fit, recomputed, gives the stored parameters, and reproduces its three rows.
#[test]
fn calibration_reproduces_the_fit() {
    let (f, loss) = fit::fit_rk3588().unwrap();
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.01;
    assert!(close(f.npu_int8_ops, FITTED_RK3588.npu_int8_ops), "{f:?}");
    assert!(close(f.npu_read_bw, FITTED_RK3588.npu_read_bw), "{f:?}");
    assert!(close(f.call_s, FITTED_RK3588.call_s), "{f:?}");
    assert!(loss < 0.01, "loss {loss}");
    let chip = ork_board::Chip::rk3588();
    for row in &FIT_ROWS {
        let p = fit::project_row(row, &chip).unwrap();
        assert!(
            close_within(p.ttft_s, row.ttft_s, 0.10),
            "{} {p:?}",
            row.model
        );
        let d = p.decode_tok_s.unwrap();
        assert!(
            close_within(d, row.decode_tok_s, 0.10),
            "{} {p:?}",
            row.model
        );
    }
}

fn close_within(a: f64, b: f64, tol: f64) -> bool {
    (a / b - 1.0).abs() <= tol
}

fn small_shape() -> ModelShape {
    let dims = Dims {
        n_layer: 4,
        d_model: 1024,
        ffn: 4096,
        n_head: 16,
        n_head_kv: 4,
        head_dim: 64,
        vocab: 8192,
    };
    ModelShape::from_dims(&dims, WeightType::Int8, &ork_board::Chip::rk3588())
}

fn project(shape: &ModelShape, plan: Plan, board: &Board) -> Projection {
    let events = schedule(shape, &plan).unwrap();
    let t = replay(
        &events,
        board,
        ReplayOptions {
            preload: plan.resident,
            device_bytes: plan.budget_bytes as f64,
            prefetch_slots: None,
        },
    )
    .unwrap();
    Projection::new(&t, board, plan.prompt_tokens, plan.gen_tokens)
}

/// A streamed plan whose budget (16 MiB, about one block) keeps no weight from one pass to the
/// next: every weight is loaded in every pass.
fn streamed(slots: usize) -> Plan {
    Plan {
        resident: false,
        slots,
        budget_bytes: 16 << 20,
        prompt_tokens: 32,
        gen_tokens: 8,
        kv_bytes: 2,
    }
}

/// A change of schedule changes the projection: streaming costs more than resident; no prefetch
/// (every load on the compute path) costs more than prefetching, and its stalls show.
#[test]
fn replay_follows_the_schedule() {
    let shape = small_shape();
    let board = Board::named("rk3588").unwrap();
    let resident = project(
        &shape,
        Plan {
            resident: true,
            budget_bytes: shape.total_bytes(),
            ..streamed(0)
        },
        &board,
    );
    let on_demand = project(&shape, streamed(0), &board);
    let prefetch = project(&shape, streamed(4), &board);
    let (r, o, p) = (
        resident.decode_tok_s.unwrap(),
        on_demand.decode_tok_s.unwrap(),
        prefetch.decode_tok_s.unwrap(),
    );
    assert!(r > p && p > o, "resident {r}, prefetch {p}, on demand {o}");
    assert_eq!(resident.per_token.unwrap().copy_stall_s, 0.0);
    assert!(on_demand.per_token.unwrap().copy_stall_s > 0.0);
    assert!(resident.load_s > 0.0 && on_demand.load_s == 0.0);
    // A slower NVMe matters only when the pack does not fit the page cache.
    let tiny_ram = Board {
        // Room for the OS, the 64 MiB budget and 16 MiB of page cache: less than the pack.
        ram_bytes: ((1u64 << 30) + (80 << 20)) as f64,
        ..board.clone()
    };
    let cold = project(&shape, streamed(4), &tiny_ram);
    assert!(cold.decode_tok_s.unwrap() < p && cold.storage_bytes > 0.0);
    assert_eq!(prefetch.storage_bytes, 0.0);
}

/// A sliding-window layer's attention is charged for its window only: with every block local
/// (window 256), a resident plan at a 4096-token context decodes faster than the same shape with
/// global layers and spends less host time per token; below the window both are the same.
#[test]
fn sliding_window_layers_are_charged_for_their_window() {
    let global = small_shape();
    let local = ModelShape {
        windows: vec![Some(256); global.blocks.len()],
        ..global.clone()
    };
    let board = Board::named("rk3588").unwrap();
    let plan = |prompt_tokens| Plan {
        resident: true,
        budget_bytes: global.total_bytes(),
        prompt_tokens,
        ..streamed(0)
    };
    let (g, l) = (
        project(&global, plan(4096), &board),
        project(&local, plan(4096), &board),
    );
    let (gh, lh) = (g.per_token.unwrap().host_s, l.per_token.unwrap().host_s);
    assert!(lh < 0.5 * gh, "host per token: local {lh}, global {gh}");
    assert!(l.decode_tok_s.unwrap() > g.decode_tok_s.unwrap());
    assert!(l.ttft_s < g.ttft_s);
    let (g, l) = (
        project(&global, plan(64), &board),
        project(&local, plan(64), &board),
    );
    assert_eq!(g.decode_tok_s, l.decode_tok_s);
    assert_eq!(g.ttft_s, l.ttft_s);
    assert_eq!(ork_board::HostKind::attended_context(1000, Some(256)), 255);
    assert_eq!(ork_board::HostKind::attended_context(100, Some(256)), 100);
    assert_eq!(ork_board::HostKind::attended_context(1000, None), 1000);
}

/// Domains switched every block cost their switch time.
#[test]
fn domain_switches_are_charged() {
    let mut shape = small_shape();
    let board = Board::named("rk3588").unwrap();
    let plan = Plan {
        resident: true,
        budget_bytes: shape.total_bytes(),
        ..streamed(0)
    };
    let one = project(&shape, plan, &board);
    for (i, b) in shape.blocks.iter_mut().enumerate() {
        for w in b.iter_mut() {
            w.domain = (i % 2) as u32;
        }
    }
    let two = project(&shape, plan, &board);
    let sw = two.per_token.unwrap().domain_switch_s;
    assert!(sw > 0.0 && two.decode_tok_s < one.decode_tok_s, "{sw}");
}

#[test]
fn unknown_names_list_the_known_ones() {
    let e = Board::named("rk9999").unwrap_err();
    match &e {
        BoardError::Unknown { name, known } => {
            assert_eq!(name, "rk9999");
            for k in [
                "rk3588",
                "rk3576",
                "orangepi5-16g",
                "rock5b-16g",
                "turing-rk1-32g",
                "pi5-16g",
            ] {
                assert!(known.contains(k), "{known}");
            }
        }
        other => panic!("{other:?}"),
    }
    for k in Board::known() {
        assert_eq!(Board::named(k).unwrap().name, k);
    }
    // The CPU-only presets are listed, and named as such where an NPU is needed.
    let every = Board::every_name();
    for k in ork_board::cpu::CpuBoard::cpu_only_names() {
        assert!(every.contains(&k), "{every:?}");
        assert!(ork_board::cpu::CpuBoard::resolve(k).unwrap().is_some());
        match Board::named(k).unwrap_err() {
            BoardError::NoNpu { name } => assert_eq!(name, k),
            other => panic!("{other:?}"),
        }
    }
}

fn field_of(e: BoardError) -> String {
    match e {
        BoardError::Missing { field } | BoardError::BadValue { field, .. } => field,
        BoardError::InFile { source, .. } => field_of(*source),
        other => panic!("{other:?}"),
    }
}

#[test]
fn board_files_refuse_bad_parameters_naming_them() {
    let good = r#"{"name": "mine", "chip": "rk3588", "ram_gib": 16, "storage_read_gbps": 2.0,
                   "overrides": {"memcpy_bw": 12.4e9}}"#;
    let b = Board::from_json(good).unwrap();
    assert_eq!(b.chip.memcpy_bw, 12.4e9);
    assert_eq!(b.ram_bytes, 16.0 * (1u64 << 30) as f64);
    for (text, field) in [
        (
            r#"{"name": "x", "chip": "rk3588", "storage_read_gbps": 2}"#,
            "ram_gib",
        ),
        (
            r#"{"name": "x", "chip": "rk3588", "ram_gib": -8, "storage_read_gbps": 2}"#,
            "ram_gib",
        ),
        (
            r#"{"name": "x", "chip": "rk3588", "ram_gib": 8, "storage_read_gbps": 0}"#,
            "storage_read_gbps",
        ),
        (
            r#"{"name": "x", "chip": "rk3588", "ram_gib": 8, "storage_read_gbps": "NaN"}"#,
            "storage_read_gbps",
        ),
        (
            r#"{"name": "x", "chip": "rk3588", "ram_gib": 8, "storage_read_gbps": 1, "overrides": {"call_s": 0}}"#,
            "overrides.call_s",
        ),
        (
            r#"{"name": "x", "chip": "rk3588", "ram_gib": 8, "storage_read_gbps": 1, "overrides": {"ddr_bw": "inf"}}"#,
            "overrides.ddr_bw",
        ),
    ] {
        assert_eq!(
            field_of(Board::from_json(text).unwrap_err()),
            field,
            "{text}"
        );
    }
    // A whole chip: every parameter must be there.
    let mut chip = serde_json::to_value(ork_board::Chip::rk3588()).unwrap();
    chip.as_object_mut().unwrap().remove("npu_read_bw");
    let doc = serde_json::json!({"name": "x", "chip": chip, "ram_gib": 8, "storage_read_gbps": 1});
    assert_eq!(
        field_of(Board::from_json(&doc.to_string()).unwrap_err()),
        "chip.npu_read_bw"
    );
    chip["npu_read_bw"] = serde_json::json!(-1.0);
    let doc = serde_json::json!({"name": "x", "chip": chip, "ram_gib": 8, "storage_read_gbps": 1});
    assert_eq!(
        field_of(Board::from_json(&doc.to_string()).unwrap_err()),
        "chip.npu_read_bw"
    );
    chip["npu_read_bw"] = serde_json::json!(30e9);
    let doc = serde_json::json!({"name": "x", "chip": chip, "ram_gib": 8, "storage_read_gbps": 1});
    assert!(Board::from_json(&doc.to_string()).is_ok());
    // From a file's bytes: the error names the file too.
    let e = Board::from_bytes(
        "dir/bad.json",
        br#"{"name": "x", "chip": "rk3588", "ram_gib": 0, "storage_read_gbps": 1}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("bad.json") && e.to_string().contains("ram_gib"),
        "{e}"
    );
    assert!(matches!(
        Board::from_bytes("b.json", b"\xff{}").unwrap_err(),
        BoardError::InFile { .. }
    ));
}

/// SmolLM2-135M's published dimensions.
const SMOLLM2_135M: Dims = Dims {
    n_layer: 30,
    d_model: 576,
    ffn: 1536,
    n_head: 9,
    n_head_kv: 3,
    head_dim: 64,
    vocab: 49152,
};

/// Llama-2-7B's published dimensions.
const LLAMA_7B: Dims = Dims {
    n_layer: 32,
    d_model: 4096,
    ffn: 11008,
    n_head: 32,
    n_head_kv: 32,
    head_dim: 128,
    vocab: 32000,
};

/// The studies of `docs/board-model.md` ("Using it"): resident vs streamed vs resident across
/// domains, and the prefetch slot count (`cargo test -p ork-board --test board -- --ignored
/// --nocapture studies`).
#[test]
#[ignore]
fn studies() {
    let smollm2 = SMOLLM2_135M;
    let llama7b = LLAMA_7B;
    let board = Board::named("orangepi5-16g").unwrap();
    let chip = &board.chip;
    let gib = 1u64 << 30;
    for (name, dims) in [("SmolLM2-135M", smollm2), ("Llama-2-7B shape", llama7b)] {
        let shape = ModelShape::from_dims(&dims, WeightType::Int8, chip);
        let total = shape.total_bytes();
        let base = Plan {
            resident: true,
            slots: 4,
            budget_bytes: total,
            prompt_tokens: 128,
            gen_tokens: 64,
            kv_bytes: 2,
        };
        let show = |label: &str, p: &Projection| {
            let b = p.per_token.unwrap();
            println!(
                "| {name} | {label} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} |",
                p.ttft_s * 1e3,
                p.decode_tok_s.unwrap(),
                b.npu_s * 1e3,
                b.copy_stall_s * 1e3,
                b.host_s * 1e3,
                b.domain_switch_s * 1e3
            );
        };
        if total < 4 * gib {
            show("resident, one domain", &project(&shape, base, &board));
        }
        // Resident across 4 GiB domains (first fit in execution order, 3.5 GiB each).
        let mut across = shape.clone();
        let (mut d, mut used) = (0u32, 0u64);
        for b in across.blocks.iter_mut() {
            let bytes: u64 = b.iter().map(|w| w.bytes).sum();
            if used + bytes > 3584 << 20 {
                d += 1;
                used = 0;
            }
            used += bytes;
            for w in b.iter_mut() {
                w.domain = d;
            }
        }
        across.output.domain = d;
        show(
            &format!("resident across {} domains", d + 1),
            &project(&across, base, &board),
        );
        let budget = (3072u64 << 20).min(total / 4);
        for slots in [1, 2, 4, 6] {
            let p = Plan {
                resident: false,
                slots,
                budget_bytes: budget,
                ..base
            };
            show(
                &format!("streamed, {} MiB budget, {slots} slots", budget >> 20),
                &project(&shape, p, &board),
            );
        }
    }
}

/// A run's recorded on-demand loads are re-timed by the prefetcher's rule when a prefetch
/// thread ran: the stalls shrink to what `slots` of lookahead leaves.
#[test]
fn the_prefetch_rule_retimes_recorded_loads() {
    let shape = small_shape();
    let board = Board::named("rk3588").unwrap();
    let plan = streamed(0);
    let events = schedule(&shape, &plan).unwrap();
    let at = |slots| {
        let t = replay(
            &events,
            &board,
            ReplayOptions {
                preload: false,
                device_bytes: plan.budget_bytes as f64,
                prefetch_slots: slots,
            },
        )
        .unwrap();
        Projection::new(&t, &board, plan.prompt_tokens, plan.gen_tokens)
    };
    let (recorded, retimed) = (at(None), at(Some(4)));
    let with_prefetch = project(&shape, streamed(4), &board);
    assert!(retimed.decode_tok_s > recorded.decode_tok_s);
    let (a, b) = (
        retimed.decode_tok_s.unwrap(),
        with_prefetch.decode_tok_s.unwrap(),
    );
    // Within 2 %: the runs differ in which loads create buffers (with a prefetcher the cache
    // holds `slots` more weights, so the budget's spares churn differently).
    assert!((a / b - 1.0).abs() < 0.02, "{a} vs {b}");
}

fn moe_project(
    board: &Board,
    prefetch: ExpertPrefetch,
    cache_experts: usize,
    gen_tokens: usize,
) -> (Projection, MoeSchedule) {
    moe_project_ram(board, prefetch, cache_experts, gen_tokens, None)
}

/// As [`moe_project`], with the device bytes the page cache loses fixed at `device_bytes`.
fn moe_project_ram(
    board: &Board,
    prefetch: ExpertPrefetch,
    cache_experts: usize,
    gen_tokens: usize,
    device_bytes: Option<f64>,
) -> (Projection, MoeSchedule) {
    let plan = MoePlan {
        ty: WeightType::Int8,
        prefetch,
        cache_experts,
        prompt_tokens: 1,
        gen_tokens,
        kv_bytes: 2,
        seed: 28,
    };
    let s = moe_schedule(&MoeDims::QWEN3_30B_A3B, &plan, &board.chip).unwrap();
    let t = replay_warm(
        &s.events,
        board,
        ReplayOptions {
            preload: false,
            device_bytes: device_bytes.unwrap_or(s.device_bytes as f64),
            prefetch_slots: None,
        },
        Some(&s.warm),
    )
    .unwrap();
    (
        Projection::new(&t, board, plan.prompt_tokens, gen_tokens),
        s,
    )
}

/// Qwen3-30B-A3B's int8 pack (~30 GB) does not fit a 16 GB board: experts come from NVMe, and
/// the replay reads them from storage during decode.
#[test]
fn moe_pack_exceeds_a_16_gb_board() {
    let board = Board::named("orangepi5-16g").unwrap();
    let dims = MoeDims::QWEN3_30B_A3B;
    let total = dims.total_bytes(WeightType::Int8) as f64;
    assert!(total > 29e9 && total < 32e9, "{total}");
    assert!(total > board.ram_bytes);
    let (p, s) = moe_project(&board, ExpertPrefetch::Router, 1024, 3);
    assert!(p.storage_bytes > 0.0);
    assert!(s.decode_uses > s.decode_hits);
}

/// More expert cache is faster or equal when the page cache keeps its size (the cache's RAM
/// taken from elsewhere); speculative prefetch with recall 1 is at least as fast as
/// router-driven prefetch, which is at least as fast as on-demand loading.
#[test]
fn moe_cache_and_prefetch_order() {
    let board = Board::named("orangepi5-32g").unwrap();
    let page_cache_kept = Some(12e9);
    let rate = |prefetch, cache| {
        moe_project_ram(&board, prefetch, cache, 5, page_cache_kept)
            .0
            .decode_tok_s
            .unwrap()
    };
    let all = 48 * 128;
    let mut last = 0.0;
    for cache in [16, all / 4, all / 2, all] {
        let r = rate(ExpertPrefetch::Router, cache);
        assert!(r >= last * 0.999, "cache {cache}: {r} < {last}");
        last = r;
    }
    let cache = all / 4;
    let demand = rate(ExpertPrefetch::OnDemand, cache);
    let router = rate(ExpertPrefetch::Router, cache);
    let spec = rate(ExpertPrefetch::Speculative { recall: 1.0 }, cache);
    assert!(router >= demand, "router {router} < on-demand {demand}");
    assert!(spec >= router, "speculative {spec} < router {router}");
    assert!(
        spec > demand * 1.05,
        "speculative {spec} ≈ on-demand {demand}"
    );
}

/// The expert cache's RAM comes out of the page cache: on a 32 GB board, where the page cache
/// alone holds the whole pack, a quarter of the experts cached on the device (a second copy)
/// pushes others out to NVMe and decode is slower than with no cache.
#[test]
fn moe_cache_competes_with_the_page_cache() {
    let board = Board::named("orangepi5-32g").unwrap();
    let (none, _) = moe_project(&board, ExpertPrefetch::Router, 16, 5);
    let (quarter, _) = moe_project(&board, ExpertPrefetch::Router, 48 * 32, 5);
    assert!(none.storage_bytes < quarter.storage_bytes);
    assert!(none.decode_tok_s.unwrap() > quarter.decode_tok_s.unwrap());
}

/// The MoE study of `docs/board-model.md`: Qwen3-30B-A3B's shapes on a 16 GB and a 32 GB board,
/// pack on NVMe, expert cache size against the way missing experts come in
/// (`cargo test -p ork-board --test board -- --ignored --nocapture moe_study`).
#[test]
#[ignore]
fn moe_study() {
    let all = 48 * 128;
    for name in ["orangepi5-16g", "orangepi5-32g"] {
        let board = Board::named(name).unwrap();
        for cache in [16, all / 8, all / 4, all / 2, 3 * all / 4, all] {
            let mut row = format!(
                "| {name} | {cache} ({:.0} %) |",
                100.0 * cache as f64 / all as f64
            );
            let mut note = String::new();
            for prefetch in [
                ExpertPrefetch::OnDemand,
                ExpertPrefetch::Router,
                ExpertPrefetch::Speculative { recall: 0.5 },
                ExpertPrefetch::Speculative { recall: 0.8 },
                ExpertPrefetch::Speculative { recall: 1.0 },
            ] {
                let (p, s) = moe_project(&board, prefetch, cache, 17);
                if s.device_bytes as f64 > board.ram_bytes - (1u64 << 30) as f64 {
                    row += " does not fit |";
                    continue;
                }
                row += &format!(" {:.2} |", p.decode_tok_s.unwrap());
                if prefetch == ExpertPrefetch::Router {
                    note = format!(
                        " {:.0} % | {:.2} |",
                        100.0 * s.decode_hits as f64 / s.decode_uses as f64,
                        p.storage_bytes / 1e9 / 16.0
                    );
                }
            }
            println!("{row}{note}");
        }
    }
}

fn spec_project(
    verifier: &ModelShape,
    draft: Option<&ModelShape>,
    plan: SpecPlan,
    board: &Board,
) -> (Projection, Timeline) {
    let s = spec_schedule(verifier, draft, &plan).unwrap();
    let v = plan.verifier;
    let device = if v.resident {
        verifier.total_bytes()
    } else {
        v.budget_bytes
    } + draft.map_or(0, |d| d.total_bytes());
    let t = replay(
        &s.events,
        board,
        ReplayOptions {
            preload: true,
            device_bytes: device as f64,
            prefetch_slots: None,
        },
    )
    .unwrap();
    (Projection::new(&t, board, v.prompt_tokens, s.generated), t)
}

fn tiny_draft() -> ModelShape {
    tiny_shape(&ork_board::Chip::rk3588())
}

/// Two small blocks and an 8192-token vocabulary, split by `chip`'s limits.
fn tiny_shape(chip: &ork_board::Chip) -> ModelShape {
    let dims = Dims {
        n_layer: 2,
        d_model: 256,
        ffn: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        vocab: 8192,
    };
    ModelShape::from_dims(&dims, WeightType::Int8, chip)
}

/// Plain decode built from spliced passes (k = 0) projects what the dense schedule does.
#[test]
fn spec_k0_matches_plain_decode() {
    let board = Board::named("rk3588").unwrap();
    let shape = small_shape();
    let plan = Plan {
        gen_tokens: 16,
        ..streamed(4)
    };
    let plain = project(&shape, plan, &board).decode_tok_s.unwrap();
    let spec = SpecPlan {
        verifier: plan,
        k: 0,
        acceptance: 0.0,
        seed: 13,
    };
    let (p, _) = spec_project(&shape, None, spec, &board);
    let k0 = p.decode_tok_s.unwrap();
    assert!(
        close_within(k0, plain, 0.10),
        "k = 0: {k0} vs plain {plain}"
    );
}

/// With no draft accepted a speculative run is slower than plain decode (drafts and wider
/// passes for one token each); a streamed pass of k + 1 rows costs less than k + 1 passes.
#[test]
fn spec_acceptance_zero_loses_and_wide_passes_pay() {
    let board = Board::named("rk3588").unwrap();
    let shape = small_shape();
    let draft = tiny_draft();
    let plan = Plan {
        gen_tokens: 16,
        ..streamed(4)
    };
    let base = SpecPlan {
        verifier: plan,
        k: 0,
        acceptance: 0.0,
        seed: 13,
    };
    let (plain, plain_t) = spec_project(&shape, None, base, &board);
    let k = 4;
    let (zero, zero_t) = spec_project(&shape, Some(&draft), SpecPlan { k, ..base }, &board);
    assert!(zero.decode_tok_s.unwrap() < plain.decode_tok_s.unwrap());
    // Each pass's time: from the end of the pass before it.
    let durations = |t: &Timeline, rows: usize| -> Vec<f64> {
        t.passes
            .windows(2)
            .filter(|w| w[1].tokens == rows && w[1].context >= plan.prompt_tokens)
            .map(|w| w[1].end_s - w[0].end_s)
            .collect()
    };
    let one = durations(&plain_t, 1);
    let wide = durations(&zero_t, k + 1);
    let one = one.iter().sum::<f64>() / one.len() as f64;
    let wide = wide.iter().sum::<f64>() / wide.len() as f64;
    assert!(wide < (k + 1) as f64 * one * 0.5, "{wide} vs {k}+1 × {one}");
    // Every draft accepted: fewer verifier passes, faster.
    let (all, _) = spec_project(
        &shape,
        Some(&draft),
        SpecPlan {
            k,
            acceptance: 1.0,
            ..base
        },
        &board,
    );
    assert!(all.decode_tok_s.unwrap() > 2.0 * plain.decode_tok_s.unwrap());
}

/// The speculative-decoding study of `docs/board-model.md`: projected decode of a resident draft
/// (or prompt lookup, which costs no device time) with a streamed verifier, against plain
/// streamed decode, over draft length and acceptance
/// (`cargo test -p ork-board --test board -- --ignored --nocapture spec_study`).
#[test]
#[ignore]
fn spec_study() {
    let board = Board::named("orangepi5-16g").unwrap();
    let chip = &board.chip;
    let smollm2 = SMOLLM2_135M;
    let qwen05 = Dims {
        n_layer: 24,
        d_model: 896,
        ffn: 4864,
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        vocab: 151936,
    };
    let llama7b = LLAMA_7B;
    let shape = |d: &Dims| ModelShape::from_dims(d, WeightType::Int8, chip);
    let (s135, q05, l7) = (shape(&smollm2), shape(&qwen05), shape(&llama7b));
    // issue 13's cut-down draft: SmolLM2's first 3 blocks (resident).
    let cut = shape(&Dims {
        n_layer: 3,
        ..smollm2
    });
    let cases: [(&str, &ModelShape, u64, &str, Option<&ModelShape>); 5] = [
        (
            "SmolLM2-135M, ¼ budget",
            &s135,
            s135.total_bytes() / 4,
            "lookup",
            None,
        ),
        (
            "SmolLM2-135M, ¼ budget",
            &s135,
            s135.total_bytes() / 4,
            "SmolLM2's first 3 blocks",
            Some(&cut),
        ),
        (
            "Llama-2-7B shape, 3 GiB in one window",
            &l7,
            3 << 30,
            "lookup",
            None,
        ),
        (
            "Llama-2-7B shape, 3 GiB in one window",
            &l7,
            3 << 30,
            "SmolLM2-135M shape",
            Some(&s135),
        ),
        (
            "Llama-2-7B shape, 3 GiB in one window",
            &l7,
            3 << 30,
            "Qwen2-0.5B shape",
            Some(&q05),
        ),
    ];
    let ks = [1usize, 2, 4, 6, 8];
    for (name, verifier, budget, draft_name, draft) in cases {
        let plan = Plan {
            resident: false,
            slots: 4,
            budget_bytes: budget,
            prompt_tokens: 128,
            gen_tokens: 64,
            kv_bytes: 2,
        };
        let base = SpecPlan {
            verifier: plan,
            k: 0,
            acceptance: 0.0,
            seed: 13,
        };
        let plain = spec_project(verifier, None, base, &board)
            .0
            .decode_tok_s
            .unwrap();
        println!(
            "\n{name}, draft {draft_name}: plain streamed decode {plain:.2} tok/s (projected)"
        );
        println!(
            "| acceptance | {} |",
            ks.map(|k| format!("k = {k}")).join(" | ")
        );
        for a in [0.0, 0.03, 0.3, 0.5, 0.7, 0.8, 0.9] {
            let mut row = format!("| {a} |");
            for k in ks {
                let p = spec_project(
                    verifier,
                    draft,
                    SpecPlan {
                        k,
                        acceptance: a,
                        ..base
                    },
                    &board,
                )
                .0;
                let r = p.decode_tok_s.unwrap();
                row += &format!(" {r:.2} ({:.2}×) |", r / plain);
            }
            println!("{row}");
        }
    }
}

/// Bad plans are refused naming the problem.
#[test]
fn moe_and_spec_plans_refuse_bad_input() {
    let chip = ork_board::Chip::rk3588();
    let plan = MoePlan {
        ty: WeightType::Int8,
        prefetch: ExpertPrefetch::Speculative { recall: 1.5 },
        cache_experts: 16,
        prompt_tokens: 1,
        gen_tokens: 2,
        kv_bytes: 2,
        seed: 1,
    };
    let e = moe_schedule(&MoeDims::QWEN3_30B_A3B, &plan, &chip).unwrap_err();
    assert!(e.to_string().contains("recall 1.5"), "{e}");
    let dims = MoeDims {
        top_k: 0,
        ..MoeDims::QWEN3_30B_A3B
    };
    let ok = MoePlan {
        prefetch: ExpertPrefetch::Router,
        ..plan
    };
    let e = moe_schedule(&dims, &ok, &chip).unwrap_err();
    assert!(e.to_string().contains("top_k 0"), "{e}");
    let e = spec_schedule(
        &small_shape(),
        None,
        &SpecPlan {
            verifier: streamed(1),
            k: 2,
            acceptance: -0.1,
            seed: 1,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("acceptance -0.1"), "{e}");
}

/// The planned schedule's loads are those of ork's weight cache: below one pass's working set
/// every weight is loaded in every pass; with a budget that holds most of the model the cache
/// keeps some of it (a cyclic scan under LRU keeps less than it holds), so fewer loads and a faster projected decode.
#[test]
fn streamed_schedule_loads_what_the_cache_does_not_keep() {
    let shape = small_shape();
    let board = Board::named("rk3588").unwrap();
    let loads = |plan: &Plan| {
        schedule(&shape, plan)
            .unwrap()
            .iter()
            .filter(|e| matches!(e, ork_board::Event::Load { .. }))
            .count()
    };
    let weights = shape.weights().count();
    let small = Plan {
        gen_tokens: 16,
        ..streamed(4)
    };
    let large = Plan {
        budget_bytes: 64 << 20,
        ..small
    };
    assert_eq!(loads(&small), weights * 16);
    let kept = loads(&large);
    assert!(
        kept < weights * 16 * 3 / 4,
        "{kept} loads of {}",
        weights * 16
    );
    let (s, l) = (
        project(&shape, small, &board).decode_tok_s.unwrap(),
        project(&shape, large, &board).decode_tok_s.unwrap(),
    );
    assert!(l > s, "64 MiB {l} vs 16 MiB {s}");
    // A budget below a weight cannot run: an error naming it, not a projection.
    let e = schedule(
        &shape,
        &Plan {
            budget_bytes: 4 << 20,
            ..small
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("exceeds the budget"), "{e}");
}

/// The RK3576's memory: a 32-bit LPDDR bus at the frequency rkllm pins for both chips
/// (2112 MHz), so half the RK3588's 64-bit bus, and the NPU's read rate the same fraction of it
/// (docs/board-model.md cites the bus widths and the frequency).
#[test]
fn rk3576_memory_is_half_the_rk3588s() {
    let (a, b) = (ork_board::Chip::rk3588(), ork_board::Chip::rk3576());
    assert!(
        (b.ddr_bw - 2112e6 * 2.0 * 4.0).abs() / b.ddr_bw < 0.01,
        "{}",
        b.ddr_bw
    );
    assert_eq!(b.ddr_bw * 2.0, a.ddr_bw);
    assert_eq!(b.npu_read_bw * 2.0, a.npu_read_bw);
}

/// MoE and speculative plans schedule at most `DECODE_PASSES_REPLAYED` decode passes whatever
/// the token count (issue 39: a plan's memory and time were linear in `--gen-tokens`),
/// each standing for its share: the weights sum to the decode steps, and the projection of a
/// run of twice the steps stays near the short one's (only the context's attention grows).
#[test]
fn moe_and_spec_plans_are_bounded_in_the_token_count() {
    use ork_board::DECODE_PASSES_REPLAYED;
    let chip = ork_board::Chip::rk3588();
    let dims = MoeDims {
        n_layer: 2,
        d_model: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 8,
        top_k: 2,
        expert_ffn: 128,
        vocab: 1024,
    };
    let plan = |gen_tokens| MoePlan {
        ty: WeightType::Int8,
        prefetch: ExpertPrefetch::Router,
        cache_experts: 16,
        prompt_tokens: 4,
        gen_tokens,
        kv_bytes: 2,
        seed: 3,
    };
    let board = Board::named("orangepi5-16g").unwrap();
    let tok_s = |s: &MoeSchedule, gen| {
        let mut t = replay_warm(
            &s.events,
            &board,
            ReplayOptions {
                preload: false,
                device_bytes: s.device_bytes as f64,
                prefetch_slots: None,
            },
            Some(&s.warm),
        )
        .unwrap();
        t.weigh_passes(&s.pass_weights);
        Projection::new(&t, &board, 4, gen).decode_tok_s.unwrap()
    };
    let short = moe_schedule(&dims, &plan(DECODE_PASSES_REPLAYED + 1), &chip).unwrap();
    assert!(short.pass_weights.iter().all(|&w| w == 1.0));
    let long = moe_schedule(&dims, &plan(200_001), &chip).unwrap();
    let passes = |e: &[ork_board::Event]| {
        e.iter()
            .filter(|e| matches!(e, ork_board::Event::Pass { .. }))
            .count()
    };
    assert_eq!(passes(&long.events), 1 + DECODE_PASSES_REPLAYED);
    assert_eq!(long.pass_weights.iter().sum::<f64>(), 200_001.0);
    // Twice the steps, each replayed pass standing for two: about the same rate.
    let twice = moe_schedule(&dims, &plan(2 * DECODE_PASSES_REPLAYED + 1), &chip).unwrap();
    assert_eq!(passes(&twice.events), 1 + DECODE_PASSES_REPLAYED);
    let (a, b) = (
        tok_s(&short, DECODE_PASSES_REPLAYED + 1),
        tok_s(&twice, 2 * DECODE_PASSES_REPLAYED + 1),
    );
    assert!(close_within(b, a, 0.05), "{a} {b}");

    let spec = |gen_tokens| SpecPlan {
        verifier: Plan {
            resident: true,
            slots: 0,
            budget_bytes: 1 << 30,
            prompt_tokens: 4,
            gen_tokens,
            kv_bytes: 2,
        },
        k: 2,
        acceptance: 0.5,
        seed: 5,
    };
    let draft = tiny_draft();
    let s = spec_schedule(&small_shape(), Some(&draft), &spec(300_000)).unwrap();
    assert!(s.rounds > DECODE_PASSES_REPLAYED);
    assert_eq!(passes(&s.events), s.pass_weights.len());
    // The prefill's two passes, then per replayed round k draft passes and the verifier's: at
    // most `DECODE_PASSES_REPLAYED` decode passes.
    assert_eq!(s.pass_weights.len(), 2 + 3 * (DECODE_PASSES_REPLAYED / 3));
    let rounds: f64 = s.pass_weights[2..].iter().step_by(3).sum();
    assert_eq!(rounds, s.rounds as f64);
}

/// The NPU's own share of a 512-token MoE prefill with every int8 expert already in device
/// memory (no loads): a lower bound on any NPU prefill of Qwen3-30B-A3B, stream-by-pack included
/// (`cargo test -p ork-board --test board -- --ignored --nocapture moe_npu_prefill_floor`).
#[test]
#[ignore = "prints a figure of docs/board-model.md"]
fn moe_npu_prefill_floor() {
    let board = Board::named("orangepi5-16g").unwrap();
    let dims = MoeDims::QWEN3_30B_A3B;
    let plan = MoePlan {
        ty: WeightType::Int8,
        prefetch: ExpertPrefetch::Router,
        cache_experts: dims.n_layer * dims.n_expert,
        prompt_tokens: 512,
        gen_tokens: 2,
        kv_bytes: 2,
        seed: 28,
    };
    let s = moe_schedule(&dims, &plan, &board.chip).unwrap();
    let t = replay_warm(
        &s.events,
        &board,
        ReplayOptions {
            preload: false,
            device_bytes: 0.0,
            prefetch_slots: None,
        },
        Some(&s.warm),
    )
    .unwrap();
    let p = Projection::new(&t, &board, 512, 2);
    println!("{:.2} s {:?}", p.ttft_s, t.passes[0].breakdown);
}

/// A speculative stream keys the draft's weights as the draft's: a self draft's ids are the
/// verifier's own, yet its weights are loaded once (resident) beside a verifier that streams the
/// same ids, and the names beside the stream print them `draft.`-prefixed, with the manifest's
/// keys.
#[test]
fn spec_stream_keys_the_drafts_weights_apart_from_the_verifiers() {
    use ork_board::{Event, EventNames, Model};
    use std::collections::HashSet;
    let shape = small_shape();
    let draft = ModelShape {
        blocks: shape.blocks[..1].to_vec(),
        ..shape.clone()
    };
    let s = spec_schedule(
        &shape,
        Some(&draft),
        &SpecPlan {
            verifier: streamed(2),
            k: 3,
            acceptance: 0.5,
            seed: 1,
        },
    )
    .unwrap();
    let of = |model: Model, load: bool| -> Vec<ork_manifest::WeightId> {
        s.events
            .iter()
            .filter_map(|e| match e {
                Event::Load { weight, .. } if load && weight.model == model => Some(weight.id),
                Event::Matmul { weight, .. } if !load && weight.model == model => Some(weight.id),
                _ => None,
            })
            .collect()
    };
    let draft_used: HashSet<_> = of(Model::Draft, false).into_iter().collect();
    let verifier_used: HashSet<_> = of(Model::Target, false).into_iter().collect();
    // Block 0's seven weights and the output projection, the same ids as the verifier's.
    assert_eq!(draft_used.len(), 8);
    assert!(draft_used.is_subset(&verifier_used));
    // The draft's loads: each weight once; the verifier streams its weights pass after pass.
    assert_eq!(of(Model::Draft, true).len(), 8);
    assert!(of(Model::Target, true).len() > 2 * shape.weights().count());
    let names = EventNames {
        target: &shape.names,
        draft: Some(&draft.names),
    };
    for e in names.named(&s.events) {
        if let Event::Matmul { weight, .. } = e {
            let key = weight.strip_prefix("draft.").unwrap_or(&weight);
            assert!(
                key == "output.weight" || key.starts_with("blk.") && key.ends_with(".weight"),
                "{weight}"
            );
            if weight.starts_with("draft.") {
                assert!(
                    key.starts_with("blk.0.") || key == "output.weight",
                    "{weight}"
                );
            }
        }
    }
}
