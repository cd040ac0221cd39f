//! Running a hot f32 loop compiled for the widest vectors the CPU has, with the same results.
//!
//! The workspace builds for baseline x86-64 (SSE2), so the executor's own f32 loops run four
//! lanes wide. [`wide`] runs a [`Kernel`] in a function compiled for AVX2 and FMA when the CPU
//! has both, so that the loops its `run` inlines run eight lanes wide and `f32::mul_add` is one
//! instruction. The results are the same bits either way: the loops spell out their lanes and
//! their order of additions, the compiler never contracts `a * b + c` into a fused
//! multiply-add unless asked to, and `mul_add` rounds once in every build (libm's `fmaf` in the
//! baseline one). ork-exec's attention ([`crate::attend`]) and its SwiGLU run this way (figures
//! in docs/benchmarks.md, "End to end against llama.cpp"). On aarch64 there is no wider vector
//! than the baseline's 128-bit Advanced SIMD (the Cortex-A76 has no SVE), so `run` runs as
//! compiled (`docs/kernels.md`).

/// A piece of work whose `run` is inlined into [`wide`]'s AVX2 copy (mark it
/// `#[inline(always)]`; a closure would not be inlined there).
pub trait Kernel {
    /// What the work returns.
    type Out;
    /// Do the work.
    fn run(self) -> Self::Out;
}

/// `k.run()`, compiled for AVX2 and FMA where the CPU has both (the code `run` inlines, not the
/// functions it calls out of line).
#[inline(always)]
pub fn wide<K: Kernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above), the features `avx2` is
        // compiled for.
        return unsafe { avx2(k) };
    }
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn avx2<K: Kernel>(k: K) -> K::Out {
    k.run()
}

#[cfg(test)]
mod tests {
    use crate::attend::{dot, dot_wide};

    /// The same f32 loop gives the same bits in and out of [`super::wide`].
    #[test]
    fn a_wide_loop_gives_the_bits_of_the_narrow_one() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        for len in [0, 1, 7, 8, 9, 64, 100, 1000] {
            let narrow = dot(&a[..len], &b[..len]);
            let wide = dot_wide(&a[..len], &b[..len]);
            assert_eq!(narrow.to_bits(), wide.to_bits(), "len {len}");
        }
    }
}
