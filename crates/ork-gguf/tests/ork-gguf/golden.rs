//! Bit-exact agreement with gguf-py's `gguf.quants` (vectors made by `scripts/golden.py`).
use ork_gguf::dequant::dequantize;
use ork_gguf::writer::{quantize, GgufBuilder};
use ork_gguf::{GgmlType, GgufFile};
use std::path::PathBuf;

const DECODABLE: [&str; 13] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

struct DequantGolden {
    ty: GgmlType,
    n_blocks: usize,
    block_size: usize,
    blocks: Vec<u8>,
    expected: Vec<f32>,
}

fn load_dequant(name: &str) -> DequantGolden {
    let path = golden_dir().join(format!("dequant_{name}.bin"));
    let b = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/golden.py)", path.display()));
    assert_eq!(&b[..4], b"ORKG");
    assert_eq!(u32_at(&b, 4), 1, "format version");
    let ty = GgmlType::from_id(u32_at(&b, 8));
    let (n_blocks, block_size, type_size) = (
        u32_at(&b, 12) as usize,
        u32_at(&b, 16) as usize,
        u32_at(&b, 20) as usize,
    );
    assert_eq!(ty.to_string(), name);
    assert_eq!(ty.block_size(), Some(block_size as u64));
    assert_eq!(ty.type_size(), Some(type_size as u64));
    let blocks_end = 24 + n_blocks * type_size;
    assert_eq!(b.len(), blocks_end + 4 * n_blocks * block_size);
    DequantGolden {
        ty,
        n_blocks,
        block_size,
        blocks: b[24..blocks_end].to_vec(),
        expected: f32s(&b[blocks_end..]),
    }
}

fn assert_bits_eq(name: &str, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{name}: value {i}: got {g:e}, gguf-py {e:e}"
        );
    }
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for name in DECODABLE {
        let g = load_dequant(name);
        let mut out = vec![f32::NAN; g.n_blocks * g.block_size];
        dequantize(g.ty, &g.blocks, &mut out).unwrap();
        assert_bits_eq(name, &out, &g.expected);
    }
}

#[test]
fn dequantize_rows_from_a_file_matches_gguf_py() {
    // The same blocks as a tensor of 2 rows inside a GGUF file, decoded row by row and together.
    for name in DECODABLE {
        let g = load_dequant(name);
        let n = (g.n_blocks * g.block_size) as u64;
        let bytes = GgufBuilder::new()
            .tensor("t", &[n / 2, 2], g.ty, g.blocks.clone())
            .to_bytes()
            .unwrap();
        let file = GgufFile::from_bytes(name, bytes).unwrap();
        let t = file.tensor("t").unwrap();
        assert_eq!(t.n_rows(), 2);
        let mut row = vec![0f32; (n / 2) as usize];
        file.dequantize_rows(t, 1, &mut row).unwrap();
        assert_bits_eq(name, &row, &g.expected[(n / 2) as usize..]);
        let all = file.dequantize_tensor(t).unwrap();
        assert_bits_eq(name, &all, &g.expected);
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    for name in ["F16", "Q8_0", "Q4_0", "Q4_1"] {
        let path = golden_dir().join(format!("quantize_{name}.bin"));
        let b = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/golden.py)", path.display()));
        assert_eq!(&b[..4], b"ORKQ");
        assert_eq!(u32_at(&b, 4), 1);
        let ty = GgmlType::from_id(u32_at(&b, 8));
        assert_eq!(ty.to_string(), name);
        let (n, n_bytes) = (u32_at(&b, 12) as usize, u32_at(&b, 16) as usize);
        let x = f32s(&b[20..20 + 4 * n]);
        let expected = &b[20 + 4 * n..];
        assert_eq!(expected.len(), n_bytes);
        let got = quantize(ty, &x).unwrap();
        if let Some(i) = got.iter().zip(expected).position(|(a, b)| a != b) {
            panic!(
                "{name}: byte {i} (block {}) differs: {} vs gguf-py {}",
                i / ty.type_size().unwrap() as usize,
                got[i],
                expected[i]
            );
        }
        assert_eq!(got.len(), expected.len());
    }
}
