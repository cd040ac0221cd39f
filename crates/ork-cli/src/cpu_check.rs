//! The CPU features this binary was compiled to assume, checked first thing in `main`: a build
//! with `-C target-cpu=…` or `-C target-feature=+dotprod` (say) started on a CPU without them
//! would die of SIGILL somewhere inside a kernel; instead it names what is missing and exits 2
//! (docs/device.md, "aarch64"). A default build assumes nothing beyond the target's baseline
//! and passes on every CPU of its architecture; its kernels pick their paths at run time.
//!
//! `std::arch::is_aarch64_feature_detected!` cannot answer this: it returns `true` for a feature
//! the build enables, whatever the CPU. The kernel's answer is read instead: `AT_HWCAP` and
//! `AT_HWCAP2` from `/proc/self/auxv`, with the bits of Linux's
//! `arch/arm64/include/uapi/asm/hwcap.h`.

use std::process::ExitCode;

/// `(feature, auxv entry, bit)`: a Rust target feature and the hwcap bit that says the CPU has
/// it (`AT_HWCAP` = 16, `AT_HWCAP2` = 26).
#[cfg(target_arch = "aarch64")]
const HWCAPS: [(&str, u64, u32); 11] = [
    ("aes", 16, 3),      // HWCAP_AES
    ("sha2", 16, 6),     // HWCAP_SHA2
    ("crc", 16, 7),      // HWCAP_CRC32
    ("lse", 16, 8),      // HWCAP_ATOMICS
    ("fp16", 16, 10),    // HWCAP_ASIMDHP
    ("rcpc", 16, 15),    // HWCAP_LRCPC
    ("sha3", 16, 17),    // HWCAP_SHA3
    ("dotprod", 16, 20), // HWCAP_ASIMDDP
    ("sve", 16, 22),     // HWCAP_SVE
    ("i8mm", 26, 13),    // HWCAP2_I8MM
    ("bf16", 26, 14),    // HWCAP2_BF16
];

/// The features this build was compiled to assume (the `target_feature`s of [`HWCAPS`]).
#[cfg(target_arch = "aarch64")]
fn assumed() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! if_assumed {
        ($($f:tt),+) => { $( if cfg!(target_feature = $f) { v.push($f); } )+ };
    }
    if_assumed!(
        "aes", "sha2", "crc", "lse", "fp16", "rcpc", "sha3", "dotprod", "sve", "i8mm", "bf16"
    );
    v
}

/// `AT_HWCAP` and `AT_HWCAP2` as the kernel gave them to this process (`None` if
/// `/proc/self/auxv` cannot be read).
#[cfg(target_arch = "aarch64")]
fn hwcaps() -> Option<(u64, u64)> {
    let auxv = std::fs::read("/proc/self/auxv").ok()?;
    let (mut hw, mut hw2) = (0, 0);
    for pair in auxv.chunks_exact(16) {
        let key = u64::from_ne_bytes(pair[..8].try_into().ok()?);
        let val = u64::from_ne_bytes(pair[8..].try_into().ok()?);
        match key {
            16 => hw = val,
            26 => hw2 = val,
            _ => {}
        }
    }
    Some((hw, hw2))
}

/// Features this build was compiled to assume that the running CPU lacks (none if the kernel's
/// hwcaps cannot be read: then nothing is refused).
pub fn missing_features() -> Vec<&'static str> {
    #[cfg(target_arch = "aarch64")]
    {
        let wanted = assumed();
        if wanted.is_empty() {
            return wanted;
        }
        let Some((hw, hw2)) = hwcaps() else {
            return Vec::new();
        };
        HWCAPS
            .iter()
            .filter(|(f, at, bit)| {
                let word = if *at == 16 { hw } else { hw2 };
                wanted.contains(f) && (word >> bit) & 1 == 0
            })
            .map(|(f, _, _)| *f)
            .collect()
    }
    #[cfg(not(target_arch = "aarch64"))]
    Vec::new()
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
