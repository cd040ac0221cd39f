//! Helpers that ork's test suites share, so that each exists once: where the real test model
//! is, a seeded generator for fixture data, and a small filesystem that fills up on demand.
//!
//! A dev-dependency only: no library crate of ork depends on it.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod forge;
pub mod gemma3_golden;
pub mod moe;
pub mod rope;
pub mod sparse;

use std::path::PathBuf;
use std::process::Command;

/// A directory for the fixtures one test process shares across its tests (a pack converted
/// once, requantized copies), under `$TMPDIR/ork-test-fixtures/<pid>`.
///
/// A `static` is never dropped, so a `TempDir` held in one would be left behind by every run
/// (about 100 MB each). Instead, the first call removes the directories of test processes that
/// no longer run (no `/proc/<pid>`), then makes this process's own, empty.
///
/// # Panics
/// If the directory cannot be made.
pub fn process_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir().join("ork-test-fixtures");
        std::fs::create_dir_all(&root)
            .unwrap_or_else(|e| panic!("cannot make {}: {e}", root.display()));
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if !PathBuf::from(format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = root.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot make {}: {e}", dir.display()));
        dir
    })
}

/// The real test model (SmolLM2-135M-Instruct Q4_1): `$ORK_MODEL`, or where
/// `scripts/fetch-model.sh` puts it (`.cache/` at the repository root).
///
/// # Panics
/// If the file is missing, naming the fix: the real-model tests fail, they never skip.
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("ORK_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../.cache/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "real model not found at {}: run scripts/fetch-model.sh (or set ORK_MODEL)",
        path.display()
    );
    path
}

/// The second real test model (Gemma 3 270M, Q4_K_M): `$ORK_GEMMA3`, or where
/// `scripts/fetch-model.sh gemma3` puts it (`.cache/` at the repository root).
///
/// # Panics
/// If the file is missing, naming the fix: the real-model tests fail, they never skip.
pub fn gemma3_path() -> PathBuf {
    let path = std::env::var_os("ORK_GEMMA3")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        path.is_file(),
        "Gemma 3 model not found at {}: run scripts/fetch-model.sh gemma3 (or set ORK_GEMMA3)",
        path.display()
    );
    path
}

/// The CI stand-in of the vendor NPU runtime (`crates/ork-rknn-standin`, a shared library):
/// `$ORK_RKNN_LIB`, or `target/debug/libork_rknn_standin.so` at the repository root, where
/// `scripts/test.sh` builds it (`cargo build -p ork-rknn-standin`) before the tests run.
///
/// # Panics
/// If the file is missing, naming the fix: the tests that need it fail, they never skip.
pub fn rknn_standin() -> PathBuf {
    let path = std::env::var_os("ORK_RKNN_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/debug/libork_rknn_standin.so")
        });
    assert!(
        path.is_file(),
        "the rknn stand-in runtime is not at {}: run `cargo build -p ork-rknn-standin` \
         (scripts/test.sh does) or set ORK_RKNN_LIB",
        path.display()
    );
    path
}

/// A deterministic generator (SplitMix64) for fixture weights, inputs and access sequences:
/// the same seed gives the same stream on every machine, with no RNG crate.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant for fixtures).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in [-1, 1), on a grid of 2⁻²³.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// A random int8 value.
    pub fn i8(&mut self) -> i8 {
        self.next_u64() as i8
    }
}

/// A tmpfs of a given size mounted on a fresh directory and unmounted on drop: a disk that
/// really fills up (ENOSPC), for the full-disk tests.
#[derive(Debug)]
pub struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    /// Mount a tmpfs of `size` (as `mount -o size=`, e.g. `"1m"`).
    ///
    /// # Errors
    /// Why it could not be mounted (not root, no `mount`, a sandbox): the caller decides whether
    /// to fall back or to skip with that reason printed.
    pub fn mount(size: &str) -> Result<SmallFs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(SmallFs { dir })
    }
    /// The mounted directory.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_splitmix64() {
        // First outputs of SplitMix64 seeded with 0 (the reference sequence).
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = Rng::new(9);
        for _ in 0..1000 {
            let x = r.f32();
            assert!((-1.0..1.0).contains(&x));
            assert!(r.below(7) < 7);
        }
    }
}
