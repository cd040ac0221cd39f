//! The probes a balancer and Kubernetes read: `/health` and `/health/ready` answer 503 from the
//! start of a drain while the listener stays open, `/health/live` 200 while the process runs,
//! and a new request during the drain gets a 503 JSON error (which HAProxy retries elsewhere).
use super::common::*;
use serde_json::{json, Value};
use std::time::Duration;

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn overloaded(client: &reqwest::Client, server: &ork_server::Server) -> f64 {
    metric(
        client,
        server,
        "ork_requests_total",
        "{outcome=\"rejected_overloaded\"}",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_probes_and_new_requests_503_while_running_ones_finish() {
    let server = start(1024, |c| c.drain_timeout = Duration::from_secs(600));
    let client = reqwest::Client::new();
    let url = base(&server);
    for path in ["/health", "/health/ready", "/health/live"] {
        assert_eq!(get(&client, &format!("{url}{path}")).await.0, 200, "{path}");
    }
    let chat = format!("{url}/v1/chat/completions");
    let mut body = chat_body(&server, "Tell me a long story.", 400, true);
    body["ignore_eos"] = json!(true);
    let mut running = client.post(&chat).json(&body).send().await.unwrap();
    assert_eq!(running.status(), 200);
    running.chunk().await.unwrap();
    let before = overloaded(&client, &server).await;

    server.signal();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // New connections during the drain are still answered.
    let fresh = reqwest::Client::new();
    let (status, health) = get(&fresh, &format!("{url}/health")).await;
    assert_eq!((status, health["status"].as_str()), (503, Some("draining")));
    assert_eq!(get(&fresh, &format!("{url}/health/ready")).await.0, 503);
    let (status, live) = get(&fresh, &format!("{url}/health/live")).await;
    assert_eq!((status, live["draining"].as_bool()), (200, Some(true)));
    let (status, refused) = post(&fresh, &chat, &chat_body(&server, "hi", 2, false)).await;
    assert_eq!(status, 503, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("shutting down")),
        "{refused}"
    );
    // Only the new request is counted as refused, not the probes.
    assert_eq!(overloaded(&fresh, &server).await - before, 1.0);
    // The running stream goes on.
    let more = running.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&more).contains("data:"));

    // A second stop ends the drain; then the port is closed.
    server.signal();
    let addr = server.addr();
    tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.wait().unwrap();
    })
    .await
    .unwrap();
    assert!(fresh
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .is_err());
}
