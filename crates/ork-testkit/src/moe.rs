//! Mixture-of-Experts test models made from the real SmolLM2 GGUF (no small real MoE GGUF is
//! reachable): generated once, deterministically, and cached under `.cache/moe/` at the
//! repository root. The layouts are llama.cpp's (docs/moe.md): `blk.N.ffn_gate_inp.weight`
//! `[n_embd, n_expert]` (the router), `blk.N.ffn_{gate,up}_exps.weight` `[n_embd, n_ff, n_expert]`,
//! `blk.N.ffn_down_exps.weight` `[n_ff, n_embd, n_expert]`, each expert's rows contiguous.
//!
//! - [`MoeFixture::Identical`]: `llama` with 8 experts, top-2, a seeded random F32 router, every
//!   expert the dense FFN's bytes. Routing weights are renormalized to sum 1, so it computes the
//!   dense model.
//! - [`MoeFixture::Perturbed`]: the same, with every quant block of expert `e` rescaled by a
//!   seeded factor in [0.75, 1.25) (its `d`, and `m` for Q4_1), so routing changes the result.
//! - [`MoeFixture::Qwen3Moe`] / [`MoeFixture::Qwen2Moe`]: the first 6 blocks of SmolLM2, every
//!   tensor dequantized to F32 (so llama.cpp's products are exact f32 ones, as ork's reference), as a
//!   `qwen3moe` (seeded q/k norms, no shared expert) or a `qwen2moe` (seeded q/k/v biases, a
//!   shared expert with a seeded sigmoid gate vector), 8 experts, top-2, each expert a 192-wide
//!   slice of the dense FFN (rows of gate/up, the matching columns of down); the shared expert is
//!   the first 384 columns of the dense FFN, and `output.weight` a copy of the embedding
//!   (llama.cpp's qwen2moe requires one).
//!
//! Changing what a fixture contains must change its [`MoeFixture::file_name`] (the version
//! suffix): the llama.cpp goldens (scripts/moe_golden.py) are made from these files.
use crate::Rng;
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile, MetaValue, TensorInfo};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Experts per MoE block of every fixture.
pub const N_EXPERT: usize = 8;
/// Experts used per token of every fixture.
pub const N_EXPERT_USED: usize = 2;
/// Blocks of the synthetic qwen fixtures.
pub const QWEN_LAYERS: usize = 6;
/// Expert FFN width of the synthetic qwen fixtures.
pub const QWEN_FF_EXP: usize = 192;
/// Shared expert FFN width of the synthetic qwen2moe fixture.
pub const QWEN_FF_SHEXP: usize = 384;

/// Which MoE model to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeFixture {
    /// Upcycled SmolLM2, 8 identical experts (the dense model's function).
    Identical,
    /// Upcycled SmolLM2, 8 deterministically perturbed experts.
    Perturbed,
    /// 6-block `qwen3moe` from SmolLM2's weights.
    Qwen3Moe,
    /// 6-block `qwen2moe` with a shared expert from SmolLM2's weights.
    Qwen2Moe,
}

impl MoeFixture {
    /// Every fixture.
    pub const ALL: [MoeFixture; 4] = [
        MoeFixture::Identical,
        MoeFixture::Perturbed,
        MoeFixture::Qwen3Moe,
        MoeFixture::Qwen2Moe,
    ];

    /// The cached file's name (with the generator's version).
    pub fn file_name(self) -> &'static str {
        match self {
            MoeFixture::Identical => "smollm2-moe8-identical.v1.gguf",
            MoeFixture::Perturbed => "smollm2-moe8-perturbed.v1.gguf",
            MoeFixture::Qwen3Moe => "smollm2-qwen3moe.v2.gguf",
            MoeFixture::Qwen2Moe => "smollm2-qwen2moe.v2.gguf",
        }
    }

    /// A short name (`identical`, `perturbed`, `qwen3moe`, `qwen2moe`).
    pub fn name(self) -> &'static str {
        match self {
            MoeFixture::Identical => "identical",
            MoeFixture::Perturbed => "perturbed",
            MoeFixture::Qwen3Moe => "qwen3moe",
            MoeFixture::Qwen2Moe => "qwen2moe",
        }
    }
}

/// The fixture's path, made from [`crate::model_path`] on first use (once per process; the file
/// is written to a temporary name and renamed, so a concurrent maker elsewhere is harmless).
///
/// # Panics
/// If the real model is missing or the fixture cannot be written.
pub fn moe_fixture(kind: MoeFixture) -> PathBuf {
    static MADE: OnceLock<Mutex<()>> = OnceLock::new();
    let _guard = MADE
        .get_or_init(|| Mutex::new(()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/moe");
    let path = dir.join(kind.file_name());
    if !path.is_file() {
        std::fs::create_dir_all(&dir).expect("create .cache/moe");
        let src = GgufFile::open(&crate::model_path()).expect("open the real model");
        make(kind, &src, &path).unwrap_or_else(|e| panic!("making {}: {e}", path.display()));
    }
    path
}

/// Make fixture `kind` from SmolLM2 `src` and write it (atomically) to `dst`.
///
/// # Errors
/// A tensor the generator needs is missing or of a type it cannot slice, or the write fails.
pub fn make(kind: MoeFixture, src: &GgufFile, dst: &Path) -> Result<(), String> {
    let b = match kind {
        MoeFixture::Identical => upcycle(src, false)?,
        MoeFixture::Perturbed => upcycle(src, true)?,
        MoeFixture::Qwen3Moe => qwen(src, "qwen3moe")?,
        MoeFixture::Qwen2Moe => qwen(src, "qwen2moe")?,
    };
    b.write(dst).map_err(|e| e.to_string())
}

fn u32v(v: usize) -> MetaValue {
    MetaValue::U32(v as u32)
}

fn tensor<'g>(src: &'g GgufFile, name: &str) -> Result<&'g TensorInfo, String> {
    src.tensor(name)
        .ok_or_else(|| format!("{}: no tensor '{name}'", src.path().display()))
}

/// Bytes of one quant block and where its f16 scale (and Q4_1's f16 min) sit.
fn block_geometry(ty: GgmlType) -> Result<(usize, usize, bool), String> {
    match ty {
        GgmlType::Q4_0 => Ok((32, 18, false)),
        GgmlType::Q4_1 => Ok((32, 20, true)),
        GgmlType::Q8_0 => Ok((32, 34, false)),
        other => Err(format!("cannot perturb {other:?} blocks")),
    }
}

/// Multiply every block's scale (and min) by a seeded factor in [0.75, 1.25).
fn perturb(bytes: &mut [u8], ty: GgmlType, seed: u64) -> Result<(), String> {
    let (_, block, has_min) = block_geometry(ty)?;
    let mut rng = Rng::new(seed);
    let scale = |b: &mut [u8], f: f32| {
        let v = half::f16::from_le_bytes([b[0], b[1]]).to_f32() * f;
        b.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
    };
    for blk in bytes.chunks_exact_mut(block) {
        let f = 1.0 + 0.25 * rng.f32();
        scale(&mut blk[0..2], f);
        if has_min {
            scale(&mut blk[2..4], f);
        }
    }
    Ok(())
}

/// Copy every metadata pair, renaming `llama.*` keys to `arch.*` and replacing those in
/// `replace` (by suffix after the arch prefix).
fn metadata(src: &GgufFile, arch: &str, replace: &[(&str, MetaValue)]) -> GgufBuilder {
    let mut b = GgufBuilder::new();
    for (k, v) in src.metadata_iter() {
        if k == "general.architecture" {
            b = b.kv(k, MetaValue::String(arch.into()));
        } else if let Some(suffix) = k.strip_prefix("llama.") {
            let v = replace
                .iter()
                .find(|(s, _)| *s == suffix)
                .map_or_else(|| v.clone(), |(_, r)| r.clone());
            b = b.kv(format!("{arch}.{suffix}"), v);
        } else {
            b = b.kv(k, v.clone());
        }
    }
    for (suffix, v) in replace {
        if src.metadata(&format!("llama.{suffix}")).is_none() {
            b = b.kv(format!("{arch}.{suffix}"), v.clone());
        }
    }
    b
}

fn seed(parts: &[u64]) -> u64 {
    parts.iter().fold(0x4d6f_4521_u64, |acc, &p| {
        Rng::new(acc ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
    })
}

fn router(n_embd: usize, layer: usize) -> Vec<f32> {
    Rng::new(seed(&[1, layer as u64])).vec(n_embd * N_EXPERT, 0.05)
}

/// SmolLM2 as a `llama` MoE: the dense FFN of every block becomes 8 experts.
fn upcycle(src: &GgufFile, perturbed: bool) -> Result<GgufBuilder, String> {
    let mut b = metadata(
        src,
        "llama",
        &[
            ("expert_count", u32v(N_EXPERT)),
            ("expert_used_count", u32v(N_EXPERT_USED)),
        ],
    );
    for t in src.tensors() {
        let Some((layer, role)) = ffn_role(&t.name) else {
            b = b.tensor(&t.name, &t.dims, t.ty, src.tensor_data(t).to_vec());
            continue;
        };
        if role == "gate" {
            let n_embd = t.dims[0] as usize;
            b = b
                .tensor_f32(
                    format!("blk.{layer}.ffn_gate_inp.weight"),
                    &[n_embd as u64, N_EXPERT as u64],
                    GgmlType::F32,
                    &router(n_embd, layer),
                )
                .map_err(|e| e.to_string())?;
        }
        let dense = src.tensor_data(t);
        let mut data = Vec::with_capacity(dense.len() * N_EXPERT);
        for e in 0..N_EXPERT {
            let start = data.len();
            data.extend_from_slice(dense);
            if perturbed {
                let role_id = role.len() as u64;
                perturb(
                    &mut data[start..],
                    t.ty,
                    seed(&[2, layer as u64, role_id, e as u64]),
                )?;
            }
        }
        b = b.tensor(
            format!("blk.{layer}.ffn_{role}_exps.weight"),
            &[t.dims[0], t.dims[1], N_EXPERT as u64],
            t.ty,
            data,
        );
    }
    Ok(b)
}

/// `blk.N.ffn_{gate,up,down}.weight` → (N, role).
fn ffn_role(name: &str) -> Option<(usize, &'static str)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let role = match suffix {
        "ffn_gate.weight" => "gate",
        "ffn_up.weight" => "up",
        "ffn_down.weight" => "down",
        _ => return None,
    };
    Some((layer.parse().ok()?, role))
}

/// A tensor of `src` dequantized to f32.
fn f32_of(src: &GgufFile, name: &str) -> Result<Vec<f32>, String> {
    let t = tensor(src, name)?;
    src.dequantize_tensor(t).map_err(|e| e.to_string())
}

/// Columns `c0..c1` of every row (rows of `row_len` values).
fn columns(values: &[f32], row_len: usize, c0: usize, c1: usize) -> Vec<f32> {
    values
        .chunks_exact(row_len)
        .flat_map(|r| r[c0..c1].iter().copied())
        .collect()
}

/// The first 6 blocks of SmolLM2 as `arch` (`qwen3moe` or `qwen2moe`), every tensor in F32 so
/// that llama.cpp computes the same products as ork's f32 reference (tight goldens).
fn qwen(src: &GgufFile, arch: &str) -> Result<GgufBuilder, String> {
    let shared = arch == "qwen2moe";
    let mut replace = vec![
        ("block_count", u32v(QWEN_LAYERS)),
        ("context_length", u32v(2048)),
        ("expert_count", u32v(N_EXPERT)),
        ("expert_used_count", u32v(N_EXPERT_USED)),
        ("expert_feed_forward_length", u32v(QWEN_FF_EXP)),
    ];
    if shared {
        replace.push(("expert_shared_feed_forward_length", u32v(QWEN_FF_SHEXP)));
    }
    let mut b = metadata(src, arch, &replace);
    let f32t = GgmlType::F32;
    let put = |b: GgufBuilder, name: &str, dims: &[u64], v: &[f32]| {
        b.tensor_f32(name, dims, f32t, v).map_err(|e| e.to_string())
    };
    let copy = |b: GgufBuilder, name: &str| -> Result<GgufBuilder, String> {
        let dims = tensor(src, name)?.dims.clone();
        put(b, name, &dims, &f32_of(src, name)?)
    };
    b = copy(b, "token_embd.weight")?;
    b = copy(b, "output_norm.weight")?;
    if shared {
        // llama.cpp's qwen2moe requires an output projection: the (tied) embedding.
        let dims = tensor(src, "token_embd.weight")?.dims.clone();
        b = put(
            b,
            "output.weight",
            &dims,
            &f32_of(src, "token_embd.weight")?,
        )?;
    }
    let n_embd = tensor(src, "output_norm.weight")?.dims[0] as usize;
    let head_dim = 64usize;
    for l in 0..QWEN_LAYERS {
        let t = |s: &str| format!("blk.{l}.{s}");
        let mut rng = Rng::new(seed(&[3, l as u64, shared as u64]));
        for s in [
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_norm.weight",
        ] {
            b = copy(b, &t(s))?;
        }
        let mut vector = |b: GgufBuilder, name: String, n: usize, scale: f32, offset: f32| {
            let v: Vec<f32> = rng.vec(n, scale).into_iter().map(|x| x + offset).collect();
            put(b, &name, &[n as u64], &v)
        };
        if shared {
            let q = tensor(src, &t("attn_q.weight"))?.dims[1] as usize;
            let kv = tensor(src, &t("attn_k.weight"))?.dims[1] as usize;
            b = vector(b, t("attn_q.bias"), q, 0.1, 0.0)?;
            b = vector(b, t("attn_k.bias"), kv, 0.1, 0.0)?;
            b = vector(b, t("attn_v.bias"), kv, 0.1, 0.0)?;
            b = vector(b, t("ffn_gate_inp_shexp.weight"), n_embd, 0.1, 0.0)?;
        } else {
            b = vector(b, t("attn_q_norm.weight"), head_dim, 0.1, 1.0)?;
            b = vector(b, t("attn_k_norm.weight"), head_dim, 0.1, 1.0)?;
        }
        let (ne, e) = (n_embd as u64, N_EXPERT as u64);
        b = put(b, &t("ffn_gate_inp.weight"), &[ne, e], &router(n_embd, l))?;
        let gate = f32_of(src, &t("ffn_gate.weight"))?;
        let up = f32_of(src, &t("ffn_up.weight"))?;
        let down = f32_of(src, &t("ffn_down.weight"))?;
        let n_ff = down.len() / n_embd;
        let ff = QWEN_FF_EXP;
        // gate/up: rows e·ff.. of [n_ff rows × n_embd]; down: the matching columns of
        // [n_embd rows × n_ff].
        let rows = |w: &[f32], r0: usize, r1: usize| w[r0 * n_embd..r1 * n_embd].to_vec();
        let (mut g, mut u, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for x in 0..N_EXPERT {
            g.extend(rows(&gate, x * ff, (x + 1) * ff));
            u.extend(rows(&up, x * ff, (x + 1) * ff));
            d.extend(columns(&down, n_ff, x * ff, (x + 1) * ff));
        }
        let ffu = ff as u64;
        b = put(b, &t("ffn_gate_exps.weight"), &[ne, ffu, e], &g)?;
        b = put(b, &t("ffn_up_exps.weight"), &[ne, ffu, e], &u)?;
        b = put(b, &t("ffn_down_exps.weight"), &[ffu, ne, e], &d)?;
        if shared {
            let s = QWEN_FF_SHEXP;
            let su = s as u64;
            b = put(
                b,
                &t("ffn_gate_shexp.weight"),
                &[ne, su],
                &rows(&gate, 0, s),
            )?;
            b = put(b, &t("ffn_up_shexp.weight"), &[ne, su], &rows(&up, 0, s))?;
            b = put(
                b,
                &t("ffn_down_shexp.weight"),
                &[su, ne],
                &columns(&down, n_ff, 0, s),
            )?;
        }
    }
    Ok(b)
}
