//! gemma3: a small random model against llama.cpp (scripts/gemma3_golden.py, F32 KV cache), the
//! sliding window through every path (batch, decode, tree), and bad files refused naming the key
//! or tensor (docs/models.md, "gemma3").
use super::fixtures::{builder, from_builder, TinySpec};
use ork_exec::{CpuF32Linear, ExecError, KvType, Linear, Model, Session};
use ork_gguf::{GgufFile, MetaValue};
use ork_manifest::ManifestError;
use std::sync::Arc;

#[derive(serde::Deserialize)]
struct Golden {
    tiny: Tiny,
}

#[derive(serde::Deserialize)]
struct Tiny {
    sha256: String,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn golden_path() -> &'static str {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/gemma3_logits.json"
    )
}

fn tiny_golden() -> Tiny {
    let g: Golden =
        serde_json::from_str(&std::fs::read_to_string(golden_path()).expect("golden file"))
            .expect("golden JSON");
    g.tiny
}

fn tiny_gguf() -> Arc<GgufFile> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gemma3_tiny.gguf");
    Arc::new(GgufFile::open(std::path::Path::new(path)).expect("tiny gemma3"))
}

fn on_f32(gguf: &Arc<GgufFile>) -> (Arc<Model>, Arc<dyn Linear>) {
    let model = Arc::new(Model::load(gguf).expect("load gemma3"));
    let linear: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(gguf, model.matmul_weights()).expect("weights"));
    (model, linear)
}

/// The largest |ork − llama.cpp| over all logits, relative to the largest |logit|.
fn worst_relative(ours: &[f32], theirs: &[Vec<f32>]) -> f32 {
    let v = theirs[0].len();
    let top = theirs.iter().flatten().fold(0.0f32, |a, &b| a.max(b.abs()));
    let mut worst = 0.0f32;
    for (row, t) in ours.chunks_exact(v).zip(theirs) {
        for (a, b) in row.iter().zip(t) {
            worst = worst.max((a - b).abs());
        }
    }
    worst / top
}

/// Every logit of every position of a 20-token sequence within 2.5e-3 (relative to the largest
/// logit) of llama.cpp's: 5 local layers with a window of 4 and 1 global layer, QK-norm,
/// post-norms, GeLU gating, the embedding scale, the tied output and the soft-cap. Measured
/// 1.6e-3: llama.cpp's CPU takes its GeLU from a table of f16 inputs and outputs, ork computes
/// the function (with that table mimicked, the difference was 1.2e-4; docs/models.md). The
/// same file with a window as long as the context gives logits 1.8 apart: the window is
/// what is checked.
#[test]
fn tiny_logits_match_llama_cpp() {
    let g = tiny_golden();
    let gguf = tiny_gguf();
    let bytes = std::fs::read(gguf.path()).unwrap();
    assert_eq!(
        sha256_hex(&bytes),
        g.sha256,
        "the fixture changed since the golden was made"
    );
    let (model, linear) = on_f32(&gguf);
    let c = model.config();
    let gemma = c.gemma3.as_ref().expect("gemma3 config");
    assert_eq!(gemma.window, Some(4));
    assert_eq!(gemma.local, [true, true, true, true, true, false]);
    assert_eq!(gemma.final_softcap, Some(3.0));
    assert_eq!(gemma.rope_base_local, 10_000.0);
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&linear)).with_kv_type(KvType::F32);
    let logits = s.forward_all(&g.tokens).unwrap();
    let worst = worst_relative(&logits, &g.logits);
    eprintln!("tiny gemma3: worst logit difference from llama.cpp {worst:.2e} (relative)");
    assert!(worst < 2.5e-3, "{worst}");

    let unwindowed = ork_gguf::writer::GgufBuilder::from_file(
        &gguf,
        |_| true,
        &[("gemma3.attention.sliding_window", MetaValue::U32(64))],
    );
    let (model, linear) = on_f32(&from_builder(unwindowed));
    let mut s = Session::new(model, linear).with_kv_type(KvType::F32);
    let wide = s.forward_all(&g.tokens).unwrap();
    let apart = worst_relative(&wide, &g.logits);
    eprintln!("without the window: {apart:.2e}");
    assert!(apart > 1e-2, "{apart}");
}

/// Decoding one token at a time, and a tree whose one branch is the sequence, give the batch's
/// logits: the window is applied on every path by position.
#[test]
fn the_window_holds_in_decode_and_tree_passes() {
    let g = tiny_golden();
    let (model, linear) = on_f32(&tiny_gguf());
    let v = model.config().vocab_size;
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&linear)).with_kv_type(KvType::F32);
    let batch = s.forward_all(&g.tokens).unwrap();
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&linear)).with_kv_type(KvType::F32);
    let close = |a: &[f32], b: &[f32], what: &str| {
        let d = a
            .iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(d < 1e-4, "{what}: {d}");
    };
    for (i, &t) in g.tokens.iter().enumerate() {
        let row = s.decode(t).unwrap();
        close(&row, &batch[i * v..(i + 1) * v], &format!("decode at {i}"));
    }
    // Six cached positions, then the rest as a chain-shaped tree.
    let mut s = Session::new(Arc::clone(&model), linear).with_kv_type(KvType::F32);
    s.prefill(&g.tokens[..6]).unwrap();
    let rest = &g.tokens[6..];
    let parents: Vec<Option<usize>> = (0..rest.len()).map(|i| i.checked_sub(1)).collect();
    let tree = s.forward_tree(rest, &parents).unwrap();
    close(&tree, &batch[6 * v..], "tree");
}

/// A gemma3 fixture (2 layers: one local, one global) with `keys` added.
fn with_keys(keys: &[(&str, MetaValue)]) -> Arc<GgufFile> {
    let mut b = builder(&TinySpec::new("gemma3"), None)
        .kv("gemma3.attention.sliding_window", MetaValue::U32(4))
        .kv("gemma3.attention.sliding_window_pattern", MetaValue::U32(2));
    for (k, v) in keys {
        b = b.kv(*k, v.clone());
    }
    from_builder(b)
}

fn refused_key(g: &Arc<GgufFile>) -> String {
    match Model::load(g) {
        Err(ExecError::InvalidMetadata { key, what }) => {
            eprintln!("{key}: {what}");
            key
        }
        Err(e) => panic!("expected InvalidMetadata, got {e}"),
        Ok(_) => panic!("must be refused"),
    }
}

#[test]
fn a_gemma3_fixture_loads_with_every_key_it_reads() {
    let g = with_keys(&[
        ("gemma3.rope.freq_base_swa", MetaValue::F32(20_000.0)),
        ("gemma3.final_logit_softcapping", MetaValue::F32(30.0)),
    ]);
    let m = Model::load(&g).unwrap();
    let c = m.config().gemma3.clone().unwrap();
    assert_eq!(c.local, [true, false]);
    assert_eq!(c.rope_base_local, 20_000.0);
    assert_eq!(c.final_softcap, Some(30.0));
    // Without a window every layer is global, as in llama.cpp.
    let g = from_builder(builder(&TinySpec::new("gemma3"), None));
    let c = Model::load(&g).unwrap().config().gemma3.clone().unwrap();
    assert_eq!((c.window, c.local), (None, vec![false, false]));
}

#[test]
fn a_sliding_window_of_zero_or_beyond_the_context_is_refused_naming_the_key() {
    let context = TinySpec::new("gemma3").context as u32;
    for w in [0, context + 1] {
        let g = from_builder(
            builder(&TinySpec::new("gemma3"), None)
                .kv("gemma3.attention.sliding_window", MetaValue::U32(w)),
        );
        assert_eq!(refused_key(&g), "gemma3.attention.sliding_window", "{w}");
    }
}

#[test]
fn a_layer_pattern_that_does_not_fit_the_layer_count_is_refused_naming_the_key() {
    let spec = TinySpec::new("gemma3");
    let key = "gemma3.attention.sliding_window_pattern";
    let bad = [
        MetaValue::U32(3),
        MetaValue::U32(0),
        MetaValue::Array(vec![MetaValue::Bool(true); 3]),
    ];
    for value in bad {
        let g = from_builder(
            builder(&spec, None)
                .kv("gemma3.attention.sliding_window", MetaValue::U32(4))
                .kv(key, value.clone()),
        );
        assert_eq!(refused_key(&g), key, "{value:?}");
    }
    // A per-layer array of the right length is read as it is.
    let g = from_builder(
        builder(&spec, None)
            .kv("gemma3.attention.sliding_window", MetaValue::U32(4))
            .kv(
                key,
                MetaValue::Array(vec![MetaValue::Bool(false), MetaValue::Bool(true)]),
            ),
    );
    let c = Model::load(&g).unwrap().config().gemma3.clone().unwrap();
    assert_eq!(c.local, [false, true]);
}

#[test]
fn a_missing_norm_tensor_is_refused_naming_it() {
    for name in [
        "blk.1.post_ffw_norm.weight",
        "blk.0.post_attention_norm.weight",
        "blk.0.attn_q_norm.weight",
        "blk.1.attn_k_norm.weight",
    ] {
        let g = from_builder(builder(&TinySpec::new("gemma3"), Some(name)));
        match Model::load(&g) {
            Err(ExecError::MissingTensor { tensor }) => assert_eq!(tensor, name),
            Err(e) => panic!("{name}: expected MissingTensor, got {e}"),
            Ok(_) => panic!("{name}: a missing norm must be refused"),
        }
    }
}

#[test]
fn an_unknown_gemma3_tensor_or_key_is_refused_by_name() {
    // Gemma 2's attention soft-cap (gemma3 has none), and a q bias.
    let g = with_keys(&[("gemma3.attn_logit_softcapping", MetaValue::F32(50.0))]);
    match Model::load(&g) {
        Err(ExecError::Unsupported(ManifestError::UnsupportedKey { key, .. })) => {
            assert_eq!(key, "gemma3.attn_logit_softcapping")
        }
        other => panic!("expected UnsupportedKey, got {:?}", other.err()),
    }
    let spec = TinySpec::new("gemma3");
    let q = (spec.n_head * spec.head_dim()) as u64;
    let b = builder(&spec, None)
        .tensor_f32(
            "blk.0.attn_q.bias",
            &[q],
            ork_gguf::GgmlType::F32,
            &vec![0.0; q as usize],
        )
        .unwrap();
    match Model::load(&from_builder(b)) {
        Err(ExecError::Unsupported(ManifestError::UnsupportedTensor { tensor, .. })) => {
            assert_eq!(tensor, "blk.0.attn_q.bias")
        }
        other => panic!("expected UnsupportedTensor, got {:?}", other.err()),
    }
}

/// The hex SHA-256 of `bytes` (which file a golden was made from).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
