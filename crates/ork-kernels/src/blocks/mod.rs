//! Matmuls computed straight from GGUF's quantized blocks, at the file's own bits: the CPU
//! engine's kernels (`--device cpu`, `docs/kernels.md`).
//!
//! A weight row is `k / block_len` consecutive blocks exactly as the GGUF stores them (ggml's
//! `block_q4_0`, `block_q4_K`, … from `ggml/src/ggml-common.h`). Activations are quantized the
//! way ggml's CPU backend does for each weight type (its `vec_dot_type`, `ggml-cpu/ggml-cpu.c`
//! `type_traits_cpu`): Q8_0 blocks for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the
//! k-quants and IQ4_XS, f16 for F16, bf16 for BF16, f32 for F32.
//!
//! Each type has a scalar twin (`Isa::Scalar`) that fixes the order of every floating-point
//! operation; every SIMD kernel (AVX2, AVX-512, NEON, NEON dotprod) reproduces that order, so all
//! ISAs give the same bits (integer partial sums are exact in any order; only the float
//! combination is ordered). Property tests compare each SIMD kernel with its twin bit for bit.
//! The one exception follows llama.cpp: F16 on an aarch64 core with fp16 arithmetic (FEAT_FP16,
//! detected at run time) sums in fp16 in ggml's `ggml_vec_dot_f16` order, with a twin of its own
//! (`float/fp16.rs`), so F16 results depend on the ISA as llama.cpp's do.
//!
//! The entry point is [`Kernel`]: chosen once per weight type and ISA, it quantizes activation
//! rows ([`Kernel::quantize`]) and computes a range of weight rows against `m` activation rows
//! ([`Kernel::rows`]). Threads are the caller's (ork-cpu splits weight rows across its pool).

mod act;
mod act_k;
mod float;
#[cfg(test)]
mod golden;
mod k_quants;
mod legacy;
#[cfg(target_arch = "aarch64")]
mod neon;
mod order;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use crate::tile::Isa;
/// The k-quants' M > 1 driver decodes each weight row once per this many activation rows of
/// `k` columns (the board clock charges the decodes: `ork_board::cpu`).
pub use k_quants::chunk_rows as k_quant_chunk_rows;

/// A GGUF weight type the CPU engine computes in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32 weights: f16 scale, 16 bytes of nibbles.
    Q4_0,
    /// 32 weights: f16 scale and min, 16 bytes of nibbles.
    Q4_1,
    /// 32 weights: f16 scale, 4 bytes of fifth bits, 16 bytes of nibbles.
    Q5_0,
    /// 32 weights: f16 scale and min, fifth bits, nibbles.
    Q5_1,
    /// 32 weights: f16 scale, 32 int8.
    Q8_0,
    /// 256-weight super-block, 2 bits.
    Q2_K,
    /// 256-weight super-block, 3 bits.
    Q3_K,
    /// 256-weight super-block, 4 bits.
    Q4_K,
    /// 256-weight super-block, 5 bits.
    Q5_K,
    /// 256-weight super-block, 6 bits.
    Q6_K,
    /// 32 weights: f16 scale, 16 bytes of 4-bit indices into ggml's non-linear table.
    IQ4_NL,
    /// 256-weight super-block of 4-bit non-linear indices with 6-bit sub-scales.
    IQ4_XS,
}

/// How the activations are stored for a weight type (ggml's `vec_dot_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum ActType {
    /// 32 values: f16 scale `d`, 32 int8 (`block_q8_0`, 34 bytes).
    Q8_0,
    /// 32 values: f16 `d`, f16 `s = d·Σq`, 32 int8 (`block_q8_1`, 36 bytes).
    Q8_1,
    /// 256 values: f32 `d`, 256 int8, 16 i16 sums of 16 (`block_q8_K`, 292 bytes).
    Q8_K,
    /// IEEE half, 2 bytes per value.
    F16,
    /// bfloat16, 2 bytes per value.
    BF16,
    /// f32, 4 bytes per value.
    F32,
}

impl ActType {
    /// `(values per block, bytes per block)`.
    pub const fn geometry(self) -> (usize, usize) {
        match self {
            ActType::Q8_0 => (32, 34),
            ActType::Q8_1 => (32, 36),
            ActType::Q8_K => (256, 292),
            ActType::F16 | ActType::BF16 => (1, 2),
            ActType::F32 => (1, 4),
        }
    }

    /// Bytes of one quantized row of `k` values (`k` a multiple of the block length).
    pub const fn row_bytes(self, k: usize) -> usize {
        let (len, bytes) = self.geometry();
        k / len * bytes
    }
}

impl WeightType {
    /// Every type, in the order of the docs.
    pub const ALL: [WeightType; 15] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q8_0,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::IQ4_NL,
        WeightType::IQ4_XS,
    ];

    /// ggml's name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q5_1 => "Q5_1",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q2_K => "Q2_K",
            WeightType::Q3_K => "Q3_K",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
            WeightType::IQ4_NL => "IQ4_NL",
            WeightType::IQ4_XS => "IQ4_XS",
        }
    }

    /// `(weights per block, bytes per block)` (ggml's `blck_size`, `type_size`).
    pub const fn geometry(self) -> (usize, usize) {
        match self {
            WeightType::F32 => (1, 4),
            WeightType::F16 | WeightType::BF16 => (1, 2),
            WeightType::Q4_0 => (32, 18),
            WeightType::Q4_1 => (32, 20),
            WeightType::Q5_0 => (32, 22),
            WeightType::Q5_1 => (32, 24),
            WeightType::Q8_0 => (32, 34),
            WeightType::Q2_K => (256, 84),
            WeightType::Q3_K => (256, 110),
            WeightType::Q4_K => (256, 144),
            WeightType::Q5_K => (256, 176),
            WeightType::Q6_K => (256, 210),
            WeightType::IQ4_NL => (32, 18),
            WeightType::IQ4_XS => (256, 136),
        }
    }

    /// Bytes of one weight row of `k` values (`k` a multiple of the block length).
    pub const fn row_bytes(self, k: usize) -> usize {
        let (len, bytes) = self.geometry();
        k / len * bytes
    }

    /// How activations are quantized against this type (ggml's `vec_dot_type`).
    pub const fn act_type(self) -> ActType {
        match self {
            WeightType::F32 => ActType::F32,
            WeightType::F16 => ActType::F16,
            WeightType::BF16 => ActType::BF16,
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::IQ4_NL => {
                ActType::Q8_0
            }
            WeightType::Q4_1 | WeightType::Q5_1 => ActType::Q8_1,
            WeightType::Q2_K
            | WeightType::Q3_K
            | WeightType::Q4_K
            | WeightType::Q5_K
            | WeightType::Q6_K
            | WeightType::IQ4_XS => ActType::Q8_K,
        }
    }
}

/// `out[r·m + i] = Σ_k W[r, k] · A[i, k]` for `rows` weight rows (`w`, each
/// `WeightType::row_bytes(k)` bytes) against `m` quantized activation rows (`acts`, each
/// `ActType::row_bytes(k)` bytes). The caller has checked every length.
pub(crate) type RowsFn =
    fn(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]);

/// Quantize one activation row `x` (its length a multiple of the block length) into `dst`
/// (exactly `ActType::row_bytes(x.len())` bytes).
pub(crate) type QuantFn = fn(x: &[f32], dst: &mut [u8]);

/// A family of kernels (the float types, the 32-weight blocks, the k-quants): the one table
/// [`Kernel::with_isa`] reads, after checking that this CPU runs the ISA.
#[derive(Clone, Copy)]
pub(crate) struct Family {
    /// The scalar twin of a type, `None` for a type outside the family.
    scalar: fn(WeightType) -> Option<RowsFn>,
    /// The SIMD kernel of a type on one of this architecture's SIMD ISAs (x86-64: AVX2,
    /// AVX-VNNI, AVX-512 VNNI; aarch64: NEON, NEON dotprod), `None` where the family has none.
    simd: fn(WeightType, Isa) -> Option<RowsFn>,
}

/// One weight type's kernels on one ISA.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    ty: WeightType,
    isa: Isa,
    rows: RowsFn,
    quant: QuantFn,
}

impl Kernel {
    /// The fastest kernel this CPU runs for `ty` (the best of [`Isa::available`] that has one;
    /// the scalar twin always does). `None` only for a type with no kernel at all.
    pub fn best(ty: WeightType) -> Option<Kernel> {
        Isa::available()
            .into_iter()
            .rev()
            .find_map(|isa| Kernel::with_isa(ty, isa))
    }

    /// The kernel for `ty` on `isa`, if one exists and this CPU runs `isa`.
    pub fn with_isa(ty: WeightType, isa: Isa) -> Option<Kernel> {
        if !Isa::available().contains(&isa) {
            return None;
        }
        let family = match ty {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => float::FAMILY,
            WeightType::Q4_0
            | WeightType::Q4_1
            | WeightType::Q5_0
            | WeightType::Q5_1
            | WeightType::Q8_0
            | WeightType::IQ4_NL => legacy::FAMILY,
            WeightType::Q2_K
            | WeightType::Q3_K
            | WeightType::Q4_K
            | WeightType::Q5_K
            | WeightType::Q6_K
            | WeightType::IQ4_XS => k_quants::FAMILY,
        };
        let rows = match isa {
            Isa::Scalar => (family.scalar)(ty),
            _ => (family.simd)(ty, isa),
        }?;
        let quant = act::quantizer(ty.act_type(), isa)?;
        Some(Kernel {
            ty,
            isa,
            rows,
            quant,
        })
    }

    /// The weight type.
    pub fn weight_type(&self) -> WeightType {
        self.ty
    }

    /// The ISA the kernel runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The activation storage this kernel reads.
    pub fn act_type(&self) -> ActType {
        self.ty.act_type()
    }

    /// Quantize activation rows: `x` is `m × k` f32, `dst` is `m` rows of
    /// `ActType::row_bytes(k)` bytes.
    ///
    /// # Panics
    /// If `k` is not a multiple of the activation block or a length is wrong (the engine checks
    /// shapes when the model loads).
    pub fn quantize(&self, x: &[f32], k: usize, dst: &mut [u8]) {
        let act = self.act_type();
        let (len, _) = act.geometry();
        let rb = act.row_bytes(k);
        assert!(k > 0 && k.is_multiple_of(len) && x.len().is_multiple_of(k));
        assert_eq!(dst.len(), x.len() / k * rb);
        for (row, out) in x.chunks_exact(k).zip(dst.chunks_exact_mut(rb)) {
            (self.quant)(row, out);
        }
    }

    /// `out[r·m + i] = Σ_k W[r, k] · A[i, k]` for `rows` consecutive weight rows in `w` against
    /// the `m` activation rows in `acts` (from [`Kernel::quantize`]).
    ///
    /// # Panics
    /// If a length does not match `k`, `rows` and `m`.
    pub fn rows(&self, k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
        let (len, _) = self.ty.geometry();
        assert!(k > 0 && k.is_multiple_of(len));
        assert_eq!(w.len(), rows * self.ty.row_bytes(k));
        assert_eq!(acts.len(), m * self.act_type().row_bytes(k));
        assert_eq!(out.len(), rows * m);
        (self.rows)(k, w, rows, acts, m, out);
    }
}

#[cfg(test)]
mod tests {
    use super::{Isa, Kernel, WeightType};

    /// The dispatch table hands out each type's scalar twin, and on aarch64 a NEON kernel for
    /// every type on both NEON ISAs; on x86-64 with AVX2 and F16C, `best` is a SIMD kernel for
    /// every type. The property tests skip an ISA that has no kernel, so a dispatch slip would
    /// otherwise make them test less without failing.
    #[test]
    fn every_type_has_its_kernels() {
        for ty in WeightType::ALL {
            let twin = Kernel::with_isa(ty, Isa::Scalar).expect("scalar twin");
            assert_eq!((twin.weight_type(), twin.isa()), (ty, Isa::Scalar));
            for isa in Isa::available() {
                if cfg!(target_arch = "aarch64") {
                    let k = Kernel::with_isa(ty, isa).expect("a kernel on every aarch64 ISA");
                    assert_eq!((k.weight_type(), k.isa()), (ty, isa));
                }
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
                let best = Kernel::best(ty).expect("a kernel");
                assert_ne!(best.isa(), Isa::Scalar, "{ty:?}");
            }
        }
    }
}
