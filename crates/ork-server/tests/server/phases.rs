//! Engines per phase under batching: the emulated NPU prefills, the CPU engine decodes
//! (docs/architecture.md, "Engines per phase"); two requests sent at once, their prompt chunks
//! and decode steps sharing steps, give each the text it gets alone; and a mixed server's greedy
//! answers against a CPU-only server's, within the bound of `crates/ork-runtime/tests/phases.rs`
//! (they part only where the CPU-only run's top-2 margin is below twice the engines'
//! prefill-logit spread).

use crate::server::common::{base, chat_body, pack_path, post, sse_text, start_on, MEMORY};
use ork_runtime::{Engine, PhaseEngine, PhaseEngines};
// ork-runtime's engines-per-phase setup (its `tests/common`), shared rather than copied.
use crate::server::runtime_common::{argmax, config};
use ork_testkit::moe::{moe_fixture, MoeFixture};
use serde_json::{json, Value};
use std::path::Path;

/// Prefill on the emulator, decode on the CPU engine (2 workers); with `split`, decode's rows
/// shared between the two at that device share (`--decode-device split`).
pub fn mixed(split: Option<f64>) -> Engine {
    mixed_with(None, split)
}

/// [`mixed`], the prefill's rows shared at `prefill_split` (`--prefill-device split`).
fn mixed_with(prefill_split: Option<f64>, split: Option<f64>) -> Engine {
    let engines = PhaseEngines {
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
    };
    let mut c = config(&ork_testkit::model_path(), &pack_path(), engines);
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
    // Small chunks: one request's prompt chunks share steps with the other's decode steps.
    let server = start_on(engine, |c| c.prefill_chunk = 8);
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

/// The mixed server's greedy answers against a CPU-only server's, SmolLM2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_server_answers_as_a_cpu_only_server_up_to_the_engines_numerics() {
    let _memory = MEMORY.lock().await;
    mixed_against_cpu_only(&ork_testkit::model_path(), &pack_path(), "SmolLM2").await;
}

/// The same on the MoE fixture (the runtime test's, perturbed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_server_on_a_moe_fixture_answers_as_a_cpu_only_server_up_to_numerics() {
    let _memory = MEMORY.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("moe.orkpack");
    mixed_against_cpu_only(&moe_fixture(MoeFixture::Perturbed), &pack, "MoE perturbed").await;
}

const MIXED: PhaseEngines = PhaseEngines {
    prefill: PhaseEngine::Device,
    decode: PhaseEngine::Cpu,
};

/// Two prompts sent at once to a mixed server and to a CPU-only one: the first token is the
/// emulator's (the prefill's), and the answers part only where the CPU-only run's top-2 margin
/// is below twice the largest difference between the two engines' prefill logits.
async fn mixed_against_cpu_only(model: &Path, pack: &Path, what: &str) {
    let prompts = ["The capital of France is", "Water boils at"];
    let emu = Engine::open(config(model, pack, PhaseEngines::one(PhaseEngine::Device)));
    let emu = emu.unwrap();
    let cpu = Engine::open(config(model, pack, PhaseEngines::one(PhaseEngine::Cpu)));
    let cpu = cpu.unwrap();
    let mut spread = 0.0f32;
    let mut emu_first = Vec::new();
    for p in prompts {
        let t = emu.tokenizer().encode(p, true, false).unwrap();
        let (a, b) = (
            emu.session().prefill(&t).unwrap(),
            cpu.session().prefill(&t).unwrap(),
        );
        spread = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(spread, f32::max);
        emu_first.push(emu.tokenizer().decode(&[argmax(&a)], true).unwrap());
    }
    drop(emu);
    let near_tie = 2.0 * f64::from(spread);
    let cpu_only = completions(cpu, &prompts).await;
    let mixed = completions(Engine::open(config(model, pack, MIXED)).unwrap(), &prompts);
    let mixed = mixed.await;
    for (i, ((m, c), first)) in mixed.iter().zip(&cpu_only).zip(&emu_first).enumerate() {
        assert_eq!(
            &m[0].0, first,
            "{what}: prompt {i}'s first token is the emulator's"
        );
        if let Some(at) = m.iter().zip(c).position(|(a, b)| a.0 != b.0) {
            assert!(
                c[at].1 < near_tie,
                "{what}: prompt {i}: mixed {m:?} and CPU-only {c:?} part at token {at}, where the \
                 CPU's margin is {} (≥ {near_tie}, twice the engines' prefill-logit spread)",
                c[at].1
            );
        }
        eprintln!("{what}: prompt {i}: mixed {m:?}, cpu-only {c:?}, spread {spread}");
    }
}

/// Greedy completions of `prompts`, sent at once to a server on `engine` (12 tokens, no stop at
/// the end of generation): per prompt, each token and its top-2 log-probability margin.
async fn completions(engine: Engine, prompts: &[&str]) -> Vec<Vec<(String, f64)>> {
    let server = start_on(engine, |c| c.prefill_chunk = 4);
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", base(&server));
    let answers = futures_util::future::join_all(prompts.iter().map(|p| {
        let body = json!({"model": server.model_id(), "prompt": p, "max_tokens": 12,
            "temperature": 0, "logprobs": 2, "ignore_eos": true});
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &body).await }
    }))
    .await;
    answers
        .into_iter()
        .map(|(status, v)| {
            assert_eq!(status, 200, "{v}");
            let lp = &v["choices"][0]["logprobs"];
            let tokens = lp["tokens"].as_array().unwrap().iter();
            let tops = lp["top_logprobs"].as_array().unwrap().iter();
            tokens
                .zip(tops)
                .map(|(t, top)| (t.as_str().unwrap().to_owned(), top_margin(top)))
                .collect()
        })
        .collect()
}

/// The difference between the two largest log probabilities of a `top_logprobs` entry.
fn top_margin(top: &Value) -> f64 {
    let mut lps: Vec<f64> = top
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .collect();
    lps.sort_by(|a, b| b.total_cmp(a));
    lps[0] - lps.get(1).copied().unwrap_or(f64::NEG_INFINITY)
}
