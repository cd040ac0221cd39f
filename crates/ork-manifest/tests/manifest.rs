//! The weight manifest: the real model's 211 weights in order, a synthetic MoE file's per-expert
//! slices, and bad shapes as errors naming the tensor.

use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile, MetaValue};
use ork_manifest::{classify, tensor_name, Manifest, ManifestError, Role, WeightId, WeightNames};

/// The real model (a missing file is a test failure).
fn real_model() -> GgufFile {
    GgufFile::open(&ork_testkit::model_path()).unwrap()
}

#[test]
fn smollm2_has_211_weights_in_order() {
    let g = real_model();
    let m = Manifest::from_gguf(&g).unwrap();
    assert_eq!(m.arch(), Some("llama"));
    assert_eq!((m.n_layer(), m.n_expert()), (30, 0));
    let w = m.weights();
    assert_eq!(w.len(), 211);
    assert_eq!(w[0].key, "token_embd.weight");
    assert_eq!(w[0].role, Role::TokenEmbd);
    let roles = [
        Role::AttnQ,
        Role::AttnK,
        Role::AttnV,
        Role::AttnOutput,
        Role::FfnGate,
        Role::FfnUp,
        Role::FfnDown,
    ];
    for (i, w) in w[1..].iter().enumerate() {
        assert_eq!(w.id.index(), i + 1);
        assert_eq!(w.layer, Some((i / 7) as u32));
        assert_eq!(w.role, roles[i % 7]);
        assert_eq!(Some(w.key.clone()), tensor_name(w.role, i / 7));
        assert_eq!(w.expert, None);
        assert_eq!(w.slice, *g.tensor(&w.key).unwrap());
    }
    assert_eq!((w[1].k, w[1].n), (576, 576));
    assert_eq!((w[7].k, w[7].n), (1536, 576)); // ffn_down
    assert_eq!((w[0].k, w[0].n), (576, 49152));
    // Forward pass: the blocks, then the tied embedding as the output projection.
    let exec: Vec<&str> = m.execution_order().map(|w| w.key.as_str()).collect();
    assert_eq!(exec.len(), 211);
    assert_eq!(exec[0], "blk.0.attn_q.weight");
    assert_eq!(exec[209], "blk.29.ffn_down.weight");
    assert_eq!(exec[210], "token_embd.weight");
    assert_eq!(m.output().map(WeightId::index), Some(0));
    assert_eq!(
        m.find(Role::FfnUp, Some(29), None).map(|id| &m.get(id).key),
        Some(&"blk.29.ffn_up.weight".to_owned())
    );
    assert_eq!(
        m.id("blk.3.attn_v.weight").map(WeightId::index),
        Some(1 + 3 * 7 + 2)
    );
}

const EMBD: u64 = 32;
const FF: u64 = 64;
const EXPERTS: u64 = 4;

/// A tiny llama-arch MoE file (2 blocks, 4 experts of distinct values) in F32; `tweak` edits the
/// builder's tensors before writing.
fn moe_file(tweak: impl Fn(&str, Vec<u64>) -> Vec<u64>, expert_count: u64) -> GgufFile {
    let mut b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("llama.expert_count", MetaValue::U32(expert_count as u32))
        .kv("llama.expert_used_count", MetaValue::U32(2));
    let add = |name: String, dims: Vec<u64>, b: GgufBuilder| {
        let dims = tweak(&name, dims);
        let n: u64 = dims.iter().product();
        // Value = flat index, so each expert's slice is recognisable.
        let vals: Vec<f32> = (0..n).map(|i| i as f32).collect();
        b.tensor_f32(name, &dims, GgmlType::F32, &vals).unwrap()
    };
    b = add("token_embd.weight".into(), vec![EMBD, 100], b);
    for l in 0..2 {
        for (r, dims) in [
            ("attn_norm.weight", vec![EMBD]),
            ("attn_q.weight", vec![EMBD, EMBD]),
            ("attn_k.weight", vec![EMBD, EMBD]),
            ("attn_v.weight", vec![EMBD, EMBD]),
            ("attn_output.weight", vec![EMBD, EMBD]),
            ("ffn_norm.weight", vec![EMBD]),
            ("ffn_gate_inp.weight", vec![EMBD, EXPERTS]),
            ("ffn_down_exps.weight", vec![FF, EMBD, EXPERTS]),
            ("ffn_gate_exps.weight", vec![EMBD, FF, EXPERTS]),
            ("ffn_up_exps.weight", vec![EMBD, FF, EXPERTS]),
        ] {
            b = add(format!("blk.{l}.{r}"), dims, b);
        }
    }
    b = add("output_norm.weight".into(), vec![EMBD], b);
    b = add("output.weight".into(), vec![EMBD, 100], b);
    GgufFile::from_bytes("moe.gguf", b.to_bytes().unwrap()).unwrap()
}

#[test]
fn moe_expert_tensors_become_per_expert_slices() {
    let g = moe_file(|_, d| d, EXPERTS);
    let m = Manifest::from_gguf(&g).unwrap();
    assert_eq!((m.n_layer(), m.n_expert()), (2, EXPERTS as u32));
    // token_embd + 2 × (4 attention + router + 4 × 3 experts) + output.
    assert_eq!(m.weights().len(), 1 + 2 * (4 + 1 + 12) + 1);
    let exec: Vec<&str> = m.execution_order().map(|w| w.key.as_str()).collect();
    assert_eq!(
        &exec[..8],
        [
            "blk.0.attn_q.weight",
            "blk.0.attn_k.weight",
            "blk.0.attn_v.weight",
            "blk.0.attn_output.weight",
            "blk.0.ffn_gate_inp.weight",
            "blk.0.ffn_gate_exps.weight#0",
            "blk.0.ffn_up_exps.weight#0",
            "blk.0.ffn_down_exps.weight#0",
        ]
    );
    assert_eq!(exec.last(), Some(&"output.weight"));
    assert!(
        !exec.contains(&"token_embd.weight"),
        "untied: a lookup only"
    );
    let router = m.get(m.find(Role::Router, Some(1), None).unwrap());
    assert_eq!((router.k, router.n), (EMBD as usize, EXPERTS as usize));
    for l in 0..2u32 {
        for e in 0..EXPERTS as u32 {
            for (role, tensor, k, n) in [
                (Role::ExpertGate, "ffn_gate_exps", EMBD, FF),
                (Role::ExpertUp, "ffn_up_exps", EMBD, FF),
                (Role::ExpertDown, "ffn_down_exps", FF, EMBD),
            ] {
                let w = m.get(m.find(role, Some(l), Some(e)).unwrap());
                let name = format!("blk.{l}.{tensor}.weight");
                assert_eq!(w.tensor, name);
                assert_eq!(w.key, format!("{name}#{e}"));
                assert_eq!(m.id(&w.key), Some(w.id));
                assert_eq!((w.k, w.n), (k as usize, n as usize));
                assert_eq!(w.slice.dims, [k, n]);
                // The slice's bytes are expert e's [N, K] block of the [E, N, K] tensor.
                let bytes = g.tensor_data(&w.slice);
                let first = f32::from_le_bytes(bytes[..4].try_into().unwrap());
                assert_eq!(first, (u64::from(e) * k * n) as f32);
                assert_eq!(bytes.len() as u64, k * n * 4);
            }
        }
    }
}

/// Edits a fixture tensor's dims by name.
type Tweak = Box<dyn Fn(&str, Vec<u64>) -> Vec<u64>>;

#[test]
fn bad_expert_shapes_name_the_tensor() {
    let cases: [(&str, Tweak, u64); 5] = [
        (
            "blk.1.ffn_up_exps.weight",
            Box::new(|n, d| {
                if n == "blk.1.ffn_up_exps.weight" {
                    vec![EMBD, FF * EXPERTS]
                } else {
                    d
                }
            }),
            EXPERTS,
        ),
        (
            "blk.0.ffn_gate_exps.weight",
            Box::new(|_, d| d),
            EXPERTS + 1, // metadata disagrees: first expert tensor of block 0 in file order is down
        ),
        (
            "blk.0.ffn_gate_exps.weight",
            Box::new(|n, d| {
                if n == "blk.0.ffn_gate_exps.weight" {
                    vec![EMBD, FF / 2, EXPERTS]
                } else {
                    d
                }
            }),
            EXPERTS,
        ),
        (
            "blk.1.ffn_gate_inp.weight",
            Box::new(|n, d| {
                if n == "blk.1.ffn_gate_inp.weight" {
                    vec![EMBD, EXPERTS + 2]
                } else {
                    d
                }
            }),
            EXPERTS,
        ),
        (
            "blk.0.attn_k.weight",
            Box::new(|n, d| {
                if n == "blk.0.attn_k.weight" {
                    vec![EMBD, EMBD, 2]
                } else {
                    d
                }
            }),
            EXPERTS,
        ),
    ];
    for (i, (tensor, tweak, count)) in cases.into_iter().enumerate() {
        let g = moe_file(tweak, count);
        match Manifest::from_gguf(&g) {
            Err(ManifestError::Shape {
                tensor: t, file, ..
            }) => {
                // Case 1: the down tensor comes first in the file, so it is the one named.
                let want = if i == 1 {
                    "blk.0.ffn_down_exps.weight"
                } else {
                    tensor
                };
                assert_eq!(t, want, "case {i}");
                assert_eq!(file, std::path::Path::new("moe.gguf"));
            }
            other => panic!("case {i}: expected a shape error, got {other:?}"),
        }
    }
}

#[test]
fn expert_count_without_expert_tensors_is_an_error() {
    let b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("qwen3moe".into()))
        .kv("qwen3moe.expert_count", MetaValue::U32(8))
        .tensor_f32(
            "blk.0.attn_q.weight",
            &[32, 32],
            GgmlType::F32,
            &[0.0; 1024],
        )
        .unwrap();
    let g = GgufFile::from_bytes("x.gguf", b.to_bytes().unwrap()).unwrap();
    assert!(matches!(
        Manifest::from_gguf(&g),
        Err(ManifestError::Metadata { key, .. }) if key == "qwen3moe.expert_count"
    ));
}

#[test]
fn names_round_trip_through_the_table() {
    for (role, layer) in [
        (Role::AttnQ, 3),
        (Role::ExpertDown, 0),
        (Role::SharedExpertUp, 12),
        (Role::AttnKNorm, 7),
    ] {
        let name = tensor_name(role, layer).unwrap();
        assert_eq!(classify(&name), Some((role, Some(layer))));
    }
    assert_eq!(classify("output.weight"), Some((Role::Output, None)));
    assert_eq!(classify("blk.01.attn_q.weight"), None);
    assert_eq!(classify("blk.x.attn_q.weight"), None);
    assert_eq!(classify("blk.99999999999999999999.attn_q.weight"), None);
    assert_eq!(tensor_name(Role::Other, 0), None);
}

#[test]
fn unknown_2d_tensors_are_other_weights_in_file_order() {
    let b = GgufBuilder::new()
        .tensor_f32("blk.0.ffn_up.weight", &[32, 2], GgmlType::F32, &[0.0; 64])
        .unwrap()
        .tensor_f32("zeta", &[32, 1], GgmlType::F32, &[0.0; 32])
        .unwrap()
        .tensor_f32("blk.0.extra", &[32, 1], GgmlType::F32, &[0.0; 32])
        .unwrap()
        .tensor_f32("blk.0.attn_q.weight", &[32, 2], GgmlType::F32, &[0.0; 64])
        .unwrap()
        .tensor_f32("alpha", &[32], GgmlType::F32, &[0.0; 32])
        .unwrap();
    let g = GgufFile::from_bytes("x.gguf", b.to_bytes().unwrap()).unwrap();
    let m = Manifest::from_gguf(&g).unwrap();
    let keys: Vec<&str> = m.weights().iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "blk.0.attn_q.weight",
            "blk.0.ffn_up.weight",
            "blk.0.extra",
            "zeta"
        ]
    );
    assert_eq!(m.get(m.weights()[2].id).role, Role::Other);
    assert_eq!(m.output(), None);
}

#[test]
fn weight_view_finds_every_weight_of_the_manifest_by_key() {
    let g = moe_file(|_, d| d, EXPERTS);
    let m = Manifest::from_gguf(&g).unwrap();
    for w in m.weights() {
        assert_eq!(
            ork_manifest::weight_view(&g, &w.key).as_ref(),
            Some(&w.slice)
        );
    }
    for bad in [
        "blk.0.ffn_gate_exps.weight#4",
        "blk.0.ffn_gate_exps.weight#01",
        "blk.0.ffn_gate_exps.weight#x",
        "blk.0.attn_q.weight#0",
        "nope",
    ] {
        assert_eq!(ork_manifest::weight_view(&g, bad), None, "{bad}");
    }
}

/// A manifest's name table is its weights' ids, keys, roles, layers and experts, in order.
#[test]
fn a_manifests_name_table_is_its_weights() {
    let g = moe_file(|_, d| d, EXPERTS);
    let m = Manifest::from_gguf(&g).unwrap();
    let names = m.names();
    assert_eq!(names.len(), m.weights().len());
    assert!(names.ids().eq(m.weights().iter().map(|w| w.id)));
    for w in m.weights() {
        let n = names.get(w.id);
        assert_eq!(
            (n.key.as_str(), n.role, n.layer, n.expert),
            (w.key.as_str(), w.role, w.layer, w.expert)
        );
        assert_eq!(names.id(&w.key), Some(w.id));
        if w.role != Role::Other {
            assert_eq!(names.find(w.role, w.layer, w.expert), Some(w.id));
        }
    }
}

/// A model known by its shape alone is named by the same table a GGUF of that shape is: keys,
/// roles and layers, ids in the order given.
#[test]
fn a_shapes_name_table_uses_the_manifests_keys() {
    let names = WeightNames::from_roles([
        (Role::AttnQ, Some(0), None),
        (Role::ExpertGate, Some(1), Some(5)),
        (Role::Output, None, None),
    ]);
    let keys: Vec<&str> = names.ids().map(|id| names.key(id)).collect();
    assert_eq!(
        keys,
        [
            "blk.0.attn_q.weight",
            "blk.1.ffn_gate_exps.weight#5",
            "output.weight"
        ]
    );
    let gate = names.find(Role::ExpertGate, Some(1), Some(5)).unwrap();
    assert_eq!(gate.index(), 1);
    assert_eq!(names.id("output.weight").map(WeightId::index), Some(2));
    assert_eq!(names.find(Role::ExpertGate, Some(1), Some(4)), None);
}

#[test]
#[should_panic(expected = "given twice")]
fn a_shapes_name_table_refuses_a_weight_given_twice() {
    WeightNames::from_roles([(Role::AttnQ, Some(0), None), (Role::AttnQ, Some(0), None)]);
}
