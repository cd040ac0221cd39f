//! Mixture-of-Experts: bad expert metadata and tensors refused naming tensor and key (tiny
//! in-memory fixtures), and the upcycled SmolLM2 with identical experts computing the dense model
//! (fixtures of `ork_testkit::moe`, cached under `.cache/moe/`).
use super::fixtures::{builder, from_builder, TinySpec};
use super::real_model::{f32_linear, model, tokenizer};
use ork_exec::{CpuF32Linear, ExecError, KvType, Linear, Model, Session, WeightSpec};
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile, MetaValue};
use ork_manifest::WeightId;
use ork_testkit::moe::{moe_fixture, MoeFixture};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The fixture's builder with metadata `key` set to `value` (replacing it when present).
fn with_key(spec: &TinySpec, skip: Option<&str>, key: &str, value: Option<u32>) -> GgufBuilder {
    // The builder has no "replace": rebuild through the parsed file.
    let g = from_builder(builder(spec, skip));
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata_iter() {
        if k != key {
            b = b.kv(k, v.clone());
        }
    }
    if let Some(v) = value {
        b = b.kv(key, MetaValue::U32(v));
    }
    for t in g.tensors() {
        b = b.tensor(&t.name, &t.dims, t.ty, g.tensor_data(t).to_vec());
    }
    b
}

fn load(b: GgufBuilder) -> Result<Model, ExecError> {
    Model::load(&from_builder(b))
}

#[track_caller]
fn expect_invalid_key(r: Result<Model, ExecError>, want: &str) {
    match r {
        Err(ExecError::InvalidMetadata { key, .. }) => assert_eq!(key, want),
        Err(e) => panic!("expected InvalidMetadata for {want}, got {e}"),
        Ok(_) => panic!("expected InvalidMetadata for {want}, got a model"),
    }
}

#[track_caller]
fn expect_mismatch(r: Result<Model, ExecError>, want_tensor: &str, want_key: &str) {
    match r {
        Err(ExecError::ExpertMismatch { tensor, key, .. }) => {
            assert_eq!((tensor.as_str(), key.as_str()), (want_tensor, want_key))
        }
        Err(e) => panic!("expected ExpertMismatch for {want_tensor} / {want_key}, got {e}"),
        Ok(_) => panic!("expected ExpertMismatch, got a model"),
    }
}

#[test]
fn expert_counts_of_zero_or_above_the_tensors_are_refused() {
    let spec = TinySpec::new("qwen3moe");
    let count = "qwen3moe.expert_count";
    let used = "qwen3moe.expert_used_count";
    expect_invalid_key(load(with_key(&spec, None, count, Some(0))), count);
    // 4 experts in the tensors, 5 in the key: the router is the first tensor checked.
    expect_mismatch(
        load(with_key(&spec, None, count, Some(5))),
        "blk.0.ffn_gate_inp.weight",
        count,
    );
    expect_invalid_key(load(with_key(&spec, None, used, Some(0))), used);
    expect_invalid_key(load(with_key(&spec, None, used, Some(5))), used);
    match load(with_key(&spec, None, used, None)) {
        Err(ExecError::MissingMetadata { key }) => assert_eq!(key, used),
        Err(e) => panic!("expected MissingMetadata, got {e}"),
        Ok(_) => panic!("expected MissingMetadata"),
    }
    // A llama file whose blocks have routers but whose expert_count is 0: not silently dense.
    let spec = TinySpec::mixtral();
    expect_mismatch(
        load(with_key(&spec, None, "llama.expert_count", Some(0))),
        "blk.0.ffn_gate_inp.weight",
        "llama.expert_count",
    );
}

#[test]
fn expert_tensor_shapes_must_match_the_metadata() {
    let spec = TinySpec::new("qwen3moe");
    // Expert width: the key says 20, the tensors are 16 wide.
    expect_mismatch(
        load(with_key(
            &spec,
            None,
            "qwen3moe.expert_feed_forward_length",
            Some(20),
        )),
        "blk.0.ffn_gate_exps.weight",
        "qwen3moe.expert_feed_forward_length",
    );
    // One expert tensor holds 3 experts instead of 4.
    let bad = "blk.1.ffn_up_exps.weight";
    let b = builder(&spec, Some(bad))
        .tensor_f32(bad, &[32, 16, 3], GgmlType::F32, &vec![0.1; 32 * 16 * 3])
        .unwrap();
    expect_mismatch(load(b), bad, "qwen3moe.expert_count");
    // A down tensor that is not the transpose of gate/up.
    let bad = "blk.0.ffn_down_exps.weight";
    let b = builder(&spec, Some(bad))
        .tensor_f32(bad, &[32, 16, 4], GgmlType::F32, &vec![0.1; 32 * 16 * 4])
        .unwrap();
    match load(b) {
        Err(ExecError::TensorShape { tensor, .. }) => assert_eq!(tensor, bad),
        Err(e) => panic!("expected TensorShape, got {e}"),
        Ok(_) => panic!("expected TensorShape"),
    }
}

#[test]
fn a_router_of_the_wrong_size_is_refused() {
    let spec = TinySpec::new("qwen2moe");
    let bad = "blk.1.ffn_gate_inp.weight";
    let b = builder(&spec, Some(bad))
        .tensor_f32(bad, &[32, 3], GgmlType::F32, &[0.1; 96])
        .unwrap();
    expect_mismatch(load(b), bad, "qwen2moe.expert_count");
    let b = builder(&spec, Some(bad))
        .tensor_f32(bad, &[31, 4], GgmlType::F32, &[0.1; 124])
        .unwrap();
    match load(b) {
        Err(ExecError::TensorShape { tensor, .. }) => assert_eq!(tensor, bad),
        Err(e) => panic!("expected TensorShape, got {e}"),
        Ok(_) => panic!("expected TensorShape"),
    }
}

#[test]
fn qwen2moe_without_its_shared_expert_gate_is_refused() {
    let spec = TinySpec::new("qwen2moe");
    let gate = "blk.0.ffn_gate_inp_shexp.weight";
    match load(builder(&spec, Some(gate))) {
        Err(ExecError::MissingTensor { tensor }) => assert_eq!(tensor, gate),
        Err(e) => panic!("expected MissingTensor, got {e}"),
        Ok(_) => panic!("expected MissingTensor"),
    }
    expect_mismatch(
        load(with_key(
            &spec,
            None,
            "qwen2moe.expert_shared_feed_forward_length",
            Some(20),
        )),
        "blk.0.ffn_gate_shexp.weight",
        "qwen2moe.expert_shared_feed_forward_length",
    );
}

#[test]
fn moe_models_list_router_and_expert_slices_as_matmul_weights() {
    let g = from_builder(builder(&TinySpec::new("qwen2moe"), None));
    let m = Model::load(&g).unwrap();
    let names: Vec<&str> = m.matmul_weights()[4..11]
        .iter()
        .map(|w| w.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "blk.0.ffn_gate_inp.weight",
            "blk.0.ffn_gate_shexp.weight",
            "blk.0.ffn_up_shexp.weight",
            "blk.0.ffn_down_shexp.weight",
            "blk.0.ffn_gate_exps.weight#0",
            "blk.0.ffn_up_exps.weight#0",
            "blk.0.ffn_down_exps.weight#0",
        ]
    );
    let c = m.config().moe.clone().unwrap();
    assert_eq!((c.n_expert, c.n_expert_used, c.n_ff_exp), (4, 2, 16));
    assert_eq!((c.n_ff_shexp, c.renormalize), (Some(24), false));
    // The same names and order as the manifest's execution order (attention, router, shared,
    // experts), so the residency layer's plan matches what the executor asks for.
    let manifest = ork_manifest::Manifest::from_gguf(&g).unwrap();
    let plan: Vec<&str> = manifest.execution_order().map(|w| w.key.as_str()).collect();
    let exec: Vec<&str> = m.matmul_weights().iter().map(|w| w.name.as_str()).collect();
    assert_eq!(plan, exec);
}

/// Non-expert weights dequantized once; each expert slice dequantized when it is used (the
/// upcycled model's 240 experts would take 2.5 GB as f32).
pub struct LazyExperts {
    gguf: Arc<GgufFile>,
    resident: CpuF32Linear,
    experts: HashMap<WeightId, WeightSpec>,
}

impl LazyExperts {
    pub fn new(gguf: &Arc<GgufFile>, model: &Model) -> LazyExperts {
        let (experts, resident): (Vec<_>, Vec<_>) = model
            .matmul_weights()
            .iter()
            .cloned()
            .partition(|w| w.name.contains('#'));
        LazyExperts {
            gguf: Arc::clone(gguf),
            resident: CpuF32Linear::from_gguf(gguf, &resident).unwrap(),
            experts: experts.into_iter().map(|w| (w.id, w)).collect(),
        }
    }
}

impl Linear for LazyExperts {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        match self.experts.get(&id) {
            Some(spec) => {
                CpuF32Linear::from_gguf(&self.gguf, std::slice::from_ref(spec))?.matmul(id, x, m, y)
            }
            None => self.resident.matmul(id, x, m, y),
        }
    }
}

/// A fixture's model and lazy f32 linear.
type Opened = (Arc<Model>, Arc<dyn Linear>);

/// A fixture's model and lazy f32 linear, opened once per test binary.
pub fn fixture(kind: MoeFixture) -> Opened {
    static OPEN: OnceLock<std::sync::Mutex<HashMap<MoeFixture, Opened>>> = OnceLock::new();
    let mut map = OPEN.get_or_init(Default::default).lock().unwrap();
    map.entry(kind)
        .or_insert_with(|| {
            let g = Arc::new(GgufFile::open(&moe_fixture(kind)).expect("open MoE fixture"));
            let m = Arc::new(Model::load(&g).expect("load MoE fixture"));
            let lin: Arc<dyn Linear> = Arc::new(LazyExperts::new(&g, &m));
            (m, lin)
        })
        .clone()
}

#[test]
fn identical_experts_compute_the_dense_model() {
    let (moe, lin) = fixture(MoeFixture::Identical);
    let c = moe.config().moe.clone().unwrap();
    assert_eq!((c.n_expert, c.n_expert_used, c.renormalize), (8, 2, true));
    let tok = tokenizer();
    let prompt = tok.encode("The capital of France is", true, false).unwrap();
    // Both in f32 throughout: an f16 cache would round their last-bit differences apart.
    let dense_logits = Session::new(Arc::clone(model()), Arc::clone(f32_linear()))
        .with_kv_type(KvType::F32)
        .forward_all(&prompt)
        .unwrap();
    let moe_logits = Session::new(Arc::clone(&moe), Arc::clone(&lin))
        .with_kv_type(KvType::F32)
        .forward_all(&prompt)
        .unwrap();
    let worst = dense_logits
        .iter()
        .zip(&moe_logits)
        .fold(0f32, |w, (a, b)| w.max((a - b).abs()));
    eprintln!("identical experts: worst logit difference to dense {worst:e}");
    assert!(
        worst < 1e-3,
        "logits differ from the dense model by {worst}"
    );

    // Greedy continuation, token by token through decode (M = 1), equals the dense one.
    let greedy = |m: &Arc<Model>, l: &Arc<dyn Linear>| {
        let mut s = Session::new(Arc::clone(m), Arc::clone(l));
        let mut logits = s.prefill(&prompt).unwrap();
        let mut out = Vec::new();
        for _ in 0..6 {
            let t = ork_exec::ops::argmax(&logits).unwrap() as u32;
            out.push(t);
            logits = s.decode(t).unwrap();
        }
        out
    };
    let dense = greedy(model(), f32_linear());
    let got = greedy(&moe, &lin);
    assert_eq!(got, dense);
    let text = tok.decode(&got, false).unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
}

/// Records the announcements a linear receives, in order with the matmuls.
struct Recording {
    inner: CpuF32Linear,
    manifest: Arc<ork_manifest::Manifest>,
    log: std::sync::Mutex<Vec<String>>,
}

impl Recording {
    fn key(&self, id: WeightId) -> &str {
        &self.manifest.get(id).key
    }
}

impl Linear for Recording {
    fn matmul(&self, id: WeightId, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let name = self.key(id);
        self.log.lock().unwrap().push(format!("matmul {name}"));
        self.inner.matmul(id, x, m, y)
    }
    fn upcoming(&self, weights: &[WeightId]) {
        let names: Vec<&str> = weights.iter().map(|&w| self.key(w)).collect();
        self.log
            .lock()
            .unwrap()
            .push(format!("upcoming {}", names.join(" ")));
    }
}

#[test]
fn speculative_expert_prefetch_announces_the_next_block_and_never_changes_results() {
    let spec = TinySpec {
        n_layer: 4,
        ..TinySpec::new("qwen3moe")
    };
    let g = from_builder(builder(&spec, None));
    let tokens = [3u32, 17, 5, 39, 0, 22];
    let run = |extra: Option<usize>| {
        let model = Arc::new(Model::load(&g).unwrap());
        model.set_expert_speculation(extra);
        let rec = Arc::new(Recording {
            inner: CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap(),
            manifest: Arc::clone(model.manifest()),
            log: Default::default(),
        });
        let mut s = Session::new(Arc::clone(&model), rec.clone() as Arc<dyn Linear>);
        let mut logits = vec![s.prefill(&tokens[..2]).unwrap()];
        for &t in &tokens[2..] {
            logits.push(s.decode(t).unwrap());
        }
        let log = rec.log.lock().unwrap().clone();
        (logits, model.moe_stats().unwrap(), log)
    };
    let (on, stats, log) = run(Some(1));
    let (off, off_stats, off_log) = run(None);
    assert_eq!(on, off, "speculation is a hint only");
    assert_eq!(
        (
            off_stats.predicted_steps,
            off_stats.predictions,
            off_stats.used
        ),
        (0, 0, 0)
    );
    // Every block forward counted (4 blocks × one prefill of 2 rows and 4 decodes), with the
    // experts it ran: k = 2 per decode, the union of 2 rows' (2 to 4) in the prefill.
    assert_eq!((off_stats.forwards, off_stats.rows), (4 * 5, 4 * 6));
    assert!((4 * (2 + 4 * 2)..=4 * (4 + 4 * 2)).contains(&off_stats.experts_run));
    assert_eq!(
        (stats.forwards, stats.rows, stats.experts_run),
        (off_stats.forwards, off_stats.rows, off_stats.experts_run)
    );
    // 4 decode steps; blocks 1..3 are predicted by the block before: 3 experts each.
    assert_eq!(stats.predicted_steps, 4 * 3);
    assert_eq!(stats.predictions, 4 * 3 * 3);
    assert_eq!(stats.used, 4 * 3 * 2);
    let recall = stats.recall().unwrap();
    assert!((0.0..=1.0).contains(&recall));
    // In decode, block 0's announcement ends with block 1's predicted experts (3 × gate/up/down),
    // and comes before block 1's router runs.
    let first_decode = log
        .iter()
        .position(|l| l.starts_with("matmul blk.0.attn_q"))
        .and_then(|p0| {
            log[p0 + 1..]
                .iter()
                .position(|l| l.starts_with("matmul blk.0.attn_q"))
                .map(|p| p0 + 1 + p)
        })
        .unwrap();
    let step = &log[first_decode..];
    let ann = step
        .iter()
        .position(|l| l.starts_with("upcoming "))
        .unwrap();
    let names: Vec<&str> = step[ann]["upcoming ".len()..].split(' ').collect();
    assert_eq!(names.len(), 2 * 3 + 3 * 3, "{names:?}");
    assert!(names[6..].iter().all(|n| n.starts_with("blk.1.ffn_")));
    // The prediction is block 1's router applied early (right after block 0's, before the
    // announcement); block 1's router runs again for real after it.
    let router1: Vec<usize> = step
        .iter()
        .enumerate()
        .filter(|(_, l)| *l == "matmul blk.1.ffn_gate_inp.weight")
        .map(|(i, _)| i)
        .collect();
    assert!(router1[0] < ann && ann < router1[1], "{router1:?} {ann}");
    // Without speculation, announcements name only the block's own experts.
    assert!(off_log
        .iter()
        .filter(|l| l.starts_with("upcoming "))
        .all(|l| l.split(' ').skip(1).all(|n| {
            let block = &n[..n.find(".ffn").unwrap()];
            l.split(' ').nth(1).unwrap().starts_with(block)
        })));
}
