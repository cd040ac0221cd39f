//! Hostile board files (issue 39): parameters outside their physical ranges, limits that would
//! divide by zero, names with control characters, the replay's bounds, and plans whose memory
//! does not grow with their token count.

use ork_board::{
    replay, schedule, schedule_sampled, Board, BoardError, Chip, Plan, Projection, ReplayOptions,
    WeightType, DECODE_PASSES_REPLAYED, PARAMETER_RANGES,
};

fn field_of(e: &BoardError) -> String {
    match e {
        BoardError::Missing { field } | BoardError::BadValue { field, .. } => field.clone(),
        BoardError::InFile { source, .. } => field_of(source),
        other => panic!("{other:?}"),
    }
}

fn with_overrides(over: &str) -> String {
    format!(
        r#"{{"name": "x", "chip": "rk3588", "ram_gib": 8, "storage_read_gbps": 1,
            "overrides": {over}}}"#
    )
}

/// `"k_max": 1, "k_segment": 0.5` divided by zero in `Chip::calls` (exit 101): the limits are
/// whole numbers of at least 32 and a segment fits in one call.
#[test]
fn call_limits_that_would_divide_by_zero_are_refused() {
    for (over, field) in [
        (r#"{"k_max": 1, "k_segment": 0.5}"#, "overrides.k_max"),
        (r#"{"k_segment": 0.5}"#, "overrides.k_segment"),
        (r#"{"k_segment": 4096.5}"#, "overrides.k_segment"),
        (r#"{"k_segment": 20000}"#, "overrides.k_segment"),
        (r#"{"n_max": 1}"#, "overrides.n_max"),
        (r#"{"n_max_int4": 0.25}"#, "overrides.n_max_int4"),
        (r#"{"npu_cores": 2.5}"#, "overrides.npu_cores"),
    ] {
        let e = Board::from_json(&with_overrides(over)).unwrap_err();
        assert_eq!(field_of(&e), field, "{over}: {e}");
    }
    // The limits still split a large weight.
    let b = Board::from_json(&with_overrides(r#"{"k_max": 64, "k_segment": 32}"#)).unwrap();
    assert_eq!(b.chip.calls(100, 10, WeightType::Int8), 4);
    // A chip built in code with limits below one calls the weight whole instead of dividing by
    // zero (`replay` refuses such a board, see below).
    let mut chip = Chip::rk3588();
    chip.k_max = 1.0;
    chip.k_segment = 0.5;
    chip.n_max = 0.0;
    assert_eq!(chip.calls(64, 64, WeightType::Int8), 64 * 64);
}

/// Every parameter at 1e308 and at 1e-308 (which made `replay` run for ever, or print `inf` and
/// negative times) is refused naming it, as an override, in a whole chip, and on the board.
#[test]
fn every_parameter_outside_its_physical_range_is_refused() {
    let chip = serde_json::to_value(Chip::rk3588()).unwrap();
    for r in PARAMETER_RANGES {
        assert!(
            r.min > 0.0 && r.min < r.max && !r.why.is_empty(),
            "{}",
            r.name
        );
        for x in [1e308, 1e-308, r.min / 2.0, r.max * 2.0] {
            let board_level = ["ram_gib", "storage_read_gbps"].contains(&r.name);
            let (doc, field) = if board_level {
                let mut doc = serde_json::json!({"name": "x", "chip": "rk3588", "ram_gib": 8,
                                                 "storage_read_gbps": 1});
                doc[r.name] = serde_json::json!(x);
                (doc, r.name.to_owned())
            } else {
                let doc = with_overrides(&serde_json::json!({ r.name: x }).to_string());
                (
                    serde_json::from_str(&doc).unwrap(),
                    format!("overrides.{}", r.name),
                )
            };
            let e = Board::from_json(&doc.to_string()).unwrap_err();
            assert_eq!(field_of(&e), field, "{x}: {e}");
            assert!(e.to_string().contains("outside"), "{e}");
            if !board_level {
                let mut whole = chip.clone();
                whole[r.name] = serde_json::json!(x);
                let doc = serde_json::json!({"name": "x", "chip": whole, "ram_gib": 8,
                                             "storage_read_gbps": 1});
                let e = Board::from_json(&doc.to_string()).unwrap_err();
                assert_eq!(field_of(&e), format!("chip.{}", r.name), "{e}");
            }
        }
        // Both ends are accepted.
        for x in [r.min, r.max] {
            let text = if ["ram_gib", "storage_read_gbps"].contains(&r.name) {
                let mut doc = serde_json::json!({"name": "x", "chip": "rk3588", "ram_gib": 8,
                                                 "storage_read_gbps": 1});
                doc[r.name] = serde_json::json!(x);
                doc.to_string()
            } else {
                // A segment must fit in one call: the other limit follows the one tested.
                let mut over = serde_json::json!({ r.name: x });
                match r.name {
                    "k_max" => over["k_segment"] = serde_json::json!(x.min(8192.0)),
                    "k_segment" => over["k_max"] = serde_json::json!(x.max(10240.0)),
                    _ => {}
                }
                with_overrides(&over.to_string())
            };
            Board::from_json(&text).unwrap_or_else(|e| panic!("{} = {x}: {e}", r.name));
        }
    }
}

fn plan(resident: bool) -> Plan {
    Plan {
        resident,
        slots: 2,
        budget_bytes: if resident { 64 << 20 } else { 3 << 20 },
        prompt_tokens: 16,
        gen_tokens: 4,
        kv_bytes: 2,
    }
}

fn project(board: &Board, resident: bool) -> Result<Projection, BoardError> {
    let p = plan(resident);
    let events = schedule(&super::tiny_shape(&board.chip), &p)?;
    let t = replay(
        &events,
        board,
        ReplayOptions {
            preload: resident,
            device_bytes: p.budget_bytes as f64,
            prefetch_slots: (!resident).then_some(2),
        },
    )?;
    Ok(Projection::new(&t, board, p.prompt_tokens, p.gen_tokens))
}

fn finite(p: &Projection) -> bool {
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    let b = p.per_token.unwrap();
    [
        p.ttft_s,
        p.prefill_tok_s,
        p.decode_tok_s.unwrap(),
        p.load_s,
        b.npu_s,
        b.submit_s,
        b.host_s,
        b.copy_stall_s,
        b.domain_switch_s,
    ]
    .into_iter()
    .all(ok)
}

/// At every end of every range (each parameter alone at its least and largest value, then all at
/// once) the projection is finite and not negative; a board built in code outside the ranges is
/// refused by `replay` (a typed error, never a hang: `call_s` = 1e308 ran for ever).
#[test]
fn projections_are_finite_within_the_ranges_and_refused_outside() {
    let base = Board::named("rk3588").unwrap();
    let set = |board: &mut Board, name: &str, x: f64| {
        let mut v = serde_json::to_value(&board.chip).unwrap();
        match name {
            "ram_gib" => board.ram_bytes = x * (1u64 << 30) as f64,
            "storage_read_gbps" => board.storage_read_bw = x * 1e9,
            _ => {
                v[name] = serde_json::json!(x);
                board.chip = serde_json::from_value(v).unwrap();
            }
        }
    };
    let mut low = base.clone();
    let mut high = base.clone();
    for r in PARAMETER_RANGES {
        for x in [r.min, r.max] {
            let mut b = base.clone();
            set(&mut b, r.name, x);
            // A segment must fit in one call: the other limit follows the one tested.
            match r.name {
                "k_max" => b.chip.k_segment = b.chip.k_segment.min(x),
                "k_segment" => b.chip.k_max = b.chip.k_max.max(x),
                _ => {}
            }
            for resident in [true, false] {
                let p = project(&b, resident)
                    .unwrap_or_else(|e| panic!("{} = {x}, resident {resident}: {e}", r.name));
                assert!(finite(&p), "{} = {x}: {p:?}", r.name);
            }
        }
        set(&mut low, r.name, r.min);
        set(&mut high, r.name, r.max);
    }
    for b in [&low, &high] {
        for resident in [true, false] {
            let p = project(b, resident).unwrap();
            assert!(finite(&p), "{p:?}");
            assert!(p.line().chars().all(|c| !c.is_control()), "{}", p.line());
        }
    }
    for (name, x) in [
        ("call_s", 1e308),
        ("npu_int8_ops", 1e-308),
        ("npu_read_bw", 1e-308),
        ("host_cores", 1e-308),
        ("ddr_bw", 1e308),
    ] {
        let mut b = base.clone();
        set(&mut b, name, x);
        let e = project(&b, false).unwrap_err();
        assert_eq!(field_of(&e), format!("chip.{name}"), "{e}");
    }
}

/// Board names are printed in every projection line: control characters (an ANSI escape, a
/// newline) are refused, and the error shows them escaped; so does an unknown `--project NAME`.
#[test]
fn board_names_with_control_characters_are_refused() {
    for name in [
        "\u{1b}[31mred",
        "two\nlines",
        "bell\u{7}",
        "",
        &"n".repeat(65),
    ] {
        let doc = serde_json::json!({"name": name, "chip": "rk3588", "ram_gib": 8,
                                     "storage_read_gbps": 1});
        let e = Board::from_json(&doc.to_string()).unwrap_err();
        assert_eq!(field_of(&e), "name", "{e}");
        assert!(!e.to_string().chars().any(char::is_control), "{e:?}");
    }
    // An unknown name from the command line is shown escaped in the error.
    let e = Board::named("rk\u{1b}[2Jx\ny").unwrap_err();
    assert!(!e.to_string().chars().any(char::is_control), "{e:?}");
    assert!(e.to_string().contains(r"rk\u{1b}[2Jx\ny"), "{e}");
    let doc = r#"{"name": "my-rock5b (16 GB)", "chip": "rk3588", "ram_gib": 8,
                 "storage_read_gbps": 1}"#;
    assert_eq!(Board::from_json(doc).unwrap().name, "my-rock5b (16 GB)");
}

/// A plan's memory does not grow with its token count (`--gen-tokens 1000000` grew ~70 KB per
/// token until out of memory): beyond `DECODE_PASSES_REPLAYED` decode passes the schedule replays
/// that many, each standing for its run of steps, and the projection stays the full replay's.
#[test]
fn sampled_decode_matches_the_full_replay() {
    let board = Board::named("rk3588").unwrap();
    let shape = super::tiny_shape(&board.chip);
    for resident in [true, false] {
        let mut p = plan(resident);
        p.prompt_tokens = 64;
        let opts = ReplayOptions {
            preload: true,
            device_bytes: p.budget_bytes as f64,
            prefetch_slots: (!resident).then_some(2),
        };
        // Within the bound: schedule()'s own stream, every weight 1.
        p.gen_tokens = DECODE_PASSES_REPLAYED + 1;
        let (events, weights) = schedule_sampled(&shape, &p).unwrap();
        assert_eq!(events, schedule(&shape, &p).unwrap());
        assert!(weights.iter().all(|&w| w == 1.0));
        let bounded = events.len();
        // Beyond it: as many events for a million tokens, the weights adding up to the steps.
        p.gen_tokens = 1_000_000;
        let (events, weights) = schedule_sampled(&shape, &p).unwrap();
        assert_eq!(events.len(), bounded);
        assert_eq!(weights.iter().sum::<f64>(), 1.0 + 999_999.0);
        // Against the full replay of 4001 tokens.
        p.gen_tokens = 4001;
        let full = replay(&schedule(&shape, &p).unwrap(), &board, opts).unwrap();
        let full = Projection::new(&full, &board, p.prompt_tokens, p.gen_tokens);
        let (events, weights) = schedule_sampled(&shape, &p).unwrap();
        let mut t = replay(&events, &board, opts).unwrap();
        t.weigh_passes(&weights);
        let sampled = Projection::new(&t, &board, p.prompt_tokens, p.gen_tokens);
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 2e-3 || (a - b).abs() < 1e-12;
        assert_eq!(sampled.ttft_s, full.ttft_s);
        assert!(
            close(sampled.decode_tok_s.unwrap(), full.decode_tok_s.unwrap()),
            "resident {resident}: {sampled:?} against {full:?}"
        );
        let (a, b) = (sampled.per_token.unwrap(), full.per_token.unwrap());
        for (x, y) in [
            (a.npu_s, b.npu_s),
            (a.host_s, b.host_s),
            (a.submit_s, b.submit_s),
            (a.copy_stall_s, b.copy_stall_s),
            (a.total(), b.total()),
        ] {
            assert!(close(x, y), "resident {resident}: {a:?} against {b:?}");
        }
        assert!(
            close(sampled.storage_bytes, full.storage_bytes) || full.storage_bytes == 0.0,
            "{} against {}",
            sampled.storage_bytes,
            full.storage_bytes
        );
        assert_eq!(sampled.passes, DECODE_PASSES_REPLAYED + 1);
    }
}
