//! Writer -> reader roundtrips and quantizer error bounds.
use crate::common::{small_fixture, Rng};
use ork_gguf::dequant::dequantize;
use ork_gguf::writer::{quantize, GgufBuilder};
use ork_gguf::{GgmlType, GgufError, GgufFile, MetaValue};

#[test]
fn write_then_open_gives_back_metadata_and_tensors() {
    let builder = small_fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.gguf");
    builder.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.path(), path);
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.file_len(), std::fs::metadata(&path).unwrap().len());
    assert_eq!(file.data_offset() % 32, 0);

    let keys: Vec<&str> = file.metadata_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 15);
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys[14], "t.nested");
    let m = |k| file.metadata(k).unwrap();
    assert_eq!(m("general.architecture").as_str(), Some("llama"));
    assert_eq!(m("t.u8"), &MetaValue::U8(200));
    assert_eq!(m("t.i8"), &MetaValue::I8(-5));
    assert_eq!(m("t.i8").as_u64(), None);
    assert_eq!(m("t.u16").as_u64(), Some(60000));
    assert_eq!(m("t.i16"), &MetaValue::I16(-30000));
    assert_eq!(m("t.u32").as_u64(), Some(4_000_000_000));
    assert_eq!(m("t.i32"), &MetaValue::I32(-2_000_000_000));
    assert_eq!(m("t.f32").as_f32(), Some(1.5));
    assert_eq!(m("t.bool").as_bool(), Some(true));
    assert_eq!(m("t.u64").as_u64(), Some(u64::MAX));
    assert_eq!(m("t.i64"), &MetaValue::I64(i64::MIN));
    assert_eq!(m("t.f64").as_f32(), Some(-2.25));
    let strings = m("t.strings").as_array().unwrap();
    assert_eq!(strings[1].as_str(), Some("ü€"));
    let nested = m("t.nested").as_array().unwrap();
    assert_eq!(
        nested[0].as_array().unwrap(),
        &[MetaValue::I32(1), MetaValue::I32(2)]
    );
    assert!(nested[1].as_array().unwrap().is_empty());
    assert!(file.metadata("missing").is_none());

    let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["w.q8", "w.q4", "norm"]);
    let q4 = file.tensor("w.q4").unwrap();
    assert_eq!(
        (q4.dims.as_slice(), q4.ty, q4.size, q4.n_elements()),
        (&[64u64, 3][..], GgmlType::Q4_1, 120, 192)
    );
    assert_eq!(q4.offset % 32, 0);
    assert!(q4.offset >= file.data_offset());
    // The bytes read back are the bytes written.
    let mut rng = Rng(7);
    let w: Vec<f32> = (0..64 * 3).map(|_| rng.f32()).collect();
    assert_eq!(file.tensor_data(q4), quantize(GgmlType::Q4_1, &w).unwrap());
    let norm: Vec<f32> = (0..64).map(|_| rng.f32()).collect();
    assert_eq!(
        file.dequantize_tensor(file.tensor("norm").unwrap())
            .unwrap(),
        norm
    );

    // The same bytes parse the same from memory.
    let mem = GgufFile::from_bytes("mem", std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(mem.tensors(), file.tensors());
    assert!(mem.metadata_iter().eq(file.metadata_iter()));
}

#[test]
fn version_2_and_custom_alignment_are_read() {
    let data = quantize(GgmlType::F32, &[1.0; 8]).unwrap();
    let bytes = GgufBuilder::new()
        .version(2)
        .kv("general.alignment", MetaValue::U64(256))
        .tensor(
            "a",
            &[3],
            GgmlType::F16,
            quantize(GgmlType::F16, &[1.0, 2.0, 3.0]).unwrap(),
        )
        .tensor("b", &[8], GgmlType::F32, data)
        .to_bytes()
        .unwrap();
    let file = GgufFile::from_bytes("v2", bytes).unwrap();
    assert_eq!((file.version(), file.alignment()), (2, 256));
    let b = file.tensor("b").unwrap();
    assert_eq!(b.offset % 256, 0);
    assert_eq!(
        file.dequantize_tensor(file.tensor("a").unwrap()).unwrap(),
        [1.0, 2.0, 3.0]
    );
    assert_eq!(file.dequantize_tensor(b).unwrap(), [1.0; 8]);
}

#[test]
fn three_d_expert_tensor_rows_span_experts() {
    // An MoE expert stack [k = 64, n = 4, experts = 3]: 12 rows; row r is expert r / 4.
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..64 * 4 * 3).map(|_| rng.f32()).collect();
    let q = quantize(GgmlType::Q4_0, &x).unwrap();
    let bytes = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("mixtral".into()))
        .tensor(
            "blk.0.ffn_up_exps.weight",
            &[64, 4, 3],
            GgmlType::Q4_0,
            q.clone(),
        )
        .to_bytes()
        .unwrap();
    let file = GgufFile::from_bytes("moe", bytes).unwrap();
    let t = file.tensor("blk.0.ffn_up_exps.weight").unwrap();
    assert_eq!((t.row_len(), t.n_rows(), t.row_bytes()), (64, 12, Some(36)));
    let mut whole = vec![0f32; x.len()];
    dequantize(GgmlType::Q4_0, &q, &mut whole).unwrap();
    // Rows 3..7 cross from expert 0 into expert 1.
    let mut rows = vec![0f32; 4 * 64];
    file.dequantize_rows(t, 3, &mut rows).unwrap();
    assert_eq!(rows, whole[3 * 64..7 * 64]);
}

/// Largest |x - dequant(quant(x))| over blocks of uniform values in [-1, 1).
fn max_roundtrip_error(ty: GgmlType) -> f32 {
    let mut rng = Rng(ty.id() as u64 + 1);
    let x: Vec<f32> = (0..32 * 256).map(|_| rng.f32()).collect();
    let q = quantize(ty, &x).unwrap();
    assert_eq!(q.len() as u64, ty.bytes_for(x.len() as u64).unwrap());
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    x.iter()
        .zip(&y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn quantize_dequantize_error_is_within_half_a_step() {
    // Values in [-1, 1): a step is at most 2/15 (Q4_1) and 1/127 (Q8_0), and the error at most
    // half a step plus the f16 rounding of the scales. Q4_0 maps the extreme to -8·d, so its
    // opposite clamps at +7·d: up to one whole step (1/8) there.
    assert_eq!(max_roundtrip_error(GgmlType::F32), 0.0);
    assert!(max_roundtrip_error(GgmlType::F16) <= 1.0 / 2048.0);
    assert!(max_roundtrip_error(GgmlType::BF16) <= 1.0 / 256.0);
    assert!(max_roundtrip_error(GgmlType::Q8_0) <= 0.5 / 127.0 + 1e-3);
    assert!(max_roundtrip_error(GgmlType::Q4_1) <= 0.5 * 2.0 / 15.0 + 2e-3);
    assert!(max_roundtrip_error(GgmlType::Q4_0) <= 1.0 / 8.0 + 2e-3);
}

#[test]
fn builder_rejects_inconsistent_input() {
    let build = |b: GgufBuilder| b.to_bytes().unwrap_err();
    let f32x4 = quantize(GgmlType::F32, &[0.0; 4]).unwrap();
    assert!(matches!(
        build(GgufBuilder::new().tensor("a", &[5], GgmlType::F32, f32x4.clone())),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        build(
            GgufBuilder::new()
                .tensor("a", &[4], GgmlType::F32, f32x4.clone())
                .tensor("a", &[4], GgmlType::F32, f32x4.clone())
        ),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        build(GgufBuilder::new().tensor("a", &[16], GgmlType::Q8_0, vec![0; 17])),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        build(GgufBuilder::new().kv("general.alignment", MetaValue::U32(24))),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        build(
            GgufBuilder::new()
                .kv("k", MetaValue::U8(1))
                .kv("k", MetaValue::U8(2))
        ),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        build(GgufBuilder::new().kv(
            "mixed",
            MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)])
        )),
        GgufError::Build { .. }
    ));
    assert!(matches!(
        quantize(GgmlType::Q4_0, &[0.0; 31]),
        Err(GgufError::Build { .. })
    ));
    assert!(matches!(
        quantize(GgmlType::Q6_K, &[0.0; 256]),
        Err(GgufError::UnsupportedType { .. })
    ));
}
