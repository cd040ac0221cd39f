//! Engines per phase under batching: the emulated NPU prefills, the CPU engine decodes
//! (docs/architecture.md, "Engines per phase"); two requests sent at once, their prompt chunks
//! and decode steps sharing steps, give each the text it gets alone.

use crate::server::common::{base, chat_body, pack_path, post, sse_text, MEMORY};
use ork_runtime::{DeviceKind, Engine, EngineConfig, PackChoice, PhaseEngine, PhaseEngines};
use ork_server::{ServeConfig, Server};

/// Prefill on the emulator, decode on the CPU engine (2 workers); with `split`, decode's rows
/// shared between the two at that device share (`--decode-device split`).
fn mixed(split: Option<f64>) -> Engine {
    mixed_with(None, split)
}

/// [`mixed`], the prefill's rows shared at `prefill_split` (`--prefill-device split`).
fn mixed_with(prefill_split: Option<f64>, split: Option<f64>) -> Engine {
    let mut c = EngineConfig::new(ork_testkit::model_path());
    c.pack = PackChoice::Path(pack_path());
    c.budget_bytes = Some(1024 << 20);
    c.device = DeviceKind::Emu;
    c.cpu = Some(ork_cpu::CpuOptions {
        threads: Some(2),
        cpus: None,
        ..Default::default()
    });
    c.phases = Some(PhaseEngines {
        prefill: if prefill_split.is_some() {
            PhaseEngine::Split
        } else {
            PhaseEngine::Device
        },
        decode: if split.is_some() {
            PhaseEngine::Split
        } else {
            PhaseEngine::Cpu
        },
    });
    c.split_rows = split.map(ork_runtime::SplitRows::All);
    c.prefill_split_rows = prefill_split.map(ork_runtime::SplitRows::All);
    Engine::open(c).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_requests_on_mixed_engines_match_their_answers_alone() {
    let _memory = MEMORY.lock().await;
    let engine = mixed(None);
    let name = engine.compute_name();
    assert!(
        name.starts_with("prefill emulated") && name.ends_with(", decode cpu"),
        "{name}"
    );
    together_as_alone(engine).await;
}

/// The decode row split under batching: a batched step's rows (one per sequence) split as a
/// lone decode's are, so each request gets the text it gets alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_requests_on_a_decode_split_match_their_answers_alone() {
    let _memory = MEMORY.lock().await;
    let engine = mixed(Some(0.5));
    let name = engine.compute_name();
    assert!(name.contains(", decode split (emulated"), "{name}");
    together_as_alone(engine).await;
}

/// The prefill row split under batching: a step's prompt chunks of two requests are one pass
/// whose rows split as a lone chunk's do, so each request gets the text it gets alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_requests_on_a_prefill_split_match_their_answers_alone() {
    let _memory = MEMORY.lock().await;
    let engine = mixed_with(Some(0.5), None);
    let name = engine.compute_name();
    assert!(
        name.starts_with("prefill split (emulated") && name.ends_with(", decode cpu"),
        "{name}"
    );
    together_as_alone(engine).await;
}

/// Two requests sent one after the other, then at once, get the same texts.
async fn together_as_alone(engine: Engine) {
    let prompts = ["What is the capital of France?", "Name three colours."];
    let config = ServeConfig {
        port: 0,
        // Small chunks: one request's prompt chunks share steps with the other's decode steps.
        prefill_chunk: 8,
        ..ServeConfig::default()
    };
    let server = Server::start(engine, config).unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", base(&server));
    let mut alone = Vec::new();
    for p in prompts {
        let (s, v) = post(&client, &url, &chat_body(&server, p, 10, false)).await;
        assert_eq!(s, 200);
        alone.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let together = futures_util::future::join_all(prompts.iter().map(|p| {
        let (client, url, body) = (client.clone(), url.clone(), chat_body(&server, p, 10, true));
        async move {
            let sse = client
                .post(&url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            sse_text(&sse).0
        }
    }))
    .await;
    assert_eq!(alone, together);
}
