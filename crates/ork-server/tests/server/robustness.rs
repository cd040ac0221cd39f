//! Bad requests are 4xx with an OpenAI-style body; a full queue is 503 at once; a client that
//! goes away frees its slot within a step; a drain lets running requests finish.
use super::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn assert_error(status: u16, body: &Value, want: u16, param: Option<&str>) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_4xx_with_an_openai_error_body() {
    let server = start(1024, |c| c.context = Some(64));
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let model = server.model_id().to_owned();

    // Malformed JSON.
    let r = client
        .post(&chat)
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 400, None);
    // Wrong types.
    for (body, param) in [
        (json!({"model": model, "messages": "hi"}), "messages"),
        (
            json!({"model": model, "messages": [], "max_tokens": "ten"}),
            "max_tokens",
        ),
        (
            json!({"model": model, "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"model": 7, "messages": []}), "model"),
    ] {
        let (s, v) = post(&client, &chat, &body).await;
        assert_error(s, &v, 400, Some(param));
    }
    // Unknown model.
    let (s, v) = post(
        &client,
        &chat,
        &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_error(s, &v, 404, Some("model"));
    assert_eq!(v["error"]["code"], "model_not_found");
    // Empty message list.
    let (s, v) = post(&client, &chat, &json!({"model": model, "messages": []})).await;
    assert_error(s, &v, 400, Some("messages"));
    // A prompt beyond the context (64 tokens).
    let long = "word ".repeat(100);
    let (s, v) = post(&client, &chat, &chat_body(&server, &long, 4, false)).await;
    assert_error(s, &v, 400, Some("messages"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // The same through /v1/completions names its own field.
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": model, "prompt": long, "max_tokens": 4}),
    )
    .await;
    assert_error(s, &v, 400, Some("prompt"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // Asking for what ork does not return (penalties, tools, more than 20 alternatives) is refused,
    // not answered without it.
    for (field, value) in [
        ("top_logprobs", json!(21)),
        ("frequency_penalty", json!(0.5)),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
        ),
        ("response_format", json!({"type": "json_object"})),
    ] {
        let mut b = chat_body(&server, "hi", 2, false);
        b[field] = value;
        let (s, v) = post(&client, &chat, &b).await;
        assert_error(s, &v, 400, Some(field));
    }
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": model, "prompt": "hi", "max_tokens": 2, "logprobs": 21}),
    )
    .await;
    assert_error(s, &v, 400, Some("logprobs"));
    // max_tokens beyond it.
    let (s, v) = post(&client, &chat, &chat_body(&server, "hi", 60, false)).await;
    assert_error(s, &v, 400, Some("max_tokens"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // Out-of-range sampling settings.
    let mut b = chat_body(&server, "hi", 2, false);
    b["temperature"] = json!(-1);
    let (s, v) = post(&client, &chat, &b).await;
    assert_error(s, &v, 400, Some("temperature"));
    // Token-id prompts out of the vocabulary.
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": model, "prompt": [1, 99999999]}),
    )
    .await;
    assert_error(s, &v, 400, Some("prompt"));
    // The server is still serving.
    let (s, _) = post(&client, &chat, &chat_body(&server, "hi", 2, false)).await;
    assert_eq!(s, 200);
    assert!(
        metric(
            &client,
            &server,
            "ork_requests_total",
            "{outcome=\"rejected_invalid\"}"
        )
        .await
            >= 17.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_is_required_when_set() {
    let server = start(1024, |c| c.api_key = Some("sesame".to_owned()));
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let body = chat_body(&server, "hi", 2, false);
    let (s, v) = post(&client, &chat, &body).await;
    assert_error(s, &v, 401, None);
    let r = client
        .post(&chat)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .get(format!("{}/v1/models", base(&server)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(&chat)
        .bearer_auth("sesame")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Health and metrics stay open for probes.
    let r = client
        .get(format!("{}/health", base(&server)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Start a streaming request and wait for its first chunk (it then holds a slot).
async fn hold_a_slot(client: &reqwest::Client, url: &str, body: &Value) -> reqwest::Response {
    let mut r = client.post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_at_once() {
    let server = start(1024, |c| {
        c.max_seqs = 1;
        c.queue = 1;
    });
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let running = hold_a_slot(
        &client,
        &chat,
        &chat_body(&server, "Tell me a long story.", 400, true),
    )
    .await;
    // Wait until the scheduler holds it (the queue is then empty), then fill the queue.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&client, &server, "ork_active_sequences", "").await < 1.0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queued = {
        let (client, chat, body) = (
            client.clone(),
            chat.clone(),
            chat_body(&server, "hi", 2, false),
        );
        tokio::spawn(async move { post(&client, &chat, &body).await })
    };
    while metric(&client, &server, "ork_requests_accepted_total", "").await < 2.0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    let (s, v) = post(&client, &chat, &chat_body(&server, "hi", 2, false)).await;
    assert_error(s, &v, 503, None);
    assert_eq!(v["error"]["code"], "queue_full");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "refused at once, not after waiting"
    );
    // Dropping the running stream lets the queued request through.
    drop(running);
    let (s, _) = queued.await.unwrap();
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_slot_within_a_step() {
    let server = start(1024, |c| c.max_seqs = 1);
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let mut running = hold_a_slot(
        &client,
        &chat,
        &chat_body(&server, "Tell me a long story.", 400, true),
    )
    .await;
    // Read a few tokens, then go away.
    for _ in 0..3 {
        running.chunk().await.unwrap();
    }
    let steps = metric(&client, &server, "ork_batched_steps_total", "").await;
    drop(running);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(
        &client,
        &server,
        "ork_requests_total",
        "{outcome=\"cancelled\"}",
    )
    .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "the slot was not freed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = metric(&client, &server, "ork_batched_steps_total", "").await;
    // The step running at the disconnect, the one whose text the closed socket still accepts
    // (connections support half-close, so only a failed write tells a client is gone: the
    // second write after the close), and at most one more while the HTTP task that makes that
    // write waits for a core on a loaded machine.
    assert!(
        after - steps <= 4.0,
        "{} steps after the disconnect",
        after - steps
    );
    while metric(&client, &server, "ork_active_sequences", "").await > 0.0 {
        assert!(Instant::now() < deadline, "the slot was not freed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The freed slot serves the next request.
    let (s, _) = post(&client, &chat, &chat_body(&server, "hi", 2, false)).await;
    assert_eq!(s, 200);
}

/// A drain (what SIGTERM starts in `ork serve`) refuses new requests and lets running ones
/// finish, then stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_finishes_running_requests_and_refuses_new_ones() {
    let server = start(1024, |_| {});
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let running = hold_a_slot(
        &client,
        &chat,
        &chat_body(&server, "Count to twenty.", 24, true),
    )
    .await;
    let addr = server.addr();
    let stopper = std::thread::spawn(move || server.shutdown());
    let body = running.text().await.unwrap();
    let (_, last) = sse_text(&body);
    assert!(!last["choices"][0]["finish_reason"].is_null());
    // Closed: a new connection is refused (or, while closing, answered 503).
    let fresh = reqwest::Client::new();
    if let Ok(r) = fresh.get(format!("http://{addr}/health")).send().await {
        assert_eq!(r.status(), 503);
    }
    stopper.join().unwrap().unwrap();
    assert!(fresh
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .is_err());
}
