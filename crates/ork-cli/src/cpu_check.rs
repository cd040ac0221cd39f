//! The CPU features this binary was compiled to assume, checked first thing in `main`: a build
//! with `-C target-cpu=…` or `-C target-feature=+dotprod` (say) started on a CPU without them
//! would die of SIGILL somewhere inside a kernel; instead it names what is missing and exits 2
//! (docs/device.md, "aarch64"). A default build assumes nothing beyond the target's baseline
//! and passes on every CPU of its architecture; its kernels pick their paths at run time.

use std::process::ExitCode;

/// Declares, for each feature name, "if this build assumes it, the CPU must have it".
macro_rules! assumed_but_absent {
    ($detect:ident, $missing:ident, $($feature:tt),+ $(,)?) => {
        $(
            #[cfg(target_feature = $feature)]
            if !std::arch::$detect!($feature) {
                $missing.push($feature);
            }
        )+
    };
}

/// Features this build was compiled to assume that the running CPU lacks.
pub fn missing_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut missing = Vec::new();
    #[cfg(target_arch = "aarch64")]
    assumed_but_absent!(
        is_aarch64_feature_detected,
        missing,
        "dotprod",
        "fp16",
        "i8mm",
        "bf16",
        "sve",
        "sve2",
        "lse",
        "rcpc",
        "crc",
        "aes",
        "sha2",
        "sha3",
    );
    #[cfg(target_arch = "x86_64")]
    assumed_but_absent!(
        is_x86_feature_detected,
        missing,
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512vnni",
        "avxvnni",
    );
    missing
}

/// `Err(exit code 2)` after one line on stderr if the CPU lacks a feature this build assumes.
pub fn refuse_missing() -> Result<(), ExitCode> {
    let missing = missing_features();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "error: this ork was built for CPUs with {m}, and this CPU lacks {m}: use a build for \
         the target's baseline (the release package is one; it picks its kernels at run time) \
         or rebuild without -C target-cpu / -C target-feature",
        m = missing.join(", ")
    );
    Err(ExitCode::from(2))
}

#[cfg(test)]
mod tests {
    /// The build running the tests was made for this machine's CPU (or a baseline one), so
    /// nothing it assumes is missing.
    #[test]
    fn the_running_cpu_has_what_this_build_assumes() {
        assert_eq!(super::missing_features(), Vec::<&str>::new());
    }
}
