//! Small models for the CPU engine's tests, made from the real SmolLM2 GGUF: its first blocks,
//! every matmul weight of those blocks stored in one type (requantized through ork-gguf's
//! writer, which follows ggml's reference quantizers), the embedding kept as the file has it
//! (Q4_1; SmolLM2 ties the output projection to it, so that weight is computed from Q4_1
//! blocks in every fixture).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ork_cpu::{CpuOptions, CpuPool, GgufLinear};
use ork_gguf::writer::{quantize, GgufBuilder};
use ork_gguf::{GgmlType, GgufFile, MetaValue};

/// Blocks kept.
pub const LAYERS: usize = 2;

/// Directory of the fixtures, made once per test process (removed by the next run's first
/// call, `ork_testkit::process_dir`).
fn dir() -> &'static std::path::Path {
    ork_testkit::process_dir()
}

/// SmolLM2's first [`LAYERS`] blocks with their matmul weights in `ty` (F32, F16, BF16, Q8_0,
/// Q4_0 or Q4_1).
pub fn smollm2_in(ty: GgmlType) -> PathBuf {
    requantized(&ork_testkit::model_path(), "smollm2", LAYERS, ty)
}

/// The MoE fixture `qwen3moe` (ork-testkit: 8 experts, top-2, F32) with its block weights,
/// experts included, in `ty`.
pub fn qwen3moe_in(ty: GgmlType) -> PathBuf {
    let src = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    requantized(&src, "qwen3moe", ork_testkit::moe::QWEN_LAYERS, ty)
}

/// The model at `src` cut to its first `layers` blocks, every block weight of two or more
/// dimensions stored in `ty`; written once per test process.
fn requantized(src: &std::path::Path, label: &str, layers: usize, ty: GgmlType) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir().join(format!("{label}-{layers}-{ty}.gguf"));
    if path.is_file() {
        return path;
    }
    let src = GgufFile::open(src).unwrap();
    let keep = |name: &str| match name.strip_prefix("blk.") {
        Some(rest) => rest
            .split('.')
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < layers),
        None => true,
    };
    let arch = src
        .metadata("general.architecture")
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    let block_count = format!("{arch}.block_count");
    let mut b = GgufBuilder::new();
    for (k, v) in src.metadata_iter() {
        let v = if k == block_count {
            MetaValue::U32(layers as u32)
        } else {
            v.clone()
        };
        b = b.kv(k, v);
    }
    for t in src.tensors().iter().filter(|t| keep(&t.name)) {
        // Block weights of two or more dimensions are the matmul weights (a router is one).
        let matmul = t.dims.len() >= 2 && t.name.starts_with("blk.");
        if matmul {
            let values = src.dequantize_tensor(t).unwrap();
            b = b.tensor(&t.name, &t.dims, ty, quantize(ty, &values).unwrap());
        } else {
            b = b.tensor(&t.name, &t.dims, t.ty, src.tensor_data(t).to_vec());
        }
    }
    b.write(&path).unwrap();
    path
}

/// A pool of `threads` workers on this machine.
pub fn pool(threads: usize) -> Arc<CpuPool> {
    Arc::new(
        CpuPool::new(&CpuOptions {
            threads: Some(threads),
            cpus: None,
            ..CpuOptions::default()
        })
        .unwrap(),
    )
}

/// The model at `path`, its CPU engine (`threads` workers) and its f32 reference.
pub fn open(
    path: &std::path::Path,
    threads: usize,
) -> (
    Arc<ork_exec::Model>,
    Arc<GgufLinear>,
    Arc<ork_exec::CpuF32Linear>,
) {
    let gguf = Arc::new(GgufFile::open(path).unwrap());
    let model = Arc::new(ork_exec::Model::load(&gguf).unwrap());
    let specs = model.matmul_weights();
    let cpu = GgufLinear::open(Arc::clone(&gguf), specs, pool(threads)).unwrap();
    let reference = ork_exec::CpuF32Linear::from_gguf(&gguf, specs).unwrap();
    (model, Arc::new(cpu), Arc::new(reference))
}
