//! Malformed files give typed errors, never panics.
use crate::common::{after_string, put_u32, put_u64, small_fixture, tensor_offset_field, Rng};
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufError, GgufFile, MetaValue};
use proptest::prelude::*;

fn fixture() -> Vec<u8> {
    small_fixture().to_bytes().unwrap()
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes("bad.gguf", bytes)
}

#[test]
fn every_truncation_is_an_error() {
    let full = fixture();
    assert!(parse(full.clone()).is_ok());
    // The last tensor ends before the final padding; cutting only padding is still a valid file.
    let last = parse(full.clone())
        .unwrap()
        .tensors()
        .iter()
        .map(|t| t.offset + t.size)
        .max()
        .unwrap() as usize;
    for len in 0..last {
        match parse(full[..len].to_vec()) {
            Err(
                GgufError::Truncated { .. }
                | GgufError::LimitExceeded { .. }
                | GgufError::TensorOutOfBounds { .. },
            ) => {}
            other => panic!("prefix of {len} bytes: {other:?}"),
        }
    }
    // Through a real file and mmap, too (including the empty file).
    let dir = tempfile::tempdir().unwrap();
    for len in [0, 3, 4, 23, 100, last - 1] {
        let path = dir.path().join(format!("cut{len}.gguf"));
        std::fs::write(&path, &full[..len]).unwrap();
        let err = GgufFile::open(&path).unwrap_err();
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        assert!(matches!(
            err,
            GgufError::Truncated { .. }
                | GgufError::LimitExceeded { .. }
                | GgufError::TensorOutOfBounds { .. }
        ));
    }
}

#[test]
fn missing_file_is_an_io_error() {
    let err = GgufFile::open(std::path::Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(matches!(err, GgufError::Io { ref path, .. } if path.ends_with("model.gguf")));
}

#[test]
fn wrong_magic() {
    let mut b = fixture();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse(b), Err(GgufError::BadMagic { found, .. }) if found == b"GGML"));
    assert!(matches!(
        parse(b"GX".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
}

#[test]
fn version_1_and_big_endian_are_rejected() {
    let mut b = fixture();
    put_u32(&mut b, 4, 1);
    assert!(matches!(
        parse(b.clone()),
        Err(GgufError::UnsupportedVersion { version: 1, .. })
    ));
    put_u32(&mut b, 4, 3u32.swap_bytes());
    assert!(matches!(
        parse(b),
        Err(GgufError::UnsupportedVersion {
            version: 0x0300_0000,
            ..
        })
    ));
}

#[test]
fn tensor_offset_past_end_of_file() {
    let mut b = fixture();
    let at = tensor_offset_field(&b, "norm", 1);
    let len = b.len() as u64;
    put_u64(&mut b, at, len.next_multiple_of(32));
    match parse(b.clone()) {
        Err(GgufError::TensorOutOfBounds {
            tensor, file_len, ..
        }) => assert_eq!((tensor.as_str(), file_len), ("norm", len)),
        other => panic!("{other:?}"),
    }
    // Offset so large that data_offset + offset overflows.
    put_u64(&mut b, at, u64::MAX - 31);
    assert!(
        matches!(parse(b), Err(GgufError::TensorOutOfBounds { tensor, .. }) if tensor == "norm")
    );
}

#[test]
fn misaligned_tensor_offset() {
    let mut b = fixture();
    let at = tensor_offset_field(&b, "w.q4", 2);
    let old = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    put_u64(&mut b, at, old + 4);
    assert!(
        matches!(parse(b), Err(GgufError::TensorOutOfBounds { tensor, .. }) if tensor == "w.q4")
    );
}

#[test]
fn absurd_counts_and_lengths() {
    let b = fixture();
    // Tensor count, metadata count.
    for (at, what) in [(8, "tensor count"), (16, "metadata count")] {
        let mut m = b.clone();
        put_u64(&mut m, at, u64::MAX);
        match parse(m) {
            Err(GgufError::LimitExceeded {
                what: w,
                offset,
                value,
                ..
            }) => {
                assert_eq!((w.as_str(), offset, value), (what, at as u64, u64::MAX));
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // Key length, string value length, array length, tensor name length.
    let key_len_at = 24; // the first key's length prefix
    let str_len_at = after_string(&b, "general.architecture") + 4;
    let arr_len_at = after_string(&b, "t.strings") + 4 + 4;
    let name_len_at = after_string(&b, "w.q8") - 4 - 8;
    for at in [key_len_at, str_len_at, arr_len_at, name_len_at] {
        let mut m = b.clone();
        put_u64(&mut m, at, 1 << 62);
        match parse(m) {
            Err(GgufError::LimitExceeded { offset, value, .. }) => {
                assert_eq!((offset, value), (at as u64, 1 << 62))
            }
            other => panic!("length at {at}: {other:?}"),
        }
    }
    // A string length under the cap but past the end of the file is a truncation.
    let mut m = b.clone();
    put_u64(&mut m, str_len_at, b.len() as u64);
    match parse(m) {
        Err(GgufError::Truncated { offset, needed, .. }) => {
            assert_eq!((offset, needed), (str_len_at as u64 + 8, b.len() as u64))
        }
        other => panic!("{other:?}"),
    }
    // Five dimensions.
    let mut m = b.clone();
    put_u32(&mut m, after_string(&b, "norm"), 5);
    assert!(matches!(
        parse(m),
        Err(GgufError::LimitExceeded {
            value: 5,
            limit: 4,
            ..
        })
    ));
    // Dimensions whose product overflows.
    let mut m = b.clone();
    let dims_at = after_string(&b, "w.q8") + 4;
    put_u64(&mut m, dims_at, 1 << 40);
    put_u64(&mut m, dims_at + 8, 1 << 40);
    assert!(matches!(parse(m), Err(GgufError::Overflow { .. })));
}

#[test]
fn array_nesting_is_capped() {
    let mut v = MetaValue::Array(vec![MetaValue::U8(1)]);
    for _ in 0..12 {
        v = MetaValue::Array(vec![v]);
    }
    let b = GgufBuilder::new().kv("deep", v).to_bytes().unwrap();
    assert!(
        matches!(parse(b), Err(GgufError::LimitExceeded { what, .. }) if what.contains("deep"))
    );
}

#[test]
fn bad_alignment_values() {
    let b = fixture();
    let at = after_string(&b, "general.alignment") + 4;
    for bad in [0u32, 24, 48, 3] {
        let mut m = b.clone();
        put_u32(&mut m, at, bad);
        match parse(m) {
            Err(GgufError::BadAlignment {
                alignment, offset, ..
            }) => assert_eq!((alignment, offset), (bad as u64, at as u64)),
            other => panic!("alignment {bad}: {other:?}"),
        }
    }
    // Not an integer at all: an f32 32.0 (the builder refuses to write it, so patch the type).
    let mut m = b.clone();
    put_u32(&mut m, at - 4, 6);
    put_u32(&mut m, at, 32f32.to_bits());
    assert!(matches!(parse(m), Err(GgufError::Malformed { offset, .. }) if offset == at as u64));
}

#[test]
fn duplicate_names_and_keys() {
    let b = fixture();
    // Rename tensor "norm" to "w.q8"? Lengths differ; rename w.q4 -> w.q8 (same length).
    let mut m = b.clone();
    let at = after_string(&b, "w.q4") - 4;
    m[at..at + 4].copy_from_slice(b"w.q8");
    assert!(matches!(parse(m), Err(GgufError::DuplicateTensor { tensor, .. }) if tensor == "w.q8"));
    let mut m = b.clone();
    let at = after_string(&b, "t.u16") - 5;
    m[at..at + 5].copy_from_slice(b"t.i16");
    assert!(matches!(parse(m), Err(GgufError::DuplicateKey { key, .. }) if key == "t.i16"));
}

#[test]
fn malformed_values() {
    let b = fixture();
    // Invalid UTF-8 in a key.
    let mut m = b.clone();
    let at = after_string(&b, "t.u8") - 2;
    m[at] = 0xFF;
    assert!(matches!(parse(m), Err(GgufError::Malformed { offset, .. }) if offset == at as u64));
    // A bool that is 2.
    let mut m = b.clone();
    m[after_string(&b, "t.bool") + 4] = 2;
    assert!(matches!(parse(m), Err(GgufError::Malformed { what, .. }) if what.contains("t.bool")));
    // Unknown value type 13, and unknown array element type.
    let mut m = b.clone();
    put_u32(&mut m, after_string(&b, "t.u8"), 13);
    assert!(
        matches!(parse(m), Err(GgufError::BadValueType { key, type_id: 13, .. }) if key == "t.u8")
    );
    let mut m = b.clone();
    put_u32(&mut m, after_string(&b, "t.strings") + 4, 99);
    assert!(
        matches!(parse(m), Err(GgufError::BadValueType { key, type_id: 99, .. }) if key == "t.strings")
    );
}

#[test]
fn shape_errors_name_the_tensor() {
    let b = fixture();
    // w.q8 is [64, 3] Q8_0: make it [16, 12] (same size, ne0 not a multiple of 32).
    let mut m = b.clone();
    let dims_at = after_string(&b, "w.q8") + 4;
    put_u64(&mut m, dims_at, 16);
    put_u64(&mut m, dims_at + 8, 12);
    assert!(matches!(parse(m), Err(GgufError::BadShape { tensor, .. }) if tensor == "w.q8"));
    let mut m = b.clone();
    put_u64(&mut m, dims_at + 8, 0);
    assert!(matches!(parse(m), Err(GgufError::BadShape { tensor, .. }) if tensor == "w.q8"));
    let mut m = b.clone();
    put_u32(&mut m, after_string(&b, "norm"), 0);
    assert!(matches!(parse(m), Err(GgufError::BadShape { tensor, .. }) if tensor == "norm"));
}

#[test]
fn unknown_type_id_names_the_tensor() {
    let b = fixture();
    let mut m = b.clone();
    put_u32(&mut m, after_string(&b, "norm") + 4 + 8, 99);
    assert!(
        matches!(parse(m), Err(GgufError::UnknownType { tensor, type_id: 99, .. }) if tensor == "norm")
    );
}

#[test]
fn undecodable_types_open_and_name_the_tensor_on_decode() {
    let mut rng = Rng(3);
    // IQ2_XXS (id 16: 256 values in 66 bytes) and TQ2_0 (id 35) next to a decodable tensor.
    let bytes = GgufBuilder::new()
        .tensor(
            "blk.0.iq",
            &[256, 2],
            GgmlType::Other(16),
            rng.bytes(2 * 66),
        )
        .tensor("blk.0.tq", &[256], GgmlType::Other(35), rng.bytes(66))
        .tensor("f", &[4], GgmlType::F32, vec![0; 16])
        .to_bytes()
        .unwrap();
    let file = parse(bytes).unwrap();
    let iq = file.tensor("blk.0.iq").unwrap();
    assert_eq!((iq.size, iq.ty.to_string().as_str()), (132, "IQ2_XXS"));
    let mut out = vec![0f32; 256];
    match file.dequantize_rows(iq, 0, &mut out) {
        Err(GgufError::UnsupportedType { tensor, ty, path }) => {
            assert_eq!(
                (tensor.as_str(), ty.as_str(), path.to_str()),
                ("blk.0.iq", "IQ2_XXS", Some("bad.gguf"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ork_gguf::dequant::dequantize(GgmlType::Other(35), &[0; 66], &mut out),
        Err(GgufError::UnsupportedType { .. })
    ));
    assert!(file.dequantize_tensor(file.tensor("f").unwrap()).is_ok());
}

#[test]
fn decode_length_and_row_range_errors() {
    use ork_gguf::dequant::dequantize;
    let mut out = vec![0f32; 32];
    assert!(matches!(
        dequantize(GgmlType::Q4_1, &[0; 19], &mut out),
        Err(GgufError::Decode { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::Q4_1, &[0; 40], &mut out),
        Err(GgufError::Decode { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::Q4_1, &[0; 20], &mut out[..31]),
        Err(GgufError::Decode { .. })
    ));
    assert!(dequantize(GgmlType::Q4_1, &[0; 20], &mut out).is_ok());

    let file = parse(fixture()).unwrap();
    let t = file.tensor("w.q4").unwrap().clone(); // [64, 3]
    let mut row = vec![0f32; 64];
    assert!(file.dequantize_rows(&t, 2, &mut row).is_ok());
    assert!(matches!(
        file.dequantize_rows(&t, 3, &mut row),
        Err(GgufError::BadRowRange {
            first_row: 3,
            n_rows: 3,
            ..
        })
    ));
    assert!(matches!(
        file.dequantize_rows(&t, 0, &mut row[..63]),
        Err(GgufError::BadRowRange { .. })
    ));
    assert!(matches!(
        file.dequantize_rows(&t, u64::MAX, &mut row),
        Err(GgufError::BadRowRange { .. })
    ));
    let mut all = vec![0f32; 64 * 4];
    assert!(matches!(
        file.dequantize_rows(&t, 0, &mut all),
        Err(GgufError::BadRowRange { .. })
    ));
    // A TensorInfo that does not belong to the file.
    let mut foreign = t.clone();
    foreign.offset = file.file_len();
    assert!(matches!(
        file.dequantize_rows(&foreign, 0, &mut row),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte mutations of a valid file never panic the parser or the decoders.
    #[test]
    fn mutated_files_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut b = fixture();
        let len = b.len();
        for (i, v) in edits {
            b[i.index(len)] = v;
        }
        if let Ok(file) = parse(b) {
            for t in file.tensors() {
                assert_eq!(file.tensor_data(t).len() as u64, t.size);
                let _ = file.dequantize_tensor(t);
            }
        }
    }
}

#[test]
fn overlapping_tensor_data_is_refused() {
    let bytes = GgufBuilder::new()
        .tensor_f32("a", &[32], GgmlType::F32, &[1.0; 32])
        .unwrap()
        .tensor_f32("b", &[32], GgmlType::F32, &[2.0; 32])
        .unwrap()
        .to_bytes()
        .unwrap();
    assert!(GgufFile::from_bytes("ok.gguf", bytes.clone()).is_ok());
    // Tensor info of "b": u64 name length, "b", u32 n_dims, u64 dim, u32 type, u64 offset.
    let name = [&1u64.to_le_bytes()[..], b"b"].concat();
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor info of b")
        + name.len()
        + 4
        + 8
        + 4;
    let mut bad = bytes;
    bad[at..at + 8].copy_from_slice(&0u64.to_le_bytes()); // b's data = a's data
    match GgufFile::from_bytes("overlap.gguf", bad) {
        Err(GgufError::OverlappingTensors { tensor, other, .. }) => {
            assert_eq!((tensor.as_str(), other.as_str()), ("b", "a"));
        }
        other => panic!("expected OverlappingTensors, got {other:?}"),
    }
}
