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
