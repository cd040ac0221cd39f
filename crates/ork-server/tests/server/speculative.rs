//! Speculative verification in `serve` (`--draft lookup`, docs/serve.md): greedy requests draft
//! by prompt lookup and verify the drafts in the batched step on the prefill engine. Two
//! requests sent at once (and a third cut by a stop sequence) get, token for token, the answers of the same server without
//! speculation, and the metrics show that drafts were accepted (so speculation ran).
use crate::server::common::{base, chat_body, engine, metric, post, start_on, MEMORY};
use crate::server::phases::mixed;
use ork_runtime::Engine;
use serde_json::Value;

/// Prompts whose answers repeat what they say, so that prompt lookup has something to draft.
const PROMPTS: [&str; 2] = [
    "Repeat this line three times: the red fox jumps over the lazy brown dog.",
    "Count from 1 to 20, separated by commas.",
];

/// Tokens per answer.
const MAX_TOKENS: u32 = 40;

/// What a request got: its text, finish reason and completion tokens.
type Answer = (String, String, u64);

/// The two prompts sent at once to a server on `engine` with `draft_max`, with a third request
/// (the second prompt again, cut by a stop sequence); the answers, and the drafts verified and
/// accepted.
async fn answers(engine: Engine, draft_max: Option<usize>) -> (Vec<Answer>, f64, f64) {
    // Small chunks: one request's prompt chunks share steps with the other's decode steps.
    let server = start_on(engine, |c| {
        c.prefill_chunk = 8;
        c.draft_max = draft_max;
    });
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", base(&server));
    let mut bodies: Vec<Value> = PROMPTS
        .iter()
        .map(|p| chat_body(&server, p, MAX_TOKENS, false))
        .collect();
    let mut stopped = bodies[1].clone();
    stopped["stop"] = serde_json::json!(["6. 6"]);
    bodies.push(stopped);
    let replies = futures_util::future::join_all(bodies.into_iter().map(|body| {
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &body).await }
    }))
    .await;
    let answers = replies
        .into_iter()
        .map(|(status, v): (u16, Value)| {
            assert_eq!(status, 200, "{v}");
            let c = &v["choices"][0];
            (
                c["message"]["content"].as_str().unwrap().to_owned(),
                c["finish_reason"].as_str().unwrap().to_owned(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    let drafted = metric(&client, &server, "ork_draft_tokens_total", "").await;
    let accepted = metric(&client, &server, "ork_draft_tokens_accepted_total", "").await;
    (answers, drafted, accepted)
}

/// Speculation on against off on `open()`'s engines: the same answers, drafts accepted.
async fn same_answers_with_drafts_accepted(open: impl Fn() -> Engine, what: &str) {
    let (plain, drafted, _) = answers(open(), None).await;
    assert_eq!(drafted, 0.0, "{what}: no speculation without --draft");
    let (spec, drafted, accepted) = answers(open(), Some(8)).await;
    eprintln!(
        "{what}: {accepted} of {drafted} drafts accepted ({:.0} %); {spec:?}",
        100.0 * accepted / drafted.max(1.0)
    );
    assert_eq!(
        plain, spec,
        "{what}: speculation changed the greedy answers"
    );
    assert!(
        accepted > 0.0,
        "{what}: no draft was accepted ({drafted} verified)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_on_one_engine_gives_the_greedy_answers_without_it() {
    let _memory = MEMORY.lock().await;
    same_answers_with_drafts_accepted(|| engine(1024), "one engine (emulated)").await;
}

/// Verification on the prefill engine (the emulator), decode steps on the CPU engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_on_mixed_engines_gives_the_greedy_answers_without_it() {
    let _memory = MEMORY.lock().await;
    same_answers_with_drafts_accepted(|| mixed(None), "emulated prefill, CPU decode").await;
}
