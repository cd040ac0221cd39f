//! The CPU engine's cost model: its fit reproduces, its predictions are reported, and the
//! engine choice is never projected slower than either engine alone (on the RK3588 and the
//! RK3576, with the NPU drawing on the same bus), and a row-split decode is bounded both ways.

use ork_board::cpu::{
    attention_s, cache_hits, chunked_s, cycles, file_type, gemm_cycles, little_attention_speed,
    ork_attention_cycles, prefill_cycles, project, row_bytes, Core, CpuBoard, CpuPlan, FileType,
    Kernels, Pool, FITTED_CPU, FIT_RK3588, GGML_CYCLES, GGML_CYCLES_ARMV8_0, GGML_GEMM_CYCLES,
    ORK_ATTENTION_CYCLES, ORK_CYCLES, ORK_DECODE_CYCLES, ORK_GEMM_CYCLES, UNFITTED,
};
use ork_board::cpu_fit::{
    fit_cpu, project_cpu_row, CPU_FIT_ROWS, CPU_HOLDOUT_ROWS, GEMMA3_1B, QWEN3_30B_A3B,
};
use ork_board::engines::{choose, Cores, CpuInputs, Engine, EngineInputs, NpuHolds, Phases};
use ork_board::options::dense_int8_bytes;
use ork_board::split::{cpu_read_bw_beside, split_decode, split_prefill};
use ork_board::{Board, HostKind};

#[test]
fn cpu_calibration_reproduces_the_fit() {
    let (f, loss) = fit_cpu().unwrap();
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.01;
    assert!(close(f.read_frac, FITTED_CPU.read_frac), "{f:?}");
    assert!(close(f.layer_s, FITTED_CPU.layer_s), "{f:?}");
    assert!(close(f.gemm_gain, FITTED_CPU.gemm_gain), "{f:?}");
    assert!((loss / FITTED_CPU_LOSS - 1.0).abs() < 0.01, "loss {loss}");
    // Decode, which the fit is for, within 12 % on each fitted row.
    for row in &CPU_FIT_ROWS {
        let (_, tg) = project_cpu_row(row, &FITTED_CPU).unwrap();
        assert!((tg / row.tg128 - 1.0).abs() < 0.12, "{} tg {tg}", row.model);
    }
}

/// The fit's loss (sum of squared log errors over the three rows' pp512 and tg128).
const FITTED_CPU_LOSS: f64 = 0.3086;

#[test]
#[ignore = "prints the table of docs/board-model.md"]
fn cpu_fit_report() {
    println!("{FITTED_CPU:?}");
    for (fitted, row) in CPU_FIT_ROWS
        .iter()
        .map(|r| (true, r))
        .chain(CPU_HOLDOUT_ROWS.iter().map(|r| (false, r)))
    {
        let (pp, tg) = project_cpu_row(row, &FITTED_CPU).unwrap();
        println!(
            "| {}{} | {} | {pp:.1} | {} | {:+.0} % | {tg:.2} | {} | {:+.0} % |",
            row.model,
            if fitted { " (fitted)" } else { "" },
            row.board,
            row.pp512,
            (pp / row.pp512 - 1.0) * 100.0,
            row.tg128,
            (tg / row.tg128 - 1.0) * 100.0
        );
    }
}

#[test]
fn pi5_holdout_decode_within_fifteen_percent() {
    let row = CPU_HOLDOUT_ROWS
        .iter()
        .find(|r| r.board == "pi5-16g")
        .unwrap();
    let (_, tg) = project_cpu_row(row, &FITTED_CPU).unwrap();
    assert!((tg / row.tg128 - 1.0).abs() < 0.15, "tg {tg}");
}

#[test]
fn cycles_come_from_the_table_and_little_cores_are_slower() {
    for (ty, a76, a55) in GGML_CYCLES {
        assert_eq!(cycles(ty, Core::A76, Kernels::Ggml), a76);
        assert_eq!(cycles(ty, Core::A55, Kernels::Ggml), a55);
        assert!(a55 > a76, "{ty:?}");
    }
    assert_eq!(
        cycles(FileType::F32, Core::A76, Kernels::Ggml),
        2.0 * cycles(FileType::F16, Core::A76, Kernels::Ggml)
    );
    // Row bytes: ggml's block sizes.
    assert_eq!(row_bytes(FileType::Q4_0, 64), 36);
    assert_eq!(row_bytes(FileType::Q3_K, 512), 220);
    assert_eq!(row_bytes(FileType::Q4_0, 40), 36);
    assert_eq!(file_type("Q6_K"), Some(FileType::Q6_K));
    assert_eq!(file_type("Q7_K"), None);
}

/// The cycles the board clock charges are the table `scripts/kernel-cycles.sh` printed and
/// docs/kernels.md holds ("Cycles per 256 weights on the board's cores"): every row of it equals
/// `ORK_CYCLES` and `GGML_CYCLES`, and its ratios are theirs, so a re-run of the script that
/// updates one and not the other fails here.
#[test]
fn cycles_tables_equal_the_kernels_doc() {
    let head = "| type | A76 ork | A76 ggml | A76 ork/ggml | A55 ork | A55 ggml | A55 ork/ggml |";
    doc_table_equals(head, 0, &ORK_CYCLES, &GGML_CYCLES);
}

/// The prefill tables likewise: `ORK_GEMM_CYCLES` and `GGML_GEMM_CYCLES` against docs/kernels.md's
/// "Prefill (M > 1) cycles per 256 multiply-adds" (`scripts/kernel-cycles.sh --gemm`).
#[test]
fn gemm_cycles_tables_equal_the_kernels_doc() {
    let head =
        "| type | llama.cpp's prefill kernel | A76 ork | A76 ggml | A76 ork/ggml | A55 ork | \
                A55 ggml | A55 ork/ggml |";
    doc_table_equals(head, 1, &ORK_GEMM_CYCLES, &GGML_GEMM_CYCLES);
}

/// `ORK_DECODE_CYCLES` against docs/kernels.md's decode table (`scripts/kernel-cycles.sh --gemm`,
/// its `decode` column).
#[test]
fn decode_cycles_table_equals_the_kernels_doc() {
    let mut rows = 0;
    for (line, cells) in kernels_doc_table("| type | A76 decode | A55 decode |") {
        let ty = file_type(&cells[1]).unwrap_or_else(|| panic!("type {}", cells[1]));
        let d = ORK_DECODE_CYCLES.iter().find(|c| c.0 == ty).unwrap();
        let num = |i: usize| cells[i].parse::<f64>().unwrap();
        assert_eq!((num(2), num(3)), (d.1, d.2), "{line}");
        rows += 1;
    }
    assert_eq!(rows, ORK_DECODE_CYCLES.len());
}

/// ork's k-quant prefill is charged its tile plus one decode of each weight row per chunk of
/// activation rows (ork-kernels' own chunk), shared by the chunk's rows; llama.cpp's kernels and
/// the types that decode inside their tile pay none.
#[test]
fn prefill_charges_one_decode_per_chunk_of_rows() {
    let k = 2048;
    let chunk = ork_kernels::blocks::k_quant_chunk_rows(k);
    assert_eq!(chunk, 192 * 1024 / (k / 256 * 292));
    let tile = gemm_cycles(FileType::Q3_K, Core::A76, Kernels::Ork);
    let dec = ORK_DECODE_CYCLES[1];
    assert_eq!(dec.0, FileType::Q3_K);
    let at = |rows: f64| prefill_cycles(FileType::Q3_K, Core::A76, Kernels::Ork, rows, k);
    assert!((at(32.0) - (tile + dec.1 / 32.0)).abs() < 1e-9);
    let c = chunk as f64;
    assert!((at(c) - (tile + dec.1 / c)).abs() < 1e-9);
    assert!((at(c + 1.0) - (tile + 2.0 * dec.1 / (c + 1.0))).abs() < 1e-9);
    for (ty, kernels) in [
        (FileType::Q3_K, Kernels::Ggml),
        (FileType::Q4_0, Kernels::Ork),
    ] {
        let g = gemm_cycles(ty, Core::A76, kernels);
        assert_eq!(prefill_cycles(ty, Core::A76, kernels, 32.0, k), g);
    }
}

/// The docs/kernels.md table under `head` (its figures `skip` columns after the type) holds
/// `ork` and `ggml`, row for row, with their ratios.
fn doc_table_equals(
    head: &str,
    skip: usize,
    ork: &[(FileType, f64, f64)],
    ggml: &[(FileType, f64, f64)],
) {
    let mut rows = 0;
    for (line, cells) in kernels_doc_table(head) {
        let ty = file_type(&cells[1]).unwrap_or_else(|| panic!("type {}", cells[1]));
        let num = |i: usize| cells[i + skip].parse::<f64>().unwrap();
        let o = ork.iter().find(|c| c.0 == ty).unwrap();
        let g = ggml.iter().find(|c| c.0 == ty).unwrap();
        assert_eq!(
            (num(2), num(3), num(5), num(6)),
            (o.1, g.1, o.2, g.2),
            "{line}"
        );
        let ratio = |a: f64, b: f64| format!("{:.2}", a / b);
        assert_eq!(cells[4 + skip], ratio(o.1, g.1), "{line}");
        assert_eq!(cells[7 + skip], ratio(o.2, g.2), "{line}");
        rows += 1;
    }
    assert_eq!(rows, ork.len());
}

fn rk3588(name: &str) -> CpuBoard {
    CpuBoard::of(&Board::named(name).unwrap(), &FITTED_CPU).unwrap()
}

fn plan(b: &CpuBoard, threads: usize) -> CpuPlan {
    CpuPlan {
        threads,
        pool: Pool::Even,
        kernels: Kernels::Ggml,
        cache_bytes: b.ram_bytes - b.reserved_bytes,
        kv_bytes: 2,
    }
}

/// ork-exec's attention computes each row over the keys it sees (causal, within a window):
/// `keys_seen` counts them as a loop would; ork's prefill attention is then about half of
/// llama.cpp's, which scores every cached key and masks after.
#[test]
fn attention_counts_ork_causal_keys_and_llama_cpp_full_rows() {
    for (m, context, window) in [
        (1, 0, None),
        (7, 3, None),
        (512, 0, None),
        (9, 4, Some(6)),
        (40, 100, Some(32)),
        (5, 0, Some(1)),
    ] {
        let brute: usize = (0..m)
            .map(|i| window.map_or(context + i + 1, |w: usize| w.min(context + i + 1)))
            .sum();
        assert_eq!(
            HostKind::keys_seen(m, context, window),
            brute,
            "{m} {context} {window:?}"
        );
    }
    let b = rk3588("orangepi5-16g");
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let ork = CpuPlan {
        kernels: Kernels::Ork,
        ..plan(&b, 4)
    };
    let fixed = shape.n_layer as f64 * b.cpu.layer_s;
    let (o, g) = (
        attention_s(&shape, &b, &ork, 512, 0) - fixed,
        attention_s(&shape, &b, &plan(&b, 4), 512, 0) - fixed,
    );
    // llama.cpp: every row over all 512 keys at the assumed rate; ork: the causal keys (about
    // half) at its loops' cycles on four A76s.
    let (heads, _, hd) = shape.heads;
    let layers = shape.n_layer as f64;
    let flops = 4.0 * (512 * 512 * heads * hd) as f64 * layers;
    assert!(
        (g - flops / (4.0 * b.cpu.core_flops)).abs() < 1e-9 * g,
        "{g}"
    );
    let a76 = ork_attention_cycles(Core::A76).unwrap().per_key(hd);
    let pairs = (HostKind::keys_seen(512, 0, None) * heads) as f64 * layers;
    let want = pairs * a76 / (4.0 * b.cpu.big.1);
    assert!((o - want).abs() < 1e-9 * want, "{o} {want}");
}

/// ork's attention cycles are the table `docs/kernels.md` prints ("Attention", from
/// `scripts/kernel-cycles.sh --attention`), and a head's cost per key grows with its size.
#[test]
fn attention_cycles_table_equals_the_kernels_doc() {
    let mut rows = 0;
    for (line, cells) in
        kernels_doc_table("| core | scores (cycles per key and head, head of 128) |")
    {
        let core = match cells[1].as_str() {
            "A76" => Core::A76,
            "A55" => Core::A55,
            c => panic!("core {c}"),
        };
        let c = ork_attention_cycles(core).unwrap();
        let num = |i: usize| cells[i].parse::<f64>().unwrap();
        assert_eq!(
            (num(2), num(3), num(4)),
            (c.scores, c.values, c.softmax),
            "{line}"
        );
        assert!(c.per_key(64) < c.per_key(128) && c.per_key(128) < c.per_key(256));
        rows += 1;
    }
    assert_eq!(rows, ORK_ATTENTION_CYCLES.len());
    assert!(ork_attention_cycles(Core::A72).is_none());
}

#[test]
fn a_little_core_does_attention_slower_than_a_big_one() {
    let b = rk3588("orangepi5-16g");
    // 1.8 / 2.352 GHz × ggml's F16 cycles 64.4 / 224.0 (llvm-mca, docs/kernels.md).
    let speed = little_attention_speed(&b.cpu);
    assert!((speed - 1.8 / 2.352 * 64.4 / 224.0).abs() < 1e-9, "{speed}");
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let (big, all) = (plan(&b, 4), plan(&b, 8));
    let t4 = attention_s(&shape, &b, &big, 512, 0);
    let t8 = attention_s(&shape, &b, &all, 512, 0);
    // Eight cores beat four, but by far less than twice: the A55s add about a fifth of an A76.
    assert!(t8 < t4 && t8 > 0.75 * t4, "{t8} {t4}");
}

#[test]
fn little_cores_and_storage_slow_the_cpu_down() {
    let b = rk3588("orangepi5-16g");
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let big = project(&shape, &b, &plan(&b, 4), 128, 64);
    // llama.cpp splits rows evenly: four A55s beside the A76s make the slowest share slower.
    let all = project(&shape, &b, &plan(&b, 8), 128, 64);
    assert!(all.ttft_s > big.ttft_s, "{all:?} {big:?}");
    // One thread reads at one core's rate.
    let one = project(&shape, &b, &plan(&b, 1), 128, 64);
    assert!(one.decode_tok_s < big.decode_tok_s / 1.5);
    // A page cache smaller than the file: the rest from NVMe, every token.
    let starved = CpuPlan {
        cache_bytes: 0.1e9,
        ..plan(&b, 4)
    };
    let s = project(&shape, &b, &starved, 128, 64);
    assert!(s.decode_tok_s < big.decode_tok_s / 5.0, "{s:?}");
}

#[test]
fn a_moe_reads_only_its_chosen_experts_in_decode() {
    let b = rk3588("orangepi5-32g");
    let moe = QWEN3_30B_A3B.shape(FileType::Q4_K, FileType::Q6_K);
    let active = moe.active_bytes();
    assert!(active < moe.file_bytes() / 5.0, "{active}");
    let p = project(&moe, &b, &plan(&b, 4), 128, 64);
    // Decode below the bus's ceiling for the bytes read, above a tenth of it.
    let ceiling = b.ddr_bw / active;
    assert!(
        p.decode_tok_s < ceiling && p.decode_tok_s > ceiling / 10.0,
        "{p:?}"
    );
}

/// A MoE file larger than the page cache: its dense weights stay (read every token, never
/// released), the experts kept are the cache less them and two blocks' routed experts, over all
/// the experts (ork-cpu's keep budget); a file that fits is held whole; a dense model keeps the
/// cache's share of the file.
#[test]
fn the_page_cache_keeps_dense_weights_and_what_is_left_of_the_experts() {
    let moe = QWEN3_30B_A3B.shape(FileType::Q4_K, FileType::Q6_K);
    let file = moe.file_bytes();
    let whole = cache_hits(&moe, file);
    assert_eq!((whole.dense, whole.experts), (1.0, 1.0));
    let bytes = |expert: bool| -> f64 {
        moe.weights
            .iter()
            .filter(|w| (w.experts > 1) == expert)
            .map(|w| w.bytes() as f64)
            .sum()
    };
    let (experts, dense) = (bytes(true), bytes(false) + moe.other_bytes as f64);
    // 48 blocks, top-8 of 128 experts: one block routes 1/16 of its experts' bytes.
    let routed_block = experts / 48.0 * 8.0 / 128.0;
    let cache = 0.8 * file;
    let h = cache_hits(&moe, cache);
    assert_eq!(h.dense, 1.0);
    let want = (cache - dense - 2.0 * routed_block) / experts;
    assert!((h.experts - want).abs() < 1e-12, "{h:?} {want}");
    // Above the byte share of the whole file, which charged dense misses too.
    assert!(h.experts < cache / file && h.experts > 0.75, "{h:?}");
    // Less cache than the dense weights: they share it, no expert is kept.
    let h = cache_hits(&moe, 0.5 * dense);
    assert_eq!((h.dense, h.experts), (0.5, 0.0));
    let gemma = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let g = cache_hits(&gemma, 0.25 * gemma.file_bytes());
    assert!(
        (g.dense - 0.25).abs() < 1e-12 && g.experts == g.dense,
        "{g:?}"
    );
    // On a 16 GB board the Q4_K_M-class file misses its NVMe on a few experts only.
    let b = rk3588("orangepi5-16g");
    let p = project(&moe, &b, &plan(&b, 4), 128, 64);
    let starved = CpuPlan {
        cache_bytes: 0.5 * file,
        ..plan(&b, 4)
    };
    let s = project(&moe, &b, &starved, 128, 64);
    assert!(s.decode_tok_s < p.decode_tok_s / 2.0, "{s:?} {p:?}");
}

#[test]
fn the_chosen_pairing_is_never_slower_than_either_engine_alone() {
    // Every catalogue-like case: the NPU faster in one phase, the CPU in the other, or one
    // engine missing.
    let cases = [
        (Some((0.4, 16.0)), Some((3.0, 28.0)), Some((3.2, 25.0))),
        (Some((0.4, 40.0)), Some((3.0, 28.0)), Some((3.2, 25.0))),
        (Some((9.0, 0.7)), Some((40.0, 8.0)), Some((60.0, 3.0))),
        (None, Some((40.0, 8.0)), None),
        (Some((1.0, 4.0)), None, None),
    ];
    let ph = |x: Option<(f64, f64)>| {
        x.map(|(ttft_s, decode_tok_s)| Phases {
            ttft_s,
            decode_tok_s,
        })
    };
    let at = |p: ork_board::cpu::CpuProjection| {
        Some(Phases {
            ttft_s: p.ttft_s,
            decode_tok_s: p.decode_tok_s,
        })
    };
    // The CPU's own projections on the RK3588 and the RK3576, on the big cores and on every
    // core (ork's pool), alone, beside an NPU that holds RAM and draws 80 % of the bus (the
    // contention of `serve`'s overlap), and beside an NPU that holds the dense weights alone;
    // against NPU figures either side of them.
    let mut projected = Vec::new();
    // A dense model and the MoE of the moonshot goal (Qwen3-30B-A3B at 3 bits).
    let shapes = [
        GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0),
        QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K),
    ];
    for (b, shape) in boards()
        .into_iter()
        .flat_map(|b| shapes.clone().map(|s| (b.clone(), s)))
    {
        let cache = b.ram_bytes - b.reserved_bytes;
        let mut beside = b.clone();
        beside.cpu.read_bw = cpu_read_bw_beside(&b, 0.8 * b.ddr_bw);
        let inputs_on = |threads: usize| {
            let own = |c: f64| CpuPlan {
                pool: Pool::Chunks,
                kernels: Kernels::Ork,
                cache_bytes: c.max(0.0),
                ..plan(&b, threads)
            };
            let starved = own(0.5e9);
            let dense = own(cache - dense_int8_bytes(&shape));
            CpuInputs {
                alone: at(project(&shape, &b, &own(cache), 128, 64)),
                beside_npu: at(project(&shape, &beside, &starved, 128, 64)),
                // The row split, its CPU share on the same starved cache (the clock's own
                // figure), or beside the dense weights alone.
                split_decode_tok_s: split_decode(&shape, &b, &starved, 160).map(|s| s.decode_tok_s),
                beside_dense: at(project(&shape, &b, &dense, 128, 64)),
                dense_split_decode_tok_s: split_decode(&shape, &b, &dense, 160)
                    .map(|s| s.decode_tok_s),
                split_prefill_ttft_s: split_prefill(&shape, &b, &starved, 128, 128)
                    .map(|s| s.1.ttft_s),
                dense_split_prefill_ttft_s: split_prefill(&shape, &b, &dense, 128, 128)
                    .map(|s| s.1.ttft_s),
            }
        };
        let big = inputs_on(b.cpu.big.0 as usize);
        let all = inputs_on((b.cpu.big.0 + b.cpu.little.0) as usize);
        let a = big.alone.unwrap();
        for npu in [
            (a.ttft_s / 5.0, a.decode_tok_s * 0.6),
            (a.ttft_s * 2.0, a.decode_tok_s * 1.5),
        ] {
            projected.push((ph(Some(npu)), big, Some(all)));
        }
        projected.push((Some(a), big, Some(all)));
    }
    let listed = cases.map(|(npu, cpu, beside)| {
        let big = CpuInputs {
            alone: ph(cpu),
            beside_npu: ph(beside),
            ..CpuInputs::default()
        };
        (ph(npu), big, None)
    });
    for (npu, big, all) in listed.into_iter().chain(projected) {
        let inputs = EngineInputs { npu, big, all };
        let c = choose(&inputs, 64).unwrap();
        let chosen = c.chosen().unwrap();
        // Never slower than either engine alone, on either core set.
        for alone in [Engine::Npu, Engine::Cpu] {
            for a in c
                .alternatives
                .iter()
                .filter(|p| p.prefill == alone && p.decode == alone)
            {
                assert!(chosen.total_s <= a.total_s, "{c:?}");
            }
        }
        // The splits and every core are among the pairings, never chosen projected slower
        // than another.
        assert!(c.alternatives.iter().all(|a| chosen.total_s <= a.total_s));
        let splits = |f: fn(&CpuInputs) -> Option<f64>| {
            usize::from(f(&big).is_some()) + all.as_ref().map_or(0, |a| usize::from(f(a).is_some()))
        };
        let npu_splits = if npu.is_some() {
            splits(|c| c.split_decode_tok_s)
        } else {
            0
        };
        let dense_splits = splits(|c| c.dense_split_decode_tok_s);
        let count = |holds| {
            c.alternatives
                .iter()
                .filter(|p| p.decode == Engine::Split && p.prefill != Engine::Split)
                .filter(|p| p.npu_holds == Some(holds))
                .count()
        };
        assert_eq!(count(NpuHolds::Pack), npu_splits, "{c:?}");
        assert_eq!(count(NpuHolds::Dense), dense_splits, "{c:?}");
        // The prefill splits: split/npu (the pack), split/cpu and split/split (the dense
        // weights).
        let prefill_splits = if npu.is_some() {
            splits(|c| c.split_prefill_ttft_s)
        } else {
            0
        } + 2 * splits(|c| c.dense_split_prefill_ttft_s);
        let prefill_split = |p: &&ork_board::engines::Pairing| p.prefill == Engine::Split;
        assert_eq!(
            c.alternatives.iter().filter(prefill_split).count(),
            prefill_splits,
            "{c:?}"
        );
        if all.is_some() {
            assert!(c.alternatives.iter().any(|p| p.cores == Some(Cores::All)));
        }
    }
    // The first case: the NPU prefills, the CPU decodes (on its big cores: every core is not
    // weighed there).
    let c = choose(
        &EngineInputs {
            npu: ph(cases[0].0),
            big: CpuInputs {
                alone: ph(cases[0].1),
                beside_npu: ph(cases[0].2),
                ..CpuInputs::default()
            },
            all: None,
        },
        64,
    )
    .unwrap();
    assert_eq!(
        (c.engines.prefill, c.engines.decode, c.engines.cores),
        (Engine::Npu, Engine::Cpu, Some(Cores::Big))
    );
    assert_eq!(c.alternatives.len(), 4);
}

#[test]
fn pi5_is_a_cpu_only_board() {
    let b = CpuBoard::resolve("pi5-16g").unwrap().unwrap();
    assert!(!b.npu);
    assert_eq!(b.cpu.big, (4.0, 2.4e9));
    assert!((b.ddr_bw - 17.068e9).abs() < 1e7);
}

#[test]
fn the_rk3576_cpu_is_modelled_unfitted_from_the_a72_and_a53_tables() {
    let b = CpuBoard::resolve("rk3576-8g").unwrap().unwrap();
    assert_eq!(b.cpu.kinds, (Core::A72, Core::A53));
    assert_eq!(b.cpu.fit, UNFITTED);
    assert_eq!((b.cpu.big, b.cpu.little), ((4.0, 2.2e9), (4.0, 1.8e9)));
    // Its bus is half the RK3588's; the read fraction is the RK3588 fit's.
    let r = rk3588("orangepi5-16g");
    assert_eq!(r.cpu.fit, FIT_RK3588);
    assert!((b.cpu.read_bw / b.ddr_bw - r.cpu.read_bw / r.ddr_bw).abs() < 1e-12);
    for (ty, a72, a53) in GGML_CYCLES_ARMV8_0 {
        // ggml's plain-NEON column, whichever kernels are asked for (ork's need dotprod).
        assert_eq!(cycles(ty, Core::A72, Kernels::Ork), a72);
        assert_eq!(cycles(ty, Core::A53, Kernels::Ggml), a53);
        assert!(a53 > a72, "{ty:?}");
    }
    let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
    let slow = project(&shape, &b, &plan(&b, 4), 128, 64);
    let fast = project(&shape, &r, &plan(&r, 4), 128, 64);
    assert!(slow.decode_tok_s < fast.decode_tok_s, "{slow:?} {fast:?}");
    assert!(slow.ttft_s > fast.ttft_s, "{slow:?} {fast:?}");
}

fn boards() -> [CpuBoard; 2] {
    [
        rk3588("orangepi5-16g"),
        CpuBoard::resolve("rk3576-8g").unwrap().unwrap(),
    ]
}

#[test]
fn a_row_split_is_never_slower_than_the_cpu_nor_faster_than_the_bus() {
    for b in boards() {
        for shape in [
            GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0),
            GEMMA3_1B.shape(FileType::Q8_0, FileType::Q8_0),
            QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K),
        ] {
            let p = plan(&b, 4);
            let s = split_decode(&shape, &b, &p, 192).unwrap();
            let cpu = project(&shape, &b, &p, 192, 2);
            assert!(
                (s.cpu_decode_tok_s / cpu.decode_tok_s - 1.0).abs() < 1e-9,
                "{s:?}"
            );
            assert!(s.decode_tok_s >= s.cpu_decode_tok_s, "{s:?}");
            // Every byte a token needs crosses the one bus, read by whichever engine reads
            // fewer bytes for it at best (int8 on the NPU, the file's bits on the CPU).
            let least: f64 = shape
                .weights
                .iter()
                .map(|w| {
                    let file = w.bytes() as f64 / w.experts as f64
                        * if w.experts > 1 {
                            shape.top_k as f64
                        } else {
                            1.0
                        };
                    file.min(if w.experts > 1 {
                        f64::INFINITY
                    } else {
                        (w.k * w.n) as f64
                    })
                })
                .sum();
            assert!(s.decode_tok_s <= b.ddr_bw / least, "{s:?}");
            assert!((0.0..=1.0).contains(&s.npu_row_share), "{s:?}");
        }
        // No NPU, no split.
        let pi5 = CpuBoard::resolve("pi5-16g").unwrap().unwrap();
        let shape = GEMMA3_1B.shape(FileType::Q4_0, FileType::Q8_0);
        assert!(split_decode(&shape, &pi5, &plan(&pi5, 4), 192).is_none());
    }
}

#[test]
fn the_npu_reading_beside_the_cpu_leaves_it_the_rest_of_the_bus() {
    for b in boards() {
        assert_eq!(cpu_read_bw_beside(&b, 0.0), b.cpu.read_bw.min(b.ddr_bw));
        let shared = cpu_read_bw_beside(&b, 0.8 * b.ddr_bw);
        assert!(
            shared < b.cpu.read_bw && shared >= b.ddr_bw / 2.0,
            "{shared}"
        );
        let mut beside = b.clone();
        beside.cpu.read_bw = shared;
        let shape = GEMMA3_1B.shape(FileType::Q8_0, FileType::Q8_0);
        let alone = project(&shape, &b, &plan(&b, 4), 128, 64);
        let slowed = project(&shape, &beside, &plan(&b, 4), 128, 64);
        assert!(
            slowed.decode_tok_s < alone.decode_tok_s,
            "{slowed:?} {alone:?}"
        );
    }
}

/// ork's pool (chunks taken as workers finish): on cores of one kind it is the even split; with
/// slower cores beside, it is never slower than llama.cpp's even split and never faster than
/// the cores' summed rates; a round of few chunks waits for a slow core's last chunk.
#[test]
fn ork_pool_shares_chunks_by_finishing_order() {
    // 2048 rows on 4 equal threads: 16 chunks of 128 rows, 4 each.
    let even = chunked_s(1000.0, 2048, (4, 0), (1.0, 1.0));
    assert!((even - 250.0).abs() < 1e-9, "{even}");
    for (n, little_s) in [(768, 5.3), (2048, 5.3), (151_936, 3.0), (64, 5.3)] {
        let mixed = chunked_s(1000.0, n, (4, 4), (1.0, little_s));
        let llama = 1000.0 * little_s / 8.0;
        let ideal = 1000.0 / (4.0 + 4.0 / little_s);
        assert!(
            mixed <= llama + 1e-9 && mixed >= ideal - 1e-9,
            "{n}: {mixed}"
        );
    }
    // 768 rows on 8 threads: 32 chunks; an A55 chunk takes 5.3 A76 chunks and the last one
    // decides: slower than the four A76s alone.
    let big_only = chunked_s(1000.0, 768, (4, 0), (1.0, 5.3));
    assert!(chunked_s(1000.0, 768, (4, 4), (1.0, 5.3)) > big_only);
}

/// The execution choices for Qwen3-30B-A3B at 3 bits on a 16 GB RK3588 board (`cargo test -p
/// ork-board --test cpu -- --ignored --nocapture moonshot_report`).
#[test]
#[ignore = "prints the choices of docs/board-model.md"]
fn moonshot_report() {
    let b = rk3588("orangepi5-16g");
    let shape = QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K);
    let cache = b.ram_bytes - b.reserved_bytes;
    println!("ceiling {:.1}", b.ddr_bw / shape.active_bytes());
    for o in ork_board::options::options(&shape, &b, cache, 512, 128) {
        println!("{o:?}");
    }
}

/// A decode step's parts sum to the step the projection charges, and the MoE at 3 bits on a
/// 16 GB RK3588 is bound by compute, not the bus (docs/board-model.md, "What bounds the
/// moonshot"): its compute is most of the step and its rate is below the bytes' ceiling.
#[test]
fn decode_bounds_sum_to_the_step() {
    use ork_board::cpu::{attention_s, decode_bounds, weights_s};
    use ork_board::options::{options, ork_plan};
    let b = rk3588("orangepi5-16g");
    let shape = QWEN3_30B_A3B.shape(FileType::Q3_K, FileType::Q6_K);
    let cache = b.ram_bytes - b.reserved_bytes;
    for threads in [4, 8] {
        let plan = ork_plan(threads, cache);
        let d = decode_bounds(&shape, &b, &plan, 576);
        let step = weights_s(&shape, &b, &plan, 1) + attention_s(&shape, &b, &plan, 1, 576);
        assert!((d.step_s / step - 1.0).abs() < 1e-9, "{d:?} {step}");
        let compute: f64 = d.compute_s.iter().map(|c| c.1).sum();
        assert!(compute > 0.5 * d.step_s, "{d:?}");
    }
    let o = options(&shape, &b, cache, 512, 128);
    assert_eq!(o.len(), 4, "{o:?}");
    let ceiling = b.ddr_bw / shape.active_bytes();
    assert!(o.iter().all(|x| x.decode_tok_s < ceiling), "{o:?}");
    // The row split (dense rows on the NPU) beats the big cores alone here.
    assert!(o[2].decode_tok_s > o[0].decode_tok_s, "{o:?}");
}

/// The rows of the docs/kernels.md table whose header starts with `head`: each line with its
/// cells, trimmed of spaces and of the bold marks (`**`).
fn kernels_doc_table(head: &str) -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/kernels.md"
    ))
    .unwrap();
    let table = doc
        .split(head)
        .nth(1)
        .unwrap_or_else(|| panic!("the table {head} in docs/kernels.md"));
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells = line
                .split('|')
                .map(|c| c.trim().trim_matches('*').to_string())
                .collect();
            (line.to_string(), cells)
        })
        .collect()
}
