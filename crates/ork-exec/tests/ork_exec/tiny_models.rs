//! The forward pass on tiny random-weight fixtures against the naive reference, and the error
//! paths.
use super::fixtures::{build, builder, from_builder, TinySpec};
use super::reference::Reference;
use ork_exec::{
    generate, perplexity, CpuF32Linear, CpuW8A8Linear, ExecError, GenerateOptions, KvType, Linear,
    Model, Sampler, Session,
};
use ork_manifest::WeightId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const TOKENS: [u32; 9] = [3, 17, 5, 39, 0, 22, 22, 8, 31];

fn specs() -> Vec<TinySpec> {
    let mut tied_q8 = TinySpec::new("llama");
    tied_q8.tied = true;
    tied_q8.embd_q8 = true;
    tied_q8.seed = 99;
    vec![
        TinySpec::new("llama"),
        tied_q8,
        TinySpec::new("qwen2"),
        TinySpec::new("qwen3"),
        TinySpec::mixtral(),
        TinySpec::new("qwen2moe"),
        TinySpec::new("qwen3moe"),
    ]
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: logit {i}: got {a}, want {b}"
        );
    }
}

#[test]
fn forward_matches_naive_reference_for_each_arch() {
    for spec in specs() {
        let g = build(&spec);
        let model = Arc::new(Model::load(&g).unwrap());
        let lin: Arc<dyn Linear> =
            Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
        let want = Reference::new(&g).all_logits(&TOKENS);
        // The reference computes in f32 throughout; so does this session's cache.
        let got = Session::new(Arc::clone(&model), Arc::clone(&lin))
            .with_kv_type(KvType::F32)
            .forward_all(&TOKENS)
            .unwrap();
        let v = spec.vocab;
        // The logits must be informative, not all alike, or the comparison proves little.
        let spread = want[0].iter().cloned().fold(f32::MIN, f32::max)
            - want[0].iter().cloned().fold(f32::MAX, f32::min);
        assert!(spread > 1.0, "{}: degenerate fixture", spec.arch);
        for (i, w) in want.iter().enumerate() {
            assert_close(
                &got[i * v..(i + 1) * v],
                w,
                2e-4,
                &format!("{} tied={} pos {i}", spec.arch, spec.tied),
            );
        }
    }
}

#[test]
fn prefill_then_decode_equals_full_recompute() {
    for spec in specs() {
        let g = build(&spec);
        let model = Arc::new(Model::load(&g).unwrap());
        let lin: Arc<dyn Linear> =
            Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
        let v = spec.vocab;
        let full = Session::new(Arc::clone(&model), Arc::clone(&lin))
            .forward_all(&TOKENS)
            .unwrap();

        let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
        let last = s.prefill(&TOKENS[..4]).unwrap();
        assert_close(&last, &full[3 * v..4 * v], 1e-5, "prefill last row");
        for (i, &t) in TOKENS.iter().enumerate().skip(4) {
            let l = s.decode(t).unwrap();
            assert_close(
                &l,
                &full[i * v..(i + 1) * v],
                1e-5,
                &format!("{} decode pos {i}", spec.arch),
            );
        }
        assert_eq!(s.position(), TOKENS.len());

        // Two prefills in a row (a second turn) also continue the same sequence.
        let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
        s.prefill(&TOKENS[..5]).unwrap();
        let rest = s.forward_all(&TOKENS[5..]).unwrap();
        assert_close(&rest, &full[5 * v..], 1e-5, "second batch");
    }
}

#[test]
fn w8a8_is_close_to_f32_on_fixture() {
    let spec = TinySpec::new("qwen2");
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let f: Arc<dyn Linear> = Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let q: Arc<dyn Linear> =
        Arc::new(CpuW8A8Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let a = Session::new(Arc::clone(&model), Arc::clone(&f))
        .forward_all(&TOKENS)
        .unwrap();
    let b = Session::new(Arc::clone(&model), Arc::clone(&q))
        .forward_all(&TOKENS)
        .unwrap();
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(err > 0.0, "w8a8 must actually quantize");
    assert!(
        err < 0.05 * scale,
        "w8a8 error {err} vs logit scale {scale}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let mut spec = TinySpec::new("llama");
    spec.arch = "mamba";
    let g = build(&spec);
    match Model::load(&g) {
        Err(ExecError::UnsupportedArchitecture { arch }) => assert_eq!(arch, "mamba"),
        Err(e) => panic!("expected UnsupportedArchitecture, got {e}"),
        Ok(_) => panic!("expected UnsupportedArchitecture, got a model"),
    }
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let spec = TinySpec::new("qwen2");
    let g = from_builder(builder(&spec, Some("blk.1.ffn_up.weight")));
    match Model::load(&g) {
        Err(ExecError::MissingTensor { tensor }) => assert_eq!(tensor, "blk.1.ffn_up.weight"),
        Err(e) => panic!("expected MissingTensor, got {e}"),
        Ok(_) => panic!("expected MissingTensor"),
    }
    let g = from_builder(builder(&spec, Some("blk.0.attn_k.bias")));
    assert!(
        matches!(Model::load(&g), Err(ExecError::MissingTensor { tensor }) if tensor == "blk.0.attn_k.bias")
    );

    let b = builder(&spec, Some("blk.0.ffn_norm.weight"))
        .tensor_f32(
            "blk.0.ffn_norm.weight",
            &[31],
            ork_gguf::GgmlType::F32,
            &[1.0; 31],
        )
        .unwrap();
    match Model::load(&from_builder(b)) {
        Err(ExecError::TensorShape {
            tensor,
            expected,
            found,
        }) => {
            assert_eq!(tensor, "blk.0.ffn_norm.weight");
            assert_eq!((expected, found), (vec![32], vec![31]));
        }
        Err(e) => panic!("expected TensorShape, got {e}"),
        Ok(_) => panic!("expected TensorShape"),
    }
}

#[test]
fn context_limit_empty_prompt_and_bad_tokens_are_errors() {
    let spec = TinySpec::new("llama");
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());

    let mut s = Session::with_context(Arc::clone(&model), Arc::clone(&lin), 8).unwrap();
    assert!(matches!(
        s.prefill(&TOKENS),
        Err(ExecError::ContextOverflow {
            needed: 9,
            context: 8
        })
    ));
    assert_eq!(s.position(), 0);
    s.prefill(&TOKENS[..7]).unwrap();
    s.decode(1).unwrap();
    assert!(matches!(
        s.decode(1),
        Err(ExecError::ContextOverflow {
            needed: 9,
            context: 8
        })
    ));

    // Trained context of the fixture is 32: prompt + n beyond it fails before any work.
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
    let opts = GenerateOptions {
        max_tokens: 30,
        stop_tokens: vec![],
    };
    let r = generate(&mut s, &TOKENS[..3], &opts, &mut Sampler::greedy(), |_| {
        Ok(())
    });
    assert!(matches!(
        r,
        Err(ExecError::ContextOverflow {
            needed: 33,
            context: 32
        })
    ));
    assert_eq!(s.position(), 0);

    let r = generate(&mut s, &[], &opts, &mut Sampler::greedy(), |_| Ok(()));
    assert!(matches!(r, Err(ExecError::EmptyPrompt)));
    assert!(matches!(s.prefill(&[]), Err(ExecError::EmptyPrompt)));
    assert!(matches!(
        s.prefill(&[1, 40]),
        Err(ExecError::TokenOutOfRange {
            token: 40,
            vocab: 40
        })
    ));
    assert_eq!(s.position(), 0);
    assert!(matches!(
        Session::with_context(Arc::clone(&model), Arc::clone(&lin), 0),
        Err(ExecError::InvalidContext { .. })
    ));
}

#[test]
fn generation_stops_at_stop_token_or_length() {
    let spec = TinySpec::new("qwen3");
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let opts = GenerateOptions {
        max_tokens: 6,
        stop_tokens: vec![],
    };
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
    let mut seen = Vec::new();
    let out = generate(&mut s, &TOKENS[..3], &opts, &mut Sampler::greedy(), |t| {
        seen.push(t);
        Ok(())
    })
    .unwrap();
    assert_eq!(out.tokens.len(), 6);
    assert_eq!(seen, out.tokens);
    assert_eq!(out.stop, ork_exec::StopReason::MaxTokens);
    // The last token is returned but never evaluated.
    assert_eq!(s.position(), 3 + 5);

    // Greedy tokens are the argmax of the reference logits, step by step.
    let r = Reference::new(&g);
    let mut seq = TOKENS[..3].to_vec();
    for &t in &out.tokens {
        let l = r.last_logits(&seq);
        let best = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        assert_eq!(t, best);
        seq.push(t);
    }

    // Stopping on the third generated token.
    let stop = out.tokens[2];
    let opts = GenerateOptions {
        max_tokens: 6,
        stop_tokens: vec![stop],
    };
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
    let out2 = generate(&mut s, &TOKENS[..3], &opts, &mut Sampler::greedy(), |_| {
        Ok(())
    })
    .unwrap();
    let first_stop = out.tokens.iter().position(|&t| t == stop).unwrap();
    assert_eq!(out2.tokens, out.tokens[..first_stop]);
    assert_eq!(out2.stop, ork_exec::StopReason::EndOfGeneration(stop));
}

/// A backend that fails on one weight while armed.
struct FailOn {
    inner: Arc<dyn Linear>,
    weight: &'static str,
    id: WeightId,
    armed: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
#[error("device lost")]
struct DeviceLost;

impl Linear for FailOn {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        if id == self.id && self.armed.load(Ordering::Relaxed) {
            return Err(ExecError::Backend {
                weight: self.weight.to_owned(),
                source: Box::new(DeviceLost),
            });
        }
        self.inner.matmul(id, x, m, y)
    }
}

#[test]
fn backend_failure_leaves_the_cache_consistent() {
    let spec = TinySpec::new("llama");
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let failing = Arc::new(FailOn {
        inner: Arc::clone(&lin),
        weight: "blk.1.ffn_down.weight",
        id: model.manifest().id("blk.1.ffn_down.weight").unwrap(),
        armed: AtomicBool::new(true),
    });
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&failing) as Arc<dyn Linear>);
    match s.prefill(&TOKENS[..4]) {
        Err(ExecError::Backend { weight, .. }) => assert_eq!(weight, "blk.1.ffn_down.weight"),
        other => panic!("expected Backend error, got {other:?}"),
    }
    assert_eq!(s.position(), 0);

    // A failed decode is as if it had not been attempted: the session continues exactly.
    let mut good = Session::new(Arc::clone(&model), Arc::clone(&lin));
    good.prefill(&TOKENS[..4]).unwrap();
    let want = good.decode(TOKENS[4]).unwrap();
    failing.armed.store(false, Ordering::Relaxed);
    s.prefill(&TOKENS[..4]).unwrap();
    failing.armed.store(true, Ordering::Relaxed);
    assert!(matches!(
        s.decode(TOKENS[4]),
        Err(ExecError::Backend { .. })
    ));
    assert_eq!(s.position(), 4);
    failing.armed.store(false, Ordering::Relaxed);
    assert_eq!(s.decode(TOKENS[4]).unwrap(), want);
}

#[test]
fn perplexity_follows_llama_cpp_protocol() {
    let spec = TinySpec::new("qwen2");
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let tokens: Vec<u32> = (0..21u32).map(|i| (i * 7 + 3) % 40).collect();
    let (n_ctx, bos) = (8usize, 1u32);
    let report = perplexity(&model, &lin, &tokens, n_ctx, Some(bos), KvType::F32).unwrap();
    assert_eq!((report.chunks, report.scored), (2, 2 * 3));

    // Expected: per chunk, BOS replaces the first token; positions 4..=6 predict 5..=7.
    let r = Reference::new(&g);
    let mut nll = Vec::new();
    for c in 0..2 {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        chunk[0] = bos;
        let logits = r.all_logits(&chunk);
        for p in n_ctx / 2..n_ctx - 1 {
            let l: Vec<f64> = logits[p].iter().map(|&v| f64::from(v)).collect();
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + l.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            nll.push(lse - l[chunk[p + 1] as usize]);
        }
    }
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    assert!(
        (report.mean_nll - mean).abs() < 1e-4,
        "{} vs {mean}",
        report.mean_nll
    );
    assert!((report.ppl - mean.exp()).abs() < 1e-3 * mean.exp());
    let first = (nll[..3].iter().sum::<f64>() / 3.0).exp();
    assert!((report.running[0] - first).abs() < 1e-3 * first);

    assert!(matches!(
        perplexity(&model, &lin, &tokens[..n_ctx - 1], n_ctx, None, KvType::F16),
        Err(ExecError::NotEnoughTokens {
            needed: 8,
            got: 7,
            ..
        })
    ));
}

#[test]
fn rope_scaling_is_read_or_refused() {
    use ork_gguf::MetaValue;
    let spec = TinySpec::new("llama");
    let g = from_builder(
        builder(&spec, None)
            .kv(
                "llama.rope.scaling.type",
                MetaValue::String("linear".into()),
            )
            .kv("llama.rope.scaling.factor", MetaValue::F32(4.0)),
    );
    assert_eq!(Model::load(&g).unwrap().config().rope_freq_scale, 0.25);
    let g = from_builder(
        builder(&spec, None).kv("llama.rope.scaling.type", MetaValue::String("yarn".into())),
    );
    match Model::load(&g) {
        Err(ExecError::InvalidMetadata { key, .. }) => assert_eq!(key, "llama.rope.scaling.type"),
        Err(e) => panic!("expected InvalidMetadata, got {e}"),
        Ok(_) => panic!("yarn scaling must be refused, not ignored"),
    }
}

#[test]
fn an_absurd_block_count_is_refused_before_allocating() {
    let spec = TinySpec::new("llama");
    let mut bytes = builder(&spec, None).to_bytes().unwrap();
    // Patch the u32 value of `llama.block_count` (key, then type id 4 = u32, then the value).
    let key = b"llama.block_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("key present")
        + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes());
    bytes[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let g = std::sync::Arc::new(ork_gguf::GgufFile::from_bytes("absurd.gguf", bytes).unwrap());
    match Model::load(&g) {
        Err(ExecError::InvalidMetadata { key, .. }) => assert_eq!(key, "llama.block_count"),
        Err(e) => panic!("expected InvalidMetadata, got {e}"),
        Ok(_) => panic!("4294967295 blocks must be refused"),
    }
}

/// A value too large for the f16 KV cache is a clear error naming the layer, the cache is left
/// as it was, and an f32 cache holds the same model's values.
#[test]
fn a_value_beyond_f16_is_refused_and_an_f32_cache_holds_it() {
    let spec = TinySpec::new("llama");
    let (d, kv_dim) = (spec.n_embd, spec.n_head_kv * spec.head_dim());
    // Layer 1's values: every weight 1e7, so each value is 1e7 times a sum of normalized inputs.
    let b = builder(&spec, Some("blk.1.attn_v.weight"))
        .tensor_f32(
            "blk.1.attn_v.weight",
            &[d as u64, kv_dim as u64],
            ork_gguf::GgmlType::F32,
            &vec![1e7; d * kv_dim],
        )
        .unwrap();
    let g = from_builder(b);
    let model = Arc::new(Model::load(&g).unwrap());
    let lin: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    let mut s = Session::new(Arc::clone(&model), Arc::clone(&lin));
    assert_eq!(s.kv_type(), KvType::F16);
    match s.prefill(&TOKENS) {
        Err(
            e @ ExecError::KvRange {
                layer: 1,
                what: "value",
                value,
            },
        ) => {
            assert!(value.abs() >= 65520.0 && value.is_finite(), "{value}");
            let msg = e.to_string();
            assert!(
                msg.contains("layer 1") && msg.contains("--kv-cache f32"),
                "{msg}"
            );
        }
        other => panic!("expected KvRange, got {:?}", other.map(|l| l.len())),
    }
    assert_eq!(
        (s.position(), s.kv_bytes()),
        (0, 0),
        "the cache is rolled back"
    );
    let mut s = Session::new(model, lin).with_kv_type(KvType::F32);
    let logits = s.prefill(&TOKENS).unwrap();
    assert_eq!(s.position(), TOKENS.len());
    assert_eq!(s.kv_bytes(), TOKENS.len() * spec.n_layer * 2 * kv_dim * 4);
    assert!(logits.iter().all(|x| x.is_finite()));
}
