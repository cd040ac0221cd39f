//! Shared fixtures.
use ork_gguf::writer::{quantize, GgufBuilder};
use ork_gguf::{GgmlType, MetaValue};
pub use ork_testkit::{model_path, Rng};
use std::sync::Mutex;

/// Held by tests that fault in or drop many file pages, so the RSS measurement of the eviction
/// test is not disturbed by another test running in parallel in this process.
pub static PAGE_HEAVY: Mutex<()> = Mutex::new(());

pub fn lock_pages() -> std::sync::MutexGuard<'static, ()> {
    PAGE_HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A small file with every metadata value type (nested arrays included) and three tensors.
pub fn small_fixture() -> GgufBuilder {
    let mut rng = Rng(7);
    let w: Vec<f32> = (0..64 * 3).map(|_| rng.f32()).collect();
    let norm: Vec<f32> = (0..64).map(|_| rng.f32()).collect();
    GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("general.alignment", MetaValue::U32(32))
        .kv("t.u8", MetaValue::U8(200))
        .kv("t.i8", MetaValue::I8(-5))
        .kv("t.u16", MetaValue::U16(60000))
        .kv("t.i16", MetaValue::I16(-30000))
        .kv("t.u32", MetaValue::U32(4_000_000_000))
        .kv("t.i32", MetaValue::I32(-2_000_000_000))
        .kv("t.f32", MetaValue::F32(1.5))
        .kv("t.bool", MetaValue::Bool(true))
        .kv("t.u64", MetaValue::U64(u64::MAX))
        .kv("t.i64", MetaValue::I64(i64::MIN))
        .kv("t.f64", MetaValue::F64(-2.25))
        .kv(
            "t.strings",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("ü€".into()),
            ]),
        )
        .kv(
            "t.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(2)]),
                MetaValue::Array(vec![]),
            ]),
        )
        .tensor(
            "w.q8",
            &[64, 3],
            GgmlType::Q8_0,
            quantize(GgmlType::Q8_0, &w).unwrap(),
        )
        .tensor(
            "w.q4",
            &[64, 3],
            GgmlType::Q4_1,
            quantize(GgmlType::Q4_1, &w).unwrap(),
        )
        .tensor(
            "norm",
            &[64],
            GgmlType::F32,
            quantize(GgmlType::F32, &norm).unwrap(),
        )
}

/// Position of the first occurrence of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in fixture")
}

/// Byte position just after the GGUF string `s` (its u64 length prefix and bytes).
pub fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(bytes, &needle) + needle.len()
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the data-offset field of tensor `name` (which has `n_dims` dims).
pub fn tensor_offset_field(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    after_string(bytes, name) + 4 + 8 * n_dims + 4
}
