//! RoPE frequency factors (Llama 3.x `rope_freqs`, Phi-3/Phi-4-mini LongRoPE) and the phi3
//! architecture against llama.cpp (scripts/rope_golden.py, F32 weights and KV cache): every
//! logit of every position within 1e-3 relative, through each session path (one batch, prefill
//! then decode, a token tree, a batched step). docs/models.md has the figures.
use ork_exec::{CpuF32Linear, KvType, Linear, Model, Session};
use ork_gguf::GgufFile;
use ork_testkit::rope::{builder, RopeFixture};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(serde::Deserialize)]
struct Golden {
    tokens: Vec<u32>,
    cases: HashMap<String, Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    file: String,
    size: u64,
    n_ctx: usize,
    logits: Vec<Vec<f32>>,
}

/// Relative tolerance: `|ork − llama.cpp| ≤ TOL · max(1, |llama.cpp|)`.
const TOL: f32 = 1e-3;

fn golden() -> Golden {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/rope_logits.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("JSON")
}

/// The fixture as written for the golden, less the tensors `skip`.
fn load(kind: RopeFixture, skip: &[&str]) -> (Arc<Model>, Arc<dyn Linear>, u64) {
    let bytes = builder(kind, skip, &[]).to_bytes().expect("fixture bytes");
    let size = bytes.len() as u64;
    let g = Arc::new(GgufFile::from_bytes(kind.file_name(), bytes).expect("fixture parses"));
    let model = Arc::new(Model::load(&g).unwrap_or_else(|e| panic!("{}: {e}", kind.name())));
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    (model, lin, size)
}

/// The worst `|a − b| / max(1, |b|)` over the rows.
fn worst(got: &[f32], want: &[Vec<f32>]) -> f32 {
    let v = want[0].len();
    assert_eq!(got.len(), want.len() * v, "logit count");
    want.iter()
        .flatten()
        .zip(got)
        .map(|(b, a)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0, f32::max)
}

fn session(model: &Arc<Model>, lin: &Arc<dyn Linear>, n_ctx: usize) -> Session {
    Session::with_context(Arc::clone(model), Arc::clone(lin), n_ctx)
        .unwrap()
        .with_kv_type(KvType::F32)
}

/// Every session path of `kind` against llama.cpp's logits of `case`.
fn check(kind: RopeFixture, case: &str) {
    let g = golden();
    let c = &g.cases[case];
    let (model, lin, size) = load(kind, &[]);
    assert_eq!(
        (c.file.as_str(), c.size),
        (kind.file_name(), size),
        "{case}: fixture changed since scripts/rope_golden.py ran"
    );
    let v = model.config().vocab_size;
    let t = &g.tokens;

    // One batch from position 0, as the golden was made.
    let all = session(&model, &lin, c.n_ctx).forward_all(t).unwrap();
    let batch = worst(&all, &c.logits);

    // Prefill half, then decode one token at a time.
    let half = t.len() / 2;
    let mut s = session(&model, &lin, c.n_ctx);
    let mut rows = s.prefill(&t[..half]).unwrap();
    for &tok in &t[half..] {
        rows.extend(s.decode(tok).unwrap());
    }
    let decode = worst(&rows, &c.logits[half - 1..]);

    // The rest as a token tree (a chain: each node the child of the one before), as
    // speculative verification runs it.
    let mut s = session(&model, &lin, c.n_ctx);
    s.prefill(&t[..half]).unwrap();
    let parents: Vec<Option<usize>> = (0..t.len() - half).map(|i| i.checked_sub(1)).collect();
    let tree = s.forward_tree(&t[half..], &parents).unwrap();
    let tree = worst(&tree, &c.logits[half..]);

    // A batched step of two sessions at different positions.
    let (mut a, mut b) = (
        session(&model, &lin, c.n_ctx),
        session(&model, &lin, c.n_ctx),
    );
    a.prefill(&t[..3]).unwrap();
    let out = Session::step(&mut [
        ork_exec::BatchPart {
            session: &mut a,
            tokens: &t[3..9],
            logits: ork_exec::Logits::Last,
            phase: ork_exec::Phase::Prefill,
        },
        ork_exec::BatchPart {
            session: &mut b,
            tokens: &t[..5],
            logits: ork_exec::Logits::Last,
            phase: ork_exec::Phase::Prefill,
        },
    ])
    .unwrap();
    let step = worst(&out[0].clone().unwrap(), &c.logits[8..9])
        .max(worst(&out[1].clone().unwrap(), &c.logits[4..5]));

    eprintln!(
        "{case}: worst relative logit difference from llama.cpp over {} positions × {v}: batch \
         {batch:.2e}, decode {decode:.2e}, tree {tree:.2e}, step {step:.2e}",
        t.len()
    );
    for (path, w) in [
        ("batch", batch),
        ("decode", decode),
        ("tree", tree),
        ("step", step),
    ] {
        assert!(w <= TOL, "{case} {path}: logits differ by {w} relative");
    }
}

#[test]
fn llama_rope_frequency_factors_match_llama_cpp() {
    check(RopeFixture::LlamaRopeFreqs, "llama-rope-freqs");
}

#[test]
fn llama_rope_frequency_factors_matter() {
    // Without the factors the same weights give logits far outside the tolerance: the test
    // above could not pass if ork ignored them.
    let g = golden();
    let c = &g.cases["llama-rope-freqs"];
    let (model, lin, _) = load(RopeFixture::LlamaRopeFreqs, &["rope_freqs.weight"]);
    let all = session(&model, &lin, c.n_ctx)
        .forward_all(&g.tokens)
        .unwrap();
    // Position 0 does not rotate; every later one does.
    let later = worst(&all[model.config().vocab_size..], &c.logits[1..]);
    eprintln!("llama-rope-freqs without its factors: worst relative difference {later:.3}");
    assert!(later > 100.0 * TOL, "the factors barely matter: {later}");
}

#[test]
fn phi3_matches_llama_cpp() {
    check(RopeFixture::Phi3, "phi3");
}

#[test]
fn phi3_longrope_short_and_long_factors_match_llama_cpp() {
    check(RopeFixture::Phi3LongRope, "phi3-longrope-short");
    check(RopeFixture::Phi3LongRope, "phi3-longrope-long");
    // The two factor sets give different results, so each check tests its own set.
    let g = golden();
    let (short, long) = (
        &g.cases["phi3-longrope-short"].logits,
        &g.cases["phi3-longrope-long"].logits,
    );
    let flat: Vec<f32> = long.iter().flatten().copied().collect();
    assert!(worst(&flat, short) > 100.0 * TOL);
}

#[test]
fn phi3_smoothing_folds_into_the_fused_weights_exactly() {
    // Norm-side factors on the fused q/k/v and gate-up columns; v → o and up → down are not
    // applied to fused weights (docs/models.md, "phi3"). The smoothed model computes the same
    // logits up to f32 rounding.
    let g = golden();
    let bytes = builder(RopeFixture::Phi3, &[], &[]).to_bytes().unwrap();
    let file = Arc::new(GgufFile::from_bytes("phi3.gguf", bytes).unwrap());
    let model = Arc::new(Model::load(&file).unwrap());
    let reference = Arc::new(CpuF32Linear::from_gguf(&file, model.matmul_weights()).unwrap());
    let s = ork_exec::smoothing_factors(
        &model,
        &reference,
        &g.tokens,
        256,
        0.5,
        ork_exec::SmoothTargets::ALL,
    )
    .unwrap();
    assert!(s
        .iter()
        .all(|b| b.ffn.is_some() && b.vo.is_none() && b.down.is_none()));
    assert!(s[0].attn.iter().any(|&f| !(0.8..=1.25).contains(&f)));
    let smoothed = Arc::new(ork_exec::smoothed_gguf(&file, &model, &s, "smoothed").unwrap());
    let smoothed_model = Arc::new(Model::load(&smoothed).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&smoothed, smoothed_model.matmul_weights()).unwrap());
    let got = session(&smoothed_model, &lin, 256)
        .forward_all(&g.tokens)
        .unwrap();
    let w = worst(&got, &g.cases["phi3"].logits);
    eprintln!("phi3 smoothed: worst relative difference from llama.cpp {w:.2e}");
    assert!(w <= TOL, "{w}");
}

#[test]
fn longrope_sessions_share_cached_positions_only_under_the_same_factors() {
    // A prefix cached under the short factors is not valid for a session using the long ones.
    let (model, lin, _) = load(RopeFixture::Phi3LongRope, &[]);
    let (a, b, c) = (
        session(&model, &lin, 256),
        session(&model, &lin, 512),
        session(&model, &lin, 1024),
    );
    assert!(a.same_numbers(&b));
    assert!(!a.same_numbers(&c));
    let (model, lin, _) = load(RopeFixture::Phi3, &[]);
    assert!(session(&model, &lin, 256).same_numbers(&session(&model, &lin, 1024)));
}
