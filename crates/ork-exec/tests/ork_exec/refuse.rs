//! Nothing a model carries is skipped quietly: a tensor or an `{arch}.` key outside the
//! architecture's table (`ork_manifest::SUPPORTED`, docs/models.md) is refused at load, naming
//! it; errors are matched by variant.
use super::fixtures::{builder, from_builder, TinySpec};
use ork_exec::{ExecError, Model};
use ork_gguf::{GgmlType, MetaValue};
use ork_manifest::ManifestError;

/// One fixture per supported architecture (llama dense and Mixtral-style MoE included).
fn specs() -> Vec<TinySpec> {
    vec![
        TinySpec::new("llama"),
        TinySpec::mixtral(),
        TinySpec::new("qwen2"),
        TinySpec::new("qwen3"),
        TinySpec::new("qwen2moe"),
        TinySpec::new("qwen3moe"),
    ]
}

fn refused_tensor(g: &std::sync::Arc<ork_gguf::GgufFile>) -> String {
    match Model::load(g) {
        Err(ExecError::Unsupported(ManifestError::UnsupportedTensor { file, tensor, .. })) => {
            assert_eq!(file, std::path::Path::new("fixture.gguf"));
            tensor
        }
        Err(e) => panic!("expected UnsupportedTensor, got {e}"),
        Ok(_) => panic!("a tensor ork does not implement must be refused, not ignored"),
    }
}

fn refused_key(g: &std::sync::Arc<ork_gguf::GgufFile>) -> String {
    match Model::load(g) {
        Err(ExecError::Unsupported(ManifestError::UnsupportedKey { file, key, .. })) => {
            assert_eq!(file, std::path::Path::new("fixture.gguf"));
            key
        }
        Err(e) => panic!("expected UnsupportedKey, got {e}"),
        Ok(_) => panic!("a key ork does not implement must be refused, not ignored"),
    }
}

#[test]
fn every_fixture_loads_as_written() {
    for spec in specs() {
        Model::load(&from_builder(builder(&spec, None)))
            .unwrap_or_else(|e| panic!("{}: {e}", spec.arch));
    }
}

#[test]
fn an_unknown_tensor_is_refused_by_name_per_architecture() {
    for spec in specs() {
        // A per-block tensor llama.cpp knows for other architectures (gemma's post-attention
        // norm), not implemented by ork for any.
        let name = "blk.1.post_attention_norm.weight";
        let b = builder(&spec, None)
            .tensor_f32(
                name,
                &[spec.n_embd as u64],
                GgmlType::F32,
                &vec![1.0; spec.n_embd],
            )
            .unwrap();
        assert_eq!(refused_tensor(&from_builder(b)), name, "{}", spec.arch);
    }
}

#[test]
fn a_tensor_of_another_architecture_is_refused() {
    // qwen3's q norm in a qwen2 file, qwen2's q bias in a qwen3 file: each is a tensor ork
    // knows, but not for that architecture.
    for (arch, name) in [
        ("qwen2", "blk.0.attn_q_norm.weight"),
        ("qwen3", "blk.0.attn_q.bias"),
    ] {
        let spec = TinySpec::new(arch);
        let len = match arch {
            "qwen2" => spec.head_dim(),
            _ => spec.n_head * spec.head_dim(),
        };
        let b = builder(&spec, None)
            .tensor_f32(name, &[len as u64], GgmlType::F32, &vec![0.5; len])
            .unwrap();
        assert_eq!(refused_tensor(&from_builder(b)), name, "{arch}");
    }
}

#[test]
fn an_unknown_key_is_refused_by_name_per_architecture() {
    for spec in specs() {
        // Sliding-window attention: a key llama.cpp reads for other families.
        let key = format!("{}.attention.sliding_window", spec.arch);
        let b = builder(&spec, None).kv(key.clone(), MetaValue::U32(4));
        assert_eq!(refused_key(&from_builder(b)), key, "{}", spec.arch);
    }
}

#[test]
fn keys_outside_the_architecture_namespace_are_allowed() {
    let spec = TinySpec::new("qwen3");
    let b = builder(&spec, None)
        .kv("general.name", MetaValue::String("tiny".into()))
        .kv("general.file_type", MetaValue::U32(0))
        .kv("general.quantization_version", MetaValue::U32(2))
        .kv("quantize.imatrix.file", MetaValue::String("x.dat".into()));
    Model::load(&from_builder(b)).unwrap();
}

#[test]
fn expert_keys_in_a_dense_architecture_are_refused() {
    // qwen2 is dense in ork and llama.cpp: an expert count would otherwise be ignored.
    let spec = TinySpec::new("qwen2");
    let b = builder(&spec, None).kv("qwen2.expert_count", MetaValue::U32(4));
    assert_eq!(refused_key(&from_builder(b)), "qwen2.expert_count");
}

#[test]
fn rope_frequency_factors_of_the_wrong_length_or_value_are_refused_by_name() {
    // One f32 per rotated pair (n_rot / 2), as llama.cpp requires: a tensor one short is
    // refused, naming it, and so is a factor that is not a finite positive number.
    let spec = TinySpec::new("llama");
    let half = spec.head_dim() / 2;
    for (len, value) in [(half - 1, 1.0), (half + 1, 1.0)] {
        let b = builder(&spec, None)
            .tensor_f32(
                "rope_freqs.weight",
                &[len as u64],
                GgmlType::F32,
                &vec![value; len],
            )
            .unwrap();
        match Model::load(&from_builder(b)) {
            Err(ExecError::TensorShape { tensor, found, .. }) => {
                assert_eq!(
                    (tensor.as_str(), found),
                    ("rope_freqs.weight", vec![len as u64])
                )
            }
            Err(e) => panic!("expected TensorShape, got {e}"),
            Ok(_) => panic!("a rope_freqs of {len} values must be refused"),
        }
    }
    for bad in [0.0, -1.0, f32::NAN] {
        let b = builder(&spec, None)
            .tensor_f32(
                "rope_freqs.weight",
                &[half as u64],
                GgmlType::F32,
                &vec![bad; half],
            )
            .unwrap();
        match Model::load(&from_builder(b)) {
            Err(ExecError::TensorData { tensor, .. }) => assert_eq!(tensor, "rope_freqs.weight"),
            Err(e) => panic!("expected TensorData, got {e}"),
            Ok(_) => panic!("a factor of {bad} must be refused"),
        }
    }
}

#[test]
fn rope_factor_tensors_an_architecture_does_not_read_are_refused_by_name() {
    let half = TinySpec::new("llama").head_dim() / 2;
    let factors = |b: ork_gguf::writer::GgufBuilder, name: &str| {
        b.tensor_f32(name, &[half as u64], GgmlType::F32, &vec![1.0; half])
            .unwrap()
    };
    // qwen2 reads no factors (its table refuses them); llama reads rope_freqs unless its
    // scaling type is longrope, and LongRoPE factors only then (llama.cpp would refuse the
    // other as an unused tensor).
    let qwen2 = factors(builder(&TinySpec::new("qwen2"), None), "rope_freqs.weight");
    assert_eq!(refused_tensor(&from_builder(qwen2)), "rope_freqs.weight");
    let spec = TinySpec::new("llama");
    let longrope = builder(&spec, None).kv(
        "llama.rope.scaling.type",
        MetaValue::String("longrope".into()),
    );
    for (b, name) in [
        (factors(longrope, "rope_freqs.weight"), "rope_freqs.weight"),
        (
            factors(builder(&spec, None), "rope_factors_long.weight"),
            "rope_factors_long.weight",
        ),
    ] {
        match Model::load(&from_builder(b)) {
            Err(ExecError::TensorData { tensor, .. }) => assert_eq!(tensor, name),
            Err(e) => panic!("{name}: expected TensorData, got {e}"),
            Ok(_) => panic!("{name} must be refused"),
        }
    }
}

#[test]
fn rope_scaling_keys_ork_does_not_implement_are_refused_by_name() {
    let spec = TinySpec::new("llama");
    // YaRN parameters change the rotation.
    for suffix in [
        "rope.scaling.yarn_log_multiplier",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.yarn_ext_factor",
    ] {
        let key = format!("llama.{suffix}");
        let b = builder(&spec, None).kv(key.clone(), MetaValue::F32(2.0));
        assert_eq!(refused_key(&from_builder(b)), key);
    }
    // A scaling type other than none/linear/longrope is refused by the configuration, naming
    // the key (`llama3` is no type llama.cpp knows: its factors are `rope_freqs`).
    for ty in ["yarn", "llama3"] {
        let b = builder(&spec, None).kv("llama.rope.scaling.type", MetaValue::String(ty.into()));
        match Model::load(&from_builder(b)) {
            Err(ExecError::InvalidMetadata { key, .. }) => {
                assert_eq!(key, "llama.rope.scaling.type")
            }
            Err(e) => panic!("{ty}: expected InvalidMetadata, got {e}"),
            Ok(_) => panic!("{ty} scaling must be refused"),
        }
    }
    // An attention factor that is not a finite positive number, naming the key.
    let b = builder(&spec, None).kv("llama.rope.scaling.attn_factor", MetaValue::F32(0.0));
    match Model::load(&from_builder(b)) {
        Err(ExecError::InvalidMetadata { key, .. }) => {
            assert_eq!(key, "llama.rope.scaling.attn_factor")
        }
        Err(e) => panic!("expected InvalidMetadata, got {e}"),
        Ok(_) => panic!("an attention factor of 0 must be refused"),
    }
}

#[test]
fn phi3_refuses_an_unknown_tensor_and_an_unknown_key_by_name() {
    use ork_testkit::rope::{builder as rope_builder, RopeFixture};
    let g = |b: ork_gguf::writer::GgufBuilder| {
        std::sync::Arc::new(
            ork_gguf::GgufFile::from_bytes("fixture.gguf", b.to_bytes().unwrap()).unwrap(),
        )
    };
    Model::load(&g(rope_builder(RopeFixture::Phi3, &[], &[]))).unwrap();
    // A separate gate, which llama.cpp's phi3 does not read (its ffn_up holds the gate), and
    // llama's rope_freqs.
    for name in ["blk.0.ffn_gate.weight", "rope_freqs.weight"] {
        let b = rope_builder(RopeFixture::Phi3, &[], &[])
            .tensor_f32(name, &[6], GgmlType::F32, &[1.0; 6])
            .unwrap();
        assert_eq!(refused_tensor(&g(b)), name);
    }
    for key in ["phi3.expert_count", "phi3.rope.scaling.yarn_log_multiplier"] {
        let b = rope_builder(RopeFixture::Phi3, &[], &[(key, MetaValue::U32(4))]);
        assert_eq!(refused_key(&g(b)), key);
    }
    // A missing fused weight is named.
    let b = rope_builder(RopeFixture::Phi3, &["blk.1.attn_qkv.weight"], &[]);
    match Model::load(&g(b)) {
        Err(ExecError::MissingTensor { tensor }) => assert_eq!(tensor, "blk.1.attn_q.weight"),
        Err(e) => panic!("expected MissingTensor, got {e}"),
        Ok(_) => panic!("a phi3 block without q/k/v must be refused"),
    }
}

/// The tables never refuse what the configuration implements: every optional key
/// `ModelConfig::from_gguf` reads, set to a value it accepts, loads on every architecture.
#[test]
fn every_key_the_configuration_reads_is_accepted() {
    for spec in specs() {
        let a = spec.arch;
        let h = spec.head_dim() as u32;
        let mut b = builder(&spec, None)
            .kv(format!("{a}.vocab_size"), MetaValue::U32(spec.vocab as u32))
            .kv(format!("{a}.rope.dimension_count"), MetaValue::U32(h))
            .kv(
                format!("{a}.rope.scaling.type"),
                MetaValue::String("linear".into()),
            )
            .kv(format!("{a}.rope.scaling.factor"), MetaValue::F32(2.0))
            .kv(format!("{a}.rope.scale_linear"), MetaValue::F32(2.0))
            .kv(format!("{a}.rope.scaling.attn_factor"), MetaValue::F32(1.5))
            .kv(
                format!("{a}.rope.scaling.original_context_length"),
                MetaValue::U32(spec.context as u32),
            );
        if spec.head_dim.is_none() {
            b = b
                .kv(format!("{a}.attention.key_length"), MetaValue::U32(h))
                .kv(format!("{a}.attention.value_length"), MetaValue::U32(h));
        }
        if spec.n_expert > 0 {
            b = b
                .kv(format!("{a}.expert_weights_scale"), MetaValue::F32(1.0))
                .kv(format!("{a}.expert_gating_func"), MetaValue::U32(1));
        }
        let m = Model::load(&from_builder(b)).unwrap_or_else(|e| panic!("{a}: {e}"));
        assert_eq!(m.config().rope_freq_scale, 0.5, "{a}");
    }
}
