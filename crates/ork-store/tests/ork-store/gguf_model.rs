//! Tests against GGUF sources: tiny hand-written GGUF files (staleness) and the real model.

use std::path::Path;

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use ork_gguf::GgufFile;
use ork_pack::{GgufRows, PackDtype};
use ork_store::{
    bench_load, check_entry, convert, ensure, fingerprint, matmul_weights, Action, ConvertOptions,
    EntryStatus, Orkpack, OrkpackWriter, RebuildReason, SourceInfo, StoreError,
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

/// A tiny model with two matmul weights (tuned independently) and a norm vector.
fn tiny_two(path: &Path, tune_q: f32, tune_up: f32) {
    let mat = |k: usize, n: usize, tune: f32| -> Vec<f32> {
        (0..k * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0 + tune)
            .collect()
    };
    write_tiny_gguf(
        path,
        &[
            ("blk.0.attn_norm.weight", vec![64], vec![1.0; 64]),
            ("blk.0.ffn_up.weight", vec![64, 96], mat(64, 96, tune_up)),
            ("blk.0.attn_q.weight", vec![64, 32], mat(64, 32, tune_q)),
        ],
    );
}

/// The packed weight ork_pack produces for tensor `name` of `model`.
fn packed(model: &GgufFile, name: &str, dtype: PackDtype) -> ork_pack::PackedWeight {
    let t = model.tensor(name).unwrap();
    ork_pack::pack(&GgufRows::new(model, t).unwrap(), dtype).unwrap()
}

fn file_id(path: &Path) -> (u64, Vec<u8>) {
    (
        std::fs::metadata(path).unwrap().ino(),
        std::fs::read(path).unwrap(),
    )
}

#[test]
fn ensure_packs_reuses_and_repacks_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (a_path, b_path) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    tiny_two(&a_path, 0.0, 0.0);
    tiny_two(&b_path, 0.0, 0.5); // ffn_up fine-tuned
    let a = GgufFile::open(&a_path).unwrap();
    let b = GgufFile::open(&b_path).unwrap();
    let pack_path = dir.path().join("m.orkpack");
    let (seen, packed_seen) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let cb = |p: &ork_store::Progress<'_>| {
        assert_eq!(p.total, 2);
        seen.fetch_add(1, Ordering::Relaxed);
        if p.action == Action::Packed {
            packed_seen.fetch_add(1, Ordering::Relaxed);
        }
    };
    let mut opts = ConvertOptions::new(PackDtype::I8);
    opts.progress = Some(&cb);
    opts.threads = Some(2);

    // Order: block roles, not file order.
    let weights_a = matmul_weights(&a).unwrap();
    let names: Vec<&str> = weights_a.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"]);

    // 1. From nothing: everything packed, identical to ork_pack's output.
    let (pack, r) = ensure(&a, &pack_path, &opts).unwrap();
    assert_eq!((r.packed, r.reused, r.rewritten), (2, 0, true));
    assert_eq!(seen.load(Ordering::Relaxed), 2);
    assert_eq!(packed_seen.load(Ordering::Relaxed), 2);
    assert_eq!(r.bytes_in, a.tensors()[1].size + a.tensors()[2].size);
    for name in names.iter() {
        assert_eq!(
            pack.load(name, true).unwrap(),
            packed(&a, name, PackDtype::I8)
        );
    }
    assert_eq!(
        pack.model_identity(),
        Some(ork_store::model_identity(&a).unwrap())
    );
    drop(pack);
    let before = file_id(&pack_path);

    // 2. Unchanged model: reused untouched (same inode, same bytes).
    let (_, r) = ensure(&a, &pack_path, &opts).unwrap();
    assert_eq!((r.packed, r.reused, r.rewritten), (0, 2, false));
    assert_eq!(file_id(&pack_path), before);
    assert_eq!(seen.load(Ordering::Relaxed), 4);
    assert_eq!(
        packed_seen.load(Ordering::Relaxed),
        2,
        "nothing packed the second time"
    );

    // 3. One tensor fine-tuned: only it is repacked, as stale.
    let (pack, r) = ensure(&b, &pack_path, &opts).unwrap();
    assert_eq!((r.packed, r.reused, r.rewritten), (1, 1, true));
    assert_eq!(r.repacked.len(), 1);
    assert_eq!(r.repacked[0].0, "blk.0.ffn_up.weight");
    let up = b.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!(
        check_entry(&pack, pack.entry(&up.name).unwrap(), &b, up, PackDtype::I8),
        EntryStatus::Valid
    );
    assert_eq!(
        pack.load("blk.0.ffn_up.weight", true).unwrap(),
        packed(&b, "blk.0.ffn_up.weight", PackDtype::I8)
    );
    let (q_off, q_len) = pack.entry("blk.0.attn_q.weight").unwrap().blob_range();
    drop(pack);

    // 4. A corrupt blob: repacked (verify on).
    let mut bytes = std::fs::read(&pack_path).unwrap();
    bytes[(q_off + q_len / 3) as usize] ^= 0x40;
    std::fs::write(&pack_path, &bytes).unwrap();
    let (pack, r) = ensure(&b, &pack_path, &opts).unwrap();
    assert_eq!((r.packed, r.reused), (1, 1));
    assert_eq!(r.repacked[0].0, "blk.0.attn_q.weight");
    assert!(pack.load("blk.0.attn_q.weight", true).is_ok());
    drop(pack);

    // 5. Another dtype: everything stale.
    let (pack, r) = ensure(&b, &pack_path, &ConvertOptions::new(PackDtype::I4)).unwrap();
    assert_eq!((r.packed, r.reused), (2, 0));
    assert_eq!(pack.entries()[0].layout().dtype, PackDtype::I4);
    drop(pack);

    // 6. A damaged pack (its magic, then garbage): discarded and rebuilt, and the reason says so.
    std::fs::write(&pack_path, b"ORKPK01\0 and then garbage").unwrap();
    let (_, r) = ensure(&b, &pack_path, &opts).unwrap();
    assert!(r.discarded.is_some());
    assert!(matches!(r.rebuild, Some(RebuildReason::Truncated { .. })));
    assert_eq!(r.packed, 2);

    // 6b. A file that is not a pack is never replaced.
    std::fs::write(&pack_path, b"not a pack").unwrap();
    let err = ensure(&b, &pack_path, &opts).unwrap_err();
    assert!(matches!(err, StoreError::RefuseOverwrite { .. }), "{err:?}");
    assert_eq!(std::fs::read(&pack_path).unwrap(), b"not a pack");
    std::fs::remove_file(&pack_path).unwrap();

    // 7. convert always repacks.
    let (_, r) = convert(&b, &pack_path, &opts).unwrap();
    assert_eq!((r.packed, r.reused), (2, 0));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The real model.
fn real_model() -> GgufFile {
    GgufFile::open(&ork_testkit::model_path()).unwrap()
}

#[test]
fn real_model_matmul_weights_in_use_order() {
    let m = real_model();
    let ws = matmul_weights(&m).unwrap();
    assert_eq!(ws.len(), 211);
    assert_eq!(ws[0].name, "token_embd.weight");
    assert_eq!(ws[1].name, "blk.0.attn_q.weight");
    assert_eq!(ws[7].name, "blk.0.ffn_down.weight");
    assert_eq!(ws[8].name, "blk.1.attn_q.weight");
    assert_eq!(ws[210].name, "blk.29.ffn_down.weight");
    assert!(ws.iter().all(|t| t.dims.len() == 2));
}

#[test]
fn real_model_convert_then_reload() {
    let m = real_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2.orkpack");
    let mut opts = ConvertOptions::new(PackDtype::I8);
    opts.evict_src = true;
    let (pack, r) = ensure(&m, &path, &opts).unwrap();
    assert_eq!((r.packed, r.reused, r.rewritten), (211, 0, true));
    assert_eq!(pack.entries().len(), 211);
    eprintln!(
        "CONVERT: {} packed, {:.1} MB in -> {:.1} MB out, {:.2} s",
        r.packed,
        r.bytes_in as f64 / 1e6,
        r.bytes_out as f64 / 1e6,
        r.seconds
    );
    drop(pack);
    let (pack, r) = ensure(&m, &path, &opts).unwrap();
    assert_eq!((r.packed, r.reused, r.rewritten), (0, 211, false));
    eprintln!(
        "RELOAD (check only): {} reused, {:.2} s",
        r.reused, r.seconds
    );
    for name in ["token_embd.weight", "blk.7.ffn_down.weight"] {
        let t = m.tensor(name).unwrap();
        let loaded = pack.load_for(&m, t, PackDtype::I8, true).unwrap();
        assert_eq!(loaded, packed(&m, name, PackDtype::I8), "{name}");
    }
    let e = pack.entry("token_embd.weight").unwrap();
    let b = bench_load(&pack, e, 10).unwrap();
    eprintln!(
        "load {} MB: memcpy {:.2} GB/s, verified load {:.2} GB/s ({:.2}x), unverified {:.2} GB/s, hash {:.2} GB/s",
        b.bytes as f64 / 1e6,
        b.memcpy_gb_s,
        b.load_verified_gb_s,
        b.verified_ratio(),
        b.load_unverified_gb_s,
        b.hash_gb_s
    );
}

/// A model whose `ffn_down` has K = 256 (a multiple of 128) and whose `attn_q` has K = 96 (not).
fn tiny_grouped(path: &Path) {
    let mat = |k: usize, n: usize| -> Vec<f32> {
        (0..k * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0 * if i % 97 == 0 { 8.0 } else { 1.0 })
            .collect()
    };
    write_tiny_gguf(
        path,
        &[
            ("blk.0.attn_q.weight", vec![96, 32], mat(96, 32)),
            ("blk.0.ffn_down.weight", vec![256, 64], mat(256, 64)),
        ],
    );
}

#[test]
fn grouped_scales_roundtrip_and_another_quant_or_chip_is_rebuilt_with_a_reason() {
    use ork_pack::ScaleGroup;
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("g.gguf");
    tiny_grouped(&model_path);
    let model = GgufFile::open(&model_path).unwrap();
    let pack_path = dir.path().join("g.orkpack");
    let mut g128 = ConvertOptions::new(PackDtype::I8);
    g128.group = ScaleGroup::Group(128);
    g128.target = Some("rk3588");
    let (pack, r) = ensure(&model, &pack_path, &g128).unwrap();
    assert_eq!(r.packed, 2);
    assert_eq!(pack.target(), Some("rk3588"));
    // K = 256: two groups per channel, stored and loaded as `[N][K/g]`; K = 96: per channel.
    let down = pack.entry("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.group(), ScaleGroup::Group(128));
    let t = model.tensor("blk.0.ffn_down.weight").unwrap();
    let want =
        ork_pack::pack_grouped(&GgufRows::new(&model, t).unwrap(), PackDtype::I8, 128).unwrap();
    assert_eq!(want.scales.len(), 64 * 2);
    assert_eq!(pack.load("blk.0.ffn_down.weight", true).unwrap(), want);
    assert_eq!(
        pack.entry("blk.0.attn_q.weight").unwrap().group(),
        ScaleGroup::PerChannel
    );
    drop(pack);
    // Same settings: reused untouched.
    let (_, r) = ensure(&model, &pack_path, &g128).unwrap();
    assert!(!r.rewritten, "{:?}", r.rebuild);
    // Another quant: the grouped entry is repacked, with the reason.
    let mut per_channel = g128;
    per_channel.group = ScaleGroup::PerChannel;
    let (pack, r) = ensure(&model, &pack_path, &per_channel).unwrap();
    assert!(
        matches!(&r.rebuild, Some(RebuildReason::OtherGroup { count: 1, tensor, .. })
            if tensor == "blk.0.ffn_down.weight"),
        "{:?}",
        r.rebuild
    );
    assert_eq!((r.packed, r.reused), (1, 1));
    assert_eq!(
        pack.entry("blk.0.ffn_down.weight").unwrap().group(),
        ScaleGroup::PerChannel
    );
    drop(pack);
    // Another chip: rebuilt (entries copied, they do not depend on the chip), with the reason.
    let mut rk3576 = per_channel;
    rk3576.target = Some("rk3576");
    let (pack, r) = ensure(&model, &pack_path, &rk3576).unwrap();
    assert!(
        matches!(&r.rebuild, Some(RebuildReason::OtherTarget { found: Some(f), wanted })
            if f == "rk3588" && wanted == "rk3576"),
        "{:?}",
        r.rebuild
    );
    assert_eq!((r.packed, r.reused), (0, 2));
    assert_eq!(pack.target(), Some("rk3576"));
}

/// Affine int4 groups (w4a16-gN): stored with their offsets after the steps and loaded back
/// equal; a pack of symmetric int4 groups (what w4a16-gN packed before affine groups) is
/// rebuilt with the reason, not read as affine; the writer refuses affine scales on int8.
#[test]
fn affine_groups_roundtrip_and_a_symmetric_pack_is_rebuilt() {
    use ork_pack::ScaleGroup;
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("a.gguf");
    tiny_grouped(&model_path);
    let model = GgufFile::open(&model_path).unwrap();
    let pack_path = dir.path().join("a.orkpack");
    let mut symmetric = ConvertOptions::new(PackDtype::I4);
    symmetric.group = ScaleGroup::Group(32);
    symmetric.target = Some("rk3576");
    let (pack, r) = ensure(&model, &pack_path, &symmetric).unwrap();
    assert_eq!(r.packed, 2);
    assert_eq!(
        pack.entry("blk.0.ffn_down.weight").unwrap().group(),
        ScaleGroup::Group(32)
    );
    drop(pack);
    let mut affine = symmetric;
    affine.group = ScaleGroup::Affine(32);
    let (pack, r) = ensure(&model, &pack_path, &affine).unwrap();
    assert!(
        matches!(&r.rebuild, Some(RebuildReason::OtherGroup { count: 2, .. })),
        "{:?}",
        r.rebuild
    );
    for (name, k, n) in [
        ("blk.0.ffn_down.weight", 256, 64),
        ("blk.0.attn_q.weight", 96, 32),
    ] {
        let e = pack.entry(name).unwrap();
        assert_eq!(e.group(), ScaleGroup::Affine(32), "{name}");
        let t = model.tensor(name).unwrap();
        let want = ork_pack::pack_affine(&GgufRows::new(&model, t).unwrap(), 32).unwrap();
        assert_eq!(want.scales.len(), 2 * n * k / 32);
        assert_eq!(pack.load(name, true).unwrap(), want, "{name}");
    }
    drop(pack);
    let (_, r) = ensure(&model, &pack_path, &affine).unwrap();
    assert!(!r.rewritten, "{:?}", r.rebuild);
    let mut w = OrkpackWriter::create(&dir.path().join("bad.orkpack")).unwrap();
    let mut pw = weight(PackDtype::I8, 64, 32, 1);
    pw.group = ScaleGroup::Affine(32);
    pw.scales = vec![0.5; 2 * 32 * 2];
    assert!(matches!(
        w.add("blk.0.attn_v.weight", &pw, SourceInfo { fingerprint: 1, ggml_type: 0 }),
        Err(StoreError::InvalidEntry { tensor, .. }) if tensor == "blk.0.attn_v.weight"
    ));
}

#[test]
fn the_writer_refuses_grouped_scales_that_do_not_fit_naming_the_tensor() {
    use ork_pack::ScaleGroup;
    let dir = tempfile::tempdir().unwrap();
    let mut w = OrkpackWriter::create(&dir.path().join("bad.orkpack")).unwrap();
    // K = 64 with g128: the group does not divide K.
    let mut pw = weight(PackDtype::I8, 64, 32, 1);
    pw.group = ScaleGroup::Group(128);
    match w.add(
        "blk.0.attn_q.weight",
        &pw,
        SourceInfo {
            fingerprint: 1,
            ggml_type: 0,
        },
    ) {
        Err(StoreError::InvalidEntry { tensor, .. }) => assert_eq!(tensor, "blk.0.attn_q.weight"),
        other => panic!("expected InvalidEntry, got {other:?}"),
    }
    // g32 divides 64, but per-channel scales are too few for it.
    pw.group = ScaleGroup::Group(32);
    assert!(matches!(
        w.add(
            "blk.0.attn_k.weight",
            &pw,
            SourceInfo {
                fingerprint: 1,
                ggml_type: 0
            }
        ),
        Err(StoreError::InvalidEntry { .. })
    ));
    assert!(matches!(
        w.set_target("RK3588!"),
        Err(StoreError::InvalidEntry { .. })
    ));
}

/// Under affine int4 groups the lm head (`output.weight`, or `token_embd.weight` when tied) is
/// packed int8 per channel; every other weight, and the head in every other mode, as asked.
#[test]
fn the_lm_head_stays_int8_per_channel_under_affine_groups() {
    use ork_pack::ScaleGroup;
    use ork_store::weight_quant;
    let affine = ScaleGroup::Affine(32);
    for head in ["token_embd.weight", "output.weight"] {
        assert_eq!(
            weight_quant(head, PackDtype::I4, affine),
            (PackDtype::I8, ScaleGroup::PerChannel)
        );
        for group in [ScaleGroup::PerChannel, ScaleGroup::Group(32)] {
            assert_eq!(
                weight_quant(head, PackDtype::I4, group),
                (PackDtype::I4, group)
            );
        }
    }
    assert_eq!(
        weight_quant("blk.0.attn_q.weight", PackDtype::I4, affine),
        (PackDtype::I4, affine)
    );
}
