//! Bad input gets a typed error naming the file and tensor: a type the engine has no kernel
//! for, a missing weight, a shape the model does not expect, a block count that does not match
//! the shape, a file cut short.

use std::sync::Arc;

use ork_cpu::{CpuError, GgufLinear};
use ork_exec::WeightSpec;
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufError, GgufFile};
use ork_manifest::WeightId;

use super::fixtures::pool;

fn spec(name: &str, k: usize, n: usize) -> WeightSpec {
    WeightSpec {
        id: WeightId::from_test_index(0),
        name: name.to_owned(),
        k,
        n,
    }
}

fn file(name: &str, dims: &[u64], ty: GgmlType, bytes: usize) -> Arc<GgufFile> {
    let b = GgufBuilder::new().tensor(name, dims, ty, vec![0u8; bytes]);
    Arc::new(GgufFile::from_bytes("fixture.gguf", b.to_bytes().unwrap()).unwrap())
}

/// An F32 expert tensor `blk.0.ffn_up_exps.weight` of 4 experts `[32, 2]`, and nothing else.
fn expert_file() -> Arc<GgufFile> {
    file(
        "blk.0.ffn_up_exps.weight",
        &[32, 2, 4],
        GgmlType::F32,
        32 * 2 * 4 * 4,
    )
}

#[test]
fn a_type_without_a_kernel_names_the_tensor_and_type() {
    // Q8_1 (an activation type in ggml) and IQ2_XXS (ggml type 16): types ork's reader knows
    // the geometry of, and the CPU engine has no kernel for.
    for (ty, bytes, name) in [
        (GgmlType::Q8_1, 36 * 2, "Q8_1"),
        (GgmlType::Other(16), 66 * 2, "IQ2_XXS"),
    ] {
        let k = ty.block_size().unwrap() as usize;
        let gguf = file("blk.0.attn_q.weight", &[k as u64, 2], ty, bytes);
        let err =
            GgufLinear::open(gguf, &[spec("blk.0.attn_q.weight", k, 2)], pool(1)).unwrap_err();
        match &err {
            CpuError::UnsupportedType {
                path, tensor, ty, ..
            } => {
                assert_eq!(path.to_str(), Some("fixture.gguf"));
                assert_eq!(tensor, "blk.0.attn_q.weight");
                assert_eq!(ty, name);
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("fixture.gguf") && msg.contains("attn_q") && msg.contains(name),
            "{msg}"
        );
    }
}

#[test]
fn a_missing_weight_or_another_shape_is_refused() {
    let gguf = file("w", &[64, 2], GgmlType::F32, 64 * 2 * 4);
    let err = GgufLinear::open(Arc::clone(&gguf), &[spec("v", 64, 2)], pool(1)).unwrap_err();
    assert!(matches!(err, CpuError::MissingTensor { ref tensor, .. } if tensor == "v"));
    let err = GgufLinear::open(Arc::clone(&gguf), &[spec("w", 32, 4)], pool(1)).unwrap_err();
    assert!(matches!(err, CpuError::BadShape { ref tensor, .. } if tensor == "w"));
    // An expert the tensor does not have.
    let gguf = expert_file();
    let err =
        GgufLinear::open(gguf, &[spec("blk.0.ffn_up_exps.weight#4", 32, 2)], pool(1)).unwrap_err();
    assert!(matches!(err, CpuError::MissingTensor { .. }));
}

#[test]
fn expert_slices_without_a_readable_routing_are_refused_naming_the_file() {
    // A valid slice of an expert tensor, in a file with no `general.architecture` (so no
    // `expert_used_count`): the expert reader cannot size what it keeps cached.
    let gguf = expert_file();
    let err =
        GgufLinear::open(gguf, &[spec("blk.0.ffn_up_exps.weight#3", 32, 2)], pool(1)).unwrap_err();
    match &err {
        CpuError::Routing { path, .. } => assert_eq!(path.to_str(), Some("fixture.gguf")),
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("fixture.gguf") && msg.contains("routing"),
        "{msg}"
    );
}

/// The byte offset of `name`'s first dimension in a GGUF image (after its length-prefixed
/// name and its u32 dimension count).
fn ne0_offset(bytes: &[u8], name: &str) -> usize {
    let at = bytes
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap();
    at + name.len() + 4
}

#[test]
fn a_block_count_that_does_not_match_the_shape_is_refused() {
    let b = GgufBuilder::new().tensor("w", &[64, 2], GgmlType::Q4_0, vec![0u8; 2 * 2 * 18]);
    let good = b.to_bytes().unwrap();
    // ne0 48: not a whole number of Q4_0's 32-value blocks.
    let mut bytes = good.clone();
    let at = ne0_offset(&bytes, "w");
    bytes[at..at + 8].copy_from_slice(&48u64.to_le_bytes());
    let err = GgufFile::from_bytes("bad.gguf", bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::BadShape { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
    // 4 rows where the file holds the blocks of 2: the tensor runs past the end.
    let mut bytes = good;
    bytes[at + 8..at + 16].copy_from_slice(&4u64.to_le_bytes());
    let err = GgufFile::from_bytes("bad.gguf", bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
}

#[test]
fn a_file_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    let b = GgufBuilder::new().tensor("w", &[64, 4], GgmlType::Q8_0, vec![0u8; 2 * 4 * 34]);
    let bytes = b.to_bytes().unwrap();
    // Cut into the tensor's last row (past any alignment padding at the end).
    std::fs::write(&path, &bytes[..bytes.len() - 40]).unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "w"),
        "{err:?}"
    );
}
