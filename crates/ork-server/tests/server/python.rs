//! The official `openai` Python client (installed by `scripts/test.sh`) against the server.
use super::common::*;
use std::process::Command;

#[test]
fn the_official_openai_python_client_works() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not installed, so the openai client test cannot run");
        return;
    }
    let has_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .unwrap()
        .success();
    assert!(
        has_openai,
        "the Python package 'openai' is missing: run ./scripts/test.sh (it installs it) or \
         `python3 -m pip install openai`"
    );
    let server = start(1024, |c| c.api_key = Some("test-key".to_owned()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("{}/v1", base(&server)))
        .arg(server.model_id())
        .arg("test-key")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.starts_with("ok:"), "{stdout}");
}
