//! Tests against GGUF sources: tiny hand-written GGUF files (staleness) and the real model.

use std::path::Path;

use ork_gguf::GgufFile;
use ork_pack::PackDtype;
use ork_store::{
    check_entry, fingerprint, EntryStatus, Orkpack, OrkpackWriter, SourceInfo, StoreError,
};

use super::weight;

/// Write a minimal GGUF v3 file: one string metadata key, then F32 tensors (name, dims, values).
pub fn write_tiny_gguf(path: &Path, tensors: &[(&str, Vec<u64>, Vec<f32>)]) {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    const ALIGN: usize = 32;
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    string(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes()); // GGUF_TYPE_STRING
    string(&mut out, "llama");
    let mut offset = 0usize;
    let mut data = Vec::new();
    for (name, dims, values) in tensors {
        assert_eq!(dims.iter().product::<u64>() as usize, values.len());
        string(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // GGML_TYPE_F32
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        data.resize(data.len().div_ceil(ALIGN) * ALIGN, 0);
        offset = data.len();
    }
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// The two-tensor model used by the staleness tests; `tune` shifts every weight value (a
/// fine-tune: same names, shapes and types, different values).
pub fn tiny_model(path: &Path, tune: f32) {
    let q: Vec<f32> = (0..64 * 32)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0 + tune)
        .collect();
    let norm = vec![1.0f32; 64];
    write_tiny_gguf(
        path,
        &[
            ("blk.0.attn_norm.weight", vec![64], norm),
            ("blk.0.attn_q.weight", vec![64, 32], q),
        ],
    );
}

#[test]
fn same_shapes_different_values_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let (a_path, b_path) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    tiny_model(&a_path, 0.0);
    tiny_model(&b_path, 0.001);
    let a = GgufFile::open(&a_path).unwrap();
    let b = GgufFile::open(&b_path).unwrap();
    let name = "blk.0.attn_q.weight";
    let (ta, tb) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
    assert_eq!(
        (&ta.dims, ta.ty),
        (&tb.dims, tb.ty),
        "premise: same shape and type"
    );
    assert_ne!(fingerprint(&a, ta), fingerprint(&b, tb));

    // A pack built from model A.
    let pack_path = dir.path().join("a.orkpack");
    let mut w = OrkpackWriter::create(&pack_path).unwrap();
    let src = SourceInfo {
        fingerprint: fingerprint(&a, ta),
        ggml_type: ta.ty.id(),
    };
    w.add(name, &weight(PackDtype::I8, 64, 32, 9), src).unwrap();
    w.finish().unwrap();
    let pack = Orkpack::open(&pack_path).unwrap();
    let e = pack.entry(name).unwrap();

    assert_eq!(
        check_entry(&pack, e, &a, ta, PackDtype::I8),
        EntryStatus::Valid
    );
    assert!(matches!(
        check_entry(&pack, e, &b, tb, PackDtype::I8),
        EntryStatus::Stale { .. }
    ));
    assert!(matches!(
        check_entry(&pack, e, &a, ta, PackDtype::I4),
        EntryStatus::Stale { .. }
    ));
    let norm = a.tensor("blk.0.attn_norm.weight").unwrap();
    assert!(matches!(
        check_entry(&pack, e, &a, norm, PackDtype::I8),
        EntryStatus::Stale { .. }
    ));
    assert!(pack.load_for(&a, ta, PackDtype::I8, true).is_ok());
    match pack.load_for(&b, tb, PackDtype::I8, true) {
        Err(StoreError::Stale { tensor, .. }) => assert_eq!(tensor, name),
        other => panic!("expected Stale, got {:?}", other.err()),
    }
}
