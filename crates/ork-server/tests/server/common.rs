//! Start a server on a loopback port; small HTTP helpers.
use ork_runtime::{DeviceKind, Engine, EngineConfig, PackChoice};
use ork_server::{ServeConfig, Server};
use serde_json::{json, Value};

/// Held by the tests that open several engines and by the one that measures the process's
/// RSS, so that the measure is not another test's engines.
pub static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `.orkpack` the tests share (built by the first one, then reused).
pub fn pack_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ork-server-smollm2.orkpack")
}

/// An engine on the emulator with `budget_mb` per domain.
pub fn engine(budget_mb: u64) -> Engine {
    let mut c = EngineConfig::new(ork_testkit::model_path());
    c.pack = PackChoice::Path(pack_path());
    c.budget_bytes = Some(budget_mb << 20);
    c.device = DeviceKind::Emu;
    Engine::open(c).unwrap()
}

/// A server on a free loopback port.
pub fn start(budget_mb: u64, tweak: impl FnOnce(&mut ServeConfig)) -> Server {
    start_on(engine(budget_mb), tweak)
}

/// A server on `engine`, on a free loopback port.
pub fn start_on(engine: Engine, tweak: impl FnOnce(&mut ServeConfig)) -> Server {
    let mut config = ServeConfig {
        port: 0,
        ..ServeConfig::default()
    };
    tweak(&mut config);
    Server::start(engine, config).unwrap()
}

/// `http://ADDR`.
pub fn base(server: &Server) -> String {
    format!("http://{}", server.addr())
}

/// A greedy chat request body.
pub fn chat_body(server: &Server, prompt: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": server.model_id(),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// POST JSON, return (status, body as JSON).
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client.post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let v = r.json::<Value>().await.unwrap();
    (status, v)
}

/// POST JSON, return the body as text (a server-sent event stream).
pub async fn post_text(client: &reqwest::Client, url: &str, body: &Value) -> String {
    let r = client.post(url).json(body).send().await.unwrap();
    r.text().await.unwrap()
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// The streamed text of an SSE body (chat deltas or completion texts), and the last chunk with
/// a finish reason; asserts the stream ends with `[DONE]`.
pub fn sse_text(body: &str) -> (String, Value) {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let mut text = String::new();
    let mut last = Value::Null;
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str().or(c["text"].as_str()) {
                text.push_str(t);
            }
            if !c["finish_reason"].is_null() {
                last = v.clone();
            }
        }
    }
    (text, last)
}

/// One counter of `/metrics` (the sample with `labels`, "" for none).
pub async fn metric(client: &reqwest::Client, server: &Server, name: &str, labels: &str) -> f64 {
    let text = client
        .get(format!("{}/metrics", base(server)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let key = format!("{name}{labels} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("{key} not in {text}"))
        .parse()
        .unwrap()
}

/// Run `tests/SCRIPT` (the official `openai` Python client, installed by `scripts/test.sh`)
/// against `server` with `key`; it must print `ok:…`. Skipped (false) without python3.
pub fn run_openai_script(script: &str, server: &Server, key: &str) -> bool {
    use std::process::Command;
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not installed, so the openai client test cannot run");
        return false;
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
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(path)
        .arg(format!("{}/v1", base(server)))
        .arg(server.model_id())
        .arg(key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.starts_with("ok:"), "{stdout}");
    true
}
