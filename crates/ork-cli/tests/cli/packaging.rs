//! `scripts/package.sh` on a fresh PC (issue 39): every missing prerequisite is found before
//! anything is built, what can be installed is installed, the rest listed at once.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// A PATH of `bash`, the few tools the checks use, and fake `rustc`, `cargo` and `rustup` (each
/// appending its arguments to `calls`); no aarch64 toolchain, no cargo-deb, no target library.
fn fresh_pc(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["bash", "dirname", "id", "tar", "gzip"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not found"));
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    let calls = dir.join("calls");
    let fake = |name: &str, body: &str| {
        let f = bin.join(name);
        std::fs::write(
            &f,
            format!(
                "#!/bin/bash\necho \"{name} $*\" >> '{}'\n{body}\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // A target library directory without libcore, cargo-deb absent, installs that "succeed".
    fake(
        "rustc",
        &format!("echo '{}'", dir.join("no-target").display()),
    );
    fake(
        "cargo",
        "[ \"$1\" = install ] && exit 0; [ \"$1\" = build ] && echo BUILT; exit 1",
    );
    fake("rustup", "exit 0");
    bin
}

fn package(dir: &Path, no_install: bool) -> (Option<i32>, String, String) {
    let bin = fresh_pc(dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/package.sh");
    let mut cmd = Command::new(bin.join("bash"));
    cmd.arg(script)
        .env_clear()
        .env("PATH", &bin)
        .env("HOME", dir)
        .env("ORK_AARCH64_TARGET_DIR", dir.join("target"));
    if no_install {
        cmd.env("ORK_PACKAGE_NO_INSTALL", "1");
    }
    let o = cmd.output().unwrap();
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
    let text = format!("{}{}", stdout(&o), stderr(&o));
    (code(&o), text, calls)
}

/// Checking only: all four missing prerequisites in one error (a fresh PC stopped on cargo-deb,
/// then on the target as cargo's "can't find crate for `core`"), nothing built.
#[test]
fn package_lists_every_missing_prerequisite_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, calls) = package(dir.path(), true);
    assert_eq!(code, Some(1), "{text}");
    for needle in [
        "gcc-aarch64-linux-gnu",
        "binutils-aarch64-linux-gnu",
        "rustup target add aarch64-unknown-linux-gnu",
        "cargo install cargo-deb --locked",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert!(
        !text.contains("BUILT") && !calls.contains("cargo build"),
        "{calls}"
    );
    assert!(
        !calls.contains("rustup") && !calls.contains("cargo install"),
        "{calls}"
    );
}

/// Installing: the target and cargo-deb are installed by their own tools; the cross toolchain,
/// which needs apt-get (absent here), is listed; still nothing built.
#[test]
fn package_installs_what_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, calls) = package(dir.path(), false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        calls.contains("rustup target add aarch64-unknown-linux-gnu"),
        "{calls}"
    );
    assert!(
        calls.contains("cargo install cargo-deb --locked"),
        "{calls}"
    );
    assert!(text.contains("apt-get install"), "{text}");
    assert!(
        !text.contains("rustup target add aarch64") && !text.contains("cargo-deb not found"),
        "{text}"
    );
    assert!(!calls.contains("cargo build"), "{calls}");
}
