//! 32 concurrent clients × 4 requests on loopback, bounded in time: every request completes or
//! gets a clear error, none is lost, the server's memory stays bounded, and `/metrics` agrees
//! with what the clients counted.
use super::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Resident set of this process (the server runs in it), KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_clients_times_four_requests_all_complete_and_metrics_agree() {
    const CLIENTS: usize = 32;
    const EACH: usize = 4;
    let _alone = MEMORY.lock().await;
    let prefix_mib = 64;
    let server = start(1024, |c| {
        c.max_seqs = 8;
        c.queue = 64;
        c.prefix_cache_bytes = prefix_mib << 20;
    });
    let url = format!("{}/v1/completions", base(&server));
    let model = server.model_id().to_owned();
    // Warm up (first loads), then measure memory from here.
    let client = reqwest::Client::new();
    let (s, warm) = post(
        &client,
        &url,
        &json!({"model": model, "prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200);
    let warm_tokens = warm["usage"]["completion_tokens"].as_u64().unwrap();
    let rss0 = rss_kib();
    let started = Instant::now();
    let results = futures_util::future::join_all((0..CLIENTS).map(|c| {
        let (url, model) = (url.clone(), model.clone());
        async move {
            let client = reqwest::Client::new();
            let mut out = Vec::new();
            for r in 0..EACH {
                let stream = (c + r) % 2 == 0;
                let body = json!({"model": model, "prompt": format!("Client {c} asks question {r}:"),
                                  "max_tokens": 3, "temperature": 0.7, "seed": c * 10 + r,
                                  "stream": stream,
                                  "stream_options": {"include_usage": true}});
                let resp = client.post(&url).json(&body).send().await.unwrap();
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap();
                let tokens = match (status, stream) {
                    (200, false) => {
                        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                        v["usage"]["completion_tokens"].as_u64().unwrap()
                    }
                    (200, true) => {
                        // Complete (ends with [DONE]); the usage chunk comes just before it.
                        sse_text(&text);
                        let data = sse_data(&text);
                        let usage: serde_json::Value =
                            serde_json::from_str(&data[data.len() - 2]).unwrap();
                        usage["usage"]["completion_tokens"].as_u64().unwrap()
                    }
                    _ => {
                        // A clear error: an OpenAI-style body.
                        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                        assert!(v["error"]["message"].is_string(), "{text}");
                        0
                    }
                };
                out.push((status, tokens));
            }
            out
        }
    }));
    let results = tokio::time::timeout(Duration::from_secs(240), results)
        .await
        .expect("the load finished in bounded time");
    let elapsed = started.elapsed();
    let all: Vec<(u16, u64)> = results.into_iter().flatten().collect();
    assert_eq!(all.len(), CLIENTS * EACH, "no request lost");
    let ok = all.iter().filter(|(s, _)| *s == 200).count();
    let overloaded = all.iter().filter(|(s, _)| *s == 503).count();
    assert_eq!(ok + overloaded, all.len(), "{all:?}");
    // 32 clients never hold more than 32 requests: the 8 slots and the queue of 64 take them all.
    assert_eq!(ok, CLIENTS * EACH);
    let completed = metric(
        &client,
        &server,
        "ork_requests_total",
        "{outcome=\"completed\"}",
    )
    .await;
    assert_eq!(completed as usize, ok + 1, "the warm-up and the load");
    assert_eq!(
        metric(&client, &server, "ork_requests_accepted_total", "").await as usize,
        ok + 1
    );
    assert_eq!(
        metric(
            &client,
            &server,
            "ork_requests_total",
            "{outcome=\"cancelled\"}"
        )
        .await,
        0.0
    );
    assert_eq!(
        metric(
            &client,
            &server,
            "ork_requests_total",
            "{outcome=\"failed\"}"
        )
        .await,
        0.0
    );
    let counted: u64 = all.iter().map(|(_, t)| t).sum();
    let tokens = metric(&client, &server, "ork_completion_tokens_total", "").await as u64;
    assert_eq!(
        tokens,
        counted + warm_tokens,
        "the clients' usage counts add up to /metrics"
    );
    assert_eq!(metric(&client, &server, "ork_queue_depth", "").await, 0.0);
    let grown_mib = rss_kib().saturating_sub(rss0) / 1024;
    // The sequences' caches and buffers, plus what prefix reuse may keep.
    assert!(
        grown_mib < 256 + prefix_mib as u64,
        "RSS grew {grown_mib} MiB under load"
    );
    eprintln!(
        "load: {} requests in {elapsed:?}, RSS +{grown_mib} MiB",
        all.len()
    );
}

/// What one request of the drain test came to, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// A whole answer (`[DONE]` after a finish reason, or the JSON body), with its tokens.
    Answered(u64),
    /// 503 at once (draining, or the queue full).
    Refused,
    /// No connection: the listener had closed.
    Closed,
    /// The client went away after the first chunk, on purpose.
    LeftEarly,
}

/// 64 clients hold chat conversations whose turns share prefixes (four system prompts, each
/// turn carrying the previous ones), some leave mid-stream, and the server is told to stop
/// (what SIGTERM does) at a moment drawn at random: every accepted request gets a whole answer
/// or was left by its client, and `/metrics` counts exactly what the clients saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_conversations_and_a_drain_at_a_random_moment_lose_nothing() {
    const CLIENTS: usize = 64;
    const TURNS: usize = 3;
    let _alone = MEMORY.lock().await;
    let server = start(1024, |c| {
        c.max_seqs = 8;
        c.queue = 128;
        c.context = Some(1024);
        c.prefix_cache_bytes = 64 << 20;
        c.drain_timeout = Duration::from_secs(240);
    });
    let url = format!("{}/v1/chat/completions", base(&server));
    let model = server.model_id().to_owned();
    let metrics = std::sync::Arc::clone(server.metrics());
    // The moment of the stop: 0.5–4 s after the clients start, from the clock's nanoseconds.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let stop_after = Duration::from_millis(500 + u64::from(nanos % 3500));
    let started = Instant::now();
    let clients = futures_util::future::join_all((0..CLIENTS).map(|c| {
        let (url, model) = (url.clone(), model.clone());
        async move {
            let client = reqwest::Client::new();
            let mut seen = Vec::new();
            let mut messages = vec![json!({"role": "system", "content": format!(
                "You are assistant number {}. Answer in one short sentence.", c % 4)})];
            for turn in 0..TURNS {
                messages.push(json!({"role": "user",
                                     "content": format!("Question {turn} from client {c}: name a fruit.")}));
                // Every eighth client leaves its second turn after the first chunk.
                let leave = c % 8 == 7 && turn == 1;
                let stream = leave || (c + turn) % 2 == 0;
                let mut body = json!({"model": model, "messages": messages,
                                      "max_tokens": if leave { 200 } else { 6 },
                                      "temperature": 0, "stream": stream,
                                      "stream_options": {"include_usage": true}});
                if leave {
                    body["ignore_eos"] = json!(true);
                }
                let mut resp = match client.post(&url).json(&body).send().await {
                    Ok(r) => r,
                    Err(_) => {
                        seen.push(Seen::Closed);
                        break;
                    }
                };
                match resp.status().as_u16() {
                    200 => {}
                    503 => {
                        seen.push(Seen::Refused);
                        break;
                    }
                    other => panic!("client {c} turn {turn}: status {other}"),
                }
                if leave {
                    let first = resp.chunk().await.unwrap();
                    assert!(first.is_some(), "client {c}: no first chunk");
                    drop(resp);
                    seen.push(Seen::LeftEarly);
                    continue;
                }
                let text = resp.text().await.unwrap_or_else(|e| {
                    panic!("client {c} turn {turn}: an accepted request was cut: {e}")
                });
                let (answer, tokens) = if stream {
                    let (answer, _) = sse_text(&text);
                    let data = sse_data(&text);
                    let usage: serde_json::Value =
                        serde_json::from_str(&data[data.len() - 2]).unwrap();
                    (answer, usage["usage"]["completion_tokens"].as_u64().unwrap())
                } else {
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("client {c} turn {turn}: {e}: {text}"));
                    assert!(!v["choices"][0]["finish_reason"].is_null(), "{v}");
                    (
                        v["choices"][0]["message"]["content"].as_str().unwrap().to_owned(),
                        v["usage"]["completion_tokens"].as_u64().unwrap(),
                    )
                };
                seen.push(Seen::Answered(tokens));
                messages.push(json!({"role": "assistant", "content": answer}));
            }
            seen
        }
    }));
    let stopper = async {
        tokio::time::sleep(stop_after).await;
        server.signal();
    };
    let (seen, ()) = tokio::time::timeout(Duration::from_secs(600), async {
        tokio::join!(clients, stopper)
    })
    .await
    .expect("the clients did not finish within 10 minutes");
    let elapsed = started.elapsed();
    let stopped = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.wait()
    });
    stopped.await.unwrap().unwrap();
    let seen: Vec<Seen> = seen.into_iter().flatten().collect();
    let count = |f: &dyn Fn(&Seen) -> bool| seen.iter().filter(|s| f(s)).count() as u64;
    let answered = count(&|s| matches!(s, Seen::Answered(_)));
    let left = count(&|s| *s == Seen::LeftEarly);
    let refused = count(&|s| *s == Seen::Refused);
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "drain after {stop_after:?}: {answered} answered, {left} left early, {refused} refused, \
         {} never connected, in {elapsed:?}; {} prompt tokens reused",
        count(&|s| *s == Seen::Closed),
        get(&metrics.cached_tokens)
    );
    assert!(
        answered + left > 0,
        "the stop came before any request was accepted: nothing was tested"
    );
    // Nothing accepted was lost: each accepted request was answered or left by its client.
    assert_eq!(get(&metrics.failed), 0);
    assert_eq!(get(&metrics.completed), answered);
    assert_eq!(get(&metrics.cancelled), left);
    assert_eq!(get(&metrics.accepted), answered + left);
    assert_eq!(get(&metrics.rejected_overloaded), refused);
    assert_eq!(get(&metrics.rejected_invalid), 0);
    // The tokens of the answers the clients received, plus those of the requests they left.
    let received: u64 = seen
        .iter()
        .map(|s| match s {
            Seen::Answered(t) => *t,
            _ => 0,
        })
        .sum();
    assert!(get(&metrics.completion_tokens) >= received);
    if left == 0 {
        assert_eq!(get(&metrics.completion_tokens), received);
    }
}
