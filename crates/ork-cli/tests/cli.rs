//! Integration tests of the `ork` binary: every test runs the real executable
//! (`CARGO_BIN_EXE_ork`) as a child process and checks exit codes, JSON output and files.
//!
//! The real model (SmolLM2-135M Q4_1) is found through `ORK_MODEL` or
//! `.cache/SmolLM2-135M-Instruct.Q4_1.gguf`; tests that need it fail if it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "cli/auto.rs"]
mod auto;
#[path = "cli/cpu.rs"]
mod cpu;
#[path = "cli/device.rs"]
mod device;
#[path = "cli/hostile.rs"]
mod hostile;
#[path = "cli/model.rs"]
mod model;
#[path = "cli/pack.rs"]
mod pack;
#[path = "cli/packaging.rs"]
mod packaging;
#[path = "cli/phases.rs"]
mod phases;
#[path = "cli/plan_inputs.rs"]
mod plan_inputs;
#[path = "cli/project.rs"]
mod project;
#[path = "cli/rknn.rs"]
mod rknn;
#[path = "cli/safety.rs"]
mod safety;
#[path = "cli/serve.rs"]
mod serve;
#[path = "cli/spec.rs"]
mod spec;
#[path = "cli/split.rs"]
mod split;

/// A command running the `ork` binary under test.
pub fn ork() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ork"))
}

/// Run `ork` with `args` and collect its output.
pub fn run(args: &[&str]) -> Output {
    ork().args(args).output().expect("the ork binary runs")
}

/// Exit code of a finished run (`None` = killed by a signal).
pub fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parse the one JSON object a `--json` run prints.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}):\n{}\nstderr: {}",
            stdout(o),
            stderr(o)
        )
    })
}

/// The real test model; panics with the fix if it is missing.
pub fn model() -> PathBuf {
    ork_testkit::model_path()
}

/// The real model converted once per test run (int8), shared by the tests that only read it.
pub fn converted() -> &'static Path {
    static PACK: OnceLock<PathBuf> = OnceLock::new();
    PACK.get_or_init(|| {
        let path = ork_testkit::process_dir().join("smollm2.orkpack");
        let o = run(&[
            "convert",
            model().to_str().unwrap(),
            "-o",
            path.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "convert failed: {}", stderr(&o));
        path
    })
}

/// Names in `dir` other than `keep` (temp files left behind, partial outputs).
pub fn other_files(dir: &Path, keep: &[&Path]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !keep.iter().any(|k| k == p))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}
