//! MoE experts read in place: readahead, next-block prediction and pinning are hints that
//! cost bandwidth, never correctness (issue 38: "same tokens with prediction on and off"), and
//! their figures are counted.

use std::sync::Arc;

use ork_cpu::{CpuError, ExpertReadOptions, ExpertReadStats, GgufLinear};
use ork_exec::{MoeStats, Session};
use ork_gguf::{GgmlType, GgufFile};

use super::fixtures::{pool, qwen3moe_in};

/// Greedy tokens and every step's logits (as bits) of a run, with its figures.
struct Run {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
    reads: ExpertReadStats,
    moe: MoeStats,
}

fn run(path: &std::path::Path, options: ExpertReadOptions, speculation: Option<usize>) -> Run {
    let gguf = Arc::new(GgufFile::open(path).unwrap());
    let model = Arc::new(ork_exec::Model::load(&gguf).unwrap());
    model.set_expert_speculation(speculation);
    let cpu = Arc::new(
        GgufLinear::open_with(Arc::clone(&gguf), model.matmul_weights(), pool(2), options).unwrap(),
    );
    let tok = ork_exec::Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = tok.encode("The capital of France is", true, false).unwrap();
    let mut s = Session::new(
        Arc::clone(&model),
        Arc::clone(&cpu) as Arc<dyn ork_exec::Linear>,
    );
    let mut l = s.prefill(&prompt).unwrap();
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..16 {
        logits.push(l.iter().map(|v| v.to_bits()).collect());
        let t = l
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        tokens.push(t);
        l = s.decode(t).unwrap();
    }
    Run {
        tokens,
        logits,
        reads: cpu.expert_stats(),
        moe: model.moe_stats().unwrap(),
    }
}

#[test]
fn readahead_prediction_and_pinning_change_no_bit() {
    let path = qwen3moe_in(GgmlType::Q8_0);
    let off = ExpertReadOptions {
        readahead: false,
        pin_bytes: 0,
    };
    let base = run(&path, off, None);
    assert_eq!(base.reads.readahead_bytes, 0);
    assert_eq!(base.moe.predictions, 0);
    assert!(base.moe.recall().is_none());

    let on = run(&path, ExpertReadOptions::default(), Some(1));
    // A wrong guess (extra 2 below: mostly wrong) must not change a bit either.
    let wide = run(
        &path,
        ExpertReadOptions {
            readahead: true,
            pin_bytes: 1 << 20,
        },
        Some(2),
    );
    for r in [&on, &wide] {
        assert_eq!(r.tokens, base.tokens);
        assert!(r.logits == base.logits, "logits changed with readahead on");
        // Read ahead, or found in the page cache already and not read again.
        assert!(r.reads.readahead_bytes + r.reads.readahead_resident_bytes > 0);
        assert!(r.moe.predictions > 0);
        let recall = r.moe.recall().unwrap();
        assert!((0.0..=1.0).contains(&recall));
    }
    // Every run routes the same rows: 6 blocks × (prompt + 16 tokens) × top-2 × 3 weights.
    assert_eq!(on.reads.routed_rows, base.reads.routed_rows);
    let skew = base.reads.router_skew.unwrap();
    assert!((1.0..=8.0).contains(&skew), "skew {skew}");
    // The pin budget holds a few of the hottest experts (as root; refused otherwise, and said).
    match &wide.reads.pin_error {
        None => {
            assert!(wide.reads.pinned_bytes > 0);
            assert!(wide.reads.pinned_bytes <= 1 << 20);
        }
        Some(e) => assert!(e.contains("mlock"), "{e}"),
    }
}

/// An announced expert (or the next block's other tensors) already in the page cache is not
/// read again (`mincore` before `posix_fadvise`), and the read-ahead window is set.
#[test]
fn experts_in_the_page_cache_are_not_read_again() {
    let path = qwen3moe_in(GgmlType::Q8_0);
    // Every page of the file in the page cache.
    let bytes = std::fs::read(&path).unwrap();
    assert!(!bytes.is_empty());
    let r = run(&path, ExpertReadOptions::default(), Some(1));
    // Only what was let go since (a guessed expert that was never routed, released after its
    // block) is read again: without the check every announced byte would be.
    let (read, resident) = (r.reads.readahead_bytes, r.reads.readahead_resident_bytes);
    assert!(read <= r.reads.released_bytes, "{:?}", r.reads);
    assert!(read * 100 < resident, "{:?}", r.reads);
    assert!(r.reads.readahead_window_bytes > 0, "{:?}", r.reads);
}

#[test]
fn a_pin_budget_above_the_ram_is_refused() {
    let path = qwen3moe_in(GgmlType::Q8_0);
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let model = ork_exec::Model::load(&gguf).unwrap();
    let ram = ork_cpu::topology::ram_bytes().unwrap();
    let options = ExpertReadOptions {
        readahead: true,
        pin_bytes: ram + (1 << 30),
    };
    let err = GgufLinear::open_with(gguf, model.matmul_weights(), pool(1), options).unwrap_err();
    assert!(
        matches!(err, CpuError::PinAboveRam { ram_bytes, .. } if ram_bytes == ram),
        "{err}"
    );
}
