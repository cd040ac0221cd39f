//! What a hostile pass over the server found, each a test: refusals that were not OpenAI JSON
//! or not counted, a float that underflows to 0 as f32, huge prompts tokenized on the HTTP
//! threads, stalled connections that kept a drain alive forever, a second stop that was
//! ignored, a half-closed pipelining client that lost its last response.
use super::common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Send `raw` on a fresh connection, read the whole answer (the server closes).
fn raw(server: &ork_server::Server, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The JSON body of one raw HTTP answer.
fn json_body(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect(answer);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

async fn refused(client: &reqwest::Client, server: &ork_server::Server) -> f64 {
    metric(
        client,
        server,
        "ork_requests_total",
        "{outcome=\"rejected_invalid\"}",
    )
    .await
        + metric(
            client,
            server,
            "ork_requests_total",
            "{outcome=\"rejected_overloaded\"}",
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_openai_json_and_counted() {
    let server = start(1024, |c| {
        c.context = Some(64);
        c.api_key = Some("sesame".to_owned());
    });
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let model = server.model_id().to_owned();
    let before = refused(&client, &server).await;
    let mut expected = 0.0;
    let send = |body: Value| {
        client
            .post(&chat)
            .header("authorization", "bearer sesame")
            .json(&body)
            .send()
    };
    // The scheme is case-insensitive.
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = client
            .post(&chat)
            .header("authorization", format!("{scheme} sesame"))
            .json(&chat_body(&server, "hi", 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // 1e-300 is 0 as f32: a 400 naming top_p, not a 500.
    let mut b = chat_body(&server, "hi", 2, false);
    b["top_p"] = json!(1e-300);
    let r = send(b).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "top_p");
    expected += 1.0;
    // Missing fields are named.
    for (body, field) in [
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "model",
        ),
        (json!({"model": model}), "messages"),
        (
            json!({"model": model, "messages": [{"content": "hi"}]}),
            "messages[0].role",
        ),
    ] {
        let r = send(body).await.unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], field);
        expected += 1.0;
    }
    // 405, 404, 413 and a broken chunked body: JSON, from the raw socket.
    let auth = "Authorization: Bearer sesame\r\n";
    let a = raw(
        &server,
        format!("GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    assert!(a.starts_with("HTTP/1.1 405"), "{a}");
    assert!(json_body(&a)["error"]["message"].is_string(), "{a}");
    let a = raw(
        &server,
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(a.starts_with("HTTP/1.1 404"), "{a}");
    json_body(&a);
    let a = raw(
        &server,
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 99000000\r\nConnection: close\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    assert!(a.starts_with("HTTP/1.1 413"), "{a}");
    json_body(&a);
    let a = raw(
        &server,
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(a.starts_with("HTTP/1.1 400"), "{a}");
    json_body(&a);
    expected += 4.0;
    // A wrong key.
    let r = client
        .post(&chat)
        .header("authorization", "bearer nope")
        .json(&chat_body(&server, "hi", 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    expected += 1.0;
    assert_eq!(refused(&client, &server).await - before, expected);
}

#[test]
fn an_api_key_with_control_characters_is_refused_at_start() {
    for key in ["sesame\n", "ses ame", "s\u{7f}", "sésame"] {
        let mut config = ork_server::ServeConfig {
            port: 0,
            ..ork_server::ServeConfig::default()
        };
        config.api_key = Some(key.to_owned());
        let e = ork_server::Server::start(engine(1024), config).unwrap_err();
        assert!(
            matches!(
                e,
                ork_server::ServerError::Config {
                    setting: "--api-key",
                    ..
                }
            ),
            "{key:?}: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_refused_before_tokenizing_and_health_stays_prompt() {
    let server = start(1024, |c| c.context = Some(64));
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", base(&server));
    let model = server.model_id().to_owned();
    // 1.9 MB: beyond the body limit the context implies.
    let huge = "word ".repeat(380_000);
    let t = Instant::now();
    let (s, v) = post(&client, &url, &json!({"model": model, "prompt": huge})).await;
    assert_eq!(s, 413, "{v}");
    // Within the body limit, beyond what the context holds by its bytes alone: refused before
    // it is tokenized, while /health answers.
    let long = "word ".repeat(20_000);
    let mut running = Vec::new();
    for _ in 0..6 {
        let (client, url, body) = (
            client.clone(),
            url.clone(),
            json!({"model": model, "prompt": long}),
        );
        running.push(tokio::spawn(
            async move { post(&client, &url, &body).await },
        ));
    }
    let h = Instant::now();
    let r = client
        .get(format!("{}/health", base(&server)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let health = h.elapsed();
    for r in running {
        let (s, v) = r.await.unwrap();
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["param"], "prompt");
    }
    // The bounds are generous on purpose: what this pins is progress (/health answers while six
    // prompts are in flight, and every prompt is refused, none tokenized into the scheduler),
    // not speed. A 2-core CI runner loaded by other jobs can take seconds to schedule a request,
    // so a tight bound would test the host; these only catch a server that stalls.
    assert!(
        health < Duration::from_secs(30),
        "/health took {health:?} while prompts were checked"
    );
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "refusing took {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_time_out_and_are_limited() {
    let server = start(1024, |c| {
        c.header_timeout = Duration::from_secs(1);
        c.max_connections = 4;
    });
    let client = reqwest::Client::new();
    // Half a request line, then nothing: closed after the header timeout.
    let mut stalled = TcpStream::connect(server.addr()).unwrap();
    stalled.write_all(b"POST /v1/chat").unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let _ = stalled.read(&mut buf);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "a stalled connection stayed open {:?}",
        t.elapsed()
    );
    // Four idle connections fill the limit: a fifth is answered 503 JSON and counted.
    let before = refused(&client, &server).await;
    // The client's own pooled connection goes idle and is closed by the same clock.
    std::thread::sleep(Duration::from_millis(1500));
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let a = raw(
        &server,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert_eq!(json_body(&a)["error"]["code"], "too_many_connections");
    // Idle connections are closed by the same clock, which frees the slots.
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = c.read(&mut buf);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(refused(&client, &server).await - before, 1.0);
}

#[test]
fn a_stalled_connection_does_not_hold_the_drain() {
    let server = start(1024, |c| {
        c.header_timeout = Duration::from_secs(600);
        c.drain_timeout = Duration::from_secs(2);
    });
    let mut stalled = TcpStream::connect(server.addr()).unwrap();
    stalled.write_all(b"POST /v1/chat/compl").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    server.shutdown().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "shutdown took {:?} with a drain of 2 s",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_during_the_drain_ends_it_at_once() {
    let server = start(1024, |c| c.drain_timeout = Duration::from_secs(600));
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let mut body = chat_body(&server, "Tell me a long story.", 400, true);
    body["ignore_eos"] = json!(true);
    let mut running = client.post(&chat).json(&body).send().await.unwrap();
    assert_eq!(running.status(), 200);
    running.chunk().await.unwrap();
    server.signal();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    server.signal();
    let rest = running.text().await.unwrap_or_default();
    let waited = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.wait().unwrap();
    });
    tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("the second stop did not end the drain")
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    // The cut stream says so and ends properly.
    assert!(rest.contains("shutting down"), "{rest}");
    assert!(rest.contains("[DONE]"), "{rest}");
}

#[test]
fn a_client_that_half_closes_after_pipelining_gets_every_response() {
    let server = start(1024, |_| {});
    let model = server.model_id().to_owned();
    let body = json!({
        "model": model,
        "prompt": "One, two,",
        "max_tokens": 3,
        "temperature": 0,
    })
    .to_string();
    let one = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(format!("{one}{one}{one}").as_bytes()).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 3, "{text}");
    assert_eq!(text.matches("\"finish_reason\"").count(), 3, "{text}");
}

/// A chat template's output is bounded by what the context holds, its work by its fuel: a
/// template bomb is a 400 (not an abort, not a hang), and renders that take long never hold the
/// completions' lane. The template is given as `--chat-template-file` would give it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_bombs_are_refused_and_do_not_starve_completions() {
    let client = reqwest::Client::new();
    for (bomb, says) in [
        (
            r#"{% for i in range(100000) %}{{ "y" * 100000 }}{% endfor %}"#,
            "more than the context can hold",
        ),
        (
            r#"{% set ns = namespace(s="") %}{% for i in range(100000) %}{% set ns.s = ns.s ~ "abcdefghij" * 100 %}{% endfor %}{{ ns.s }}"#,
            "instructions",
        ),
        // 10 KB a turn: tens of GB copied before the fuel ends it, so the deadline answers.
        (
            r#"{% set ns = namespace(s="") %}{% for i in range(100000) %}{% set ns.s = ns.s ~ "abcdefghij" * 1000 %}{% endfor %}{{ ns.s }}"#,
            "did not render within",
        ),
    ] {
        let server = start(1024, |c| {
            c.context = Some(256);
            c.chat_template = Some(bomb.to_owned());
        });
        let chat = format!("{}/v1/chat/completions", base(&server));
        let body = chat_body(&server, "Hi", 2, false);
        // Two bombs fill the render lane; a completion still goes through while they run.
        let start = Instant::now();
        let bombs: Vec<_> = (0..2)
            .map(|_| {
                let (client, chat, body) = (client.clone(), chat.clone(), body.clone());
                tokio::spawn(async move {
                    let answer = post(&client, &chat, &body).await;
                    (answer, start.elapsed())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let completion = json!({"model": server.model_id(), "prompt": "Hi", "max_tokens": 1});
        let (s, v) = post(
            &client,
            &format!("{}/v1/completions", base(&server)),
            &completion,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let completion_s = start.elapsed();
        for b in bombs {
            let ((s, v), bomb_s) = b.await.unwrap();
            // These bombs run past the deadline: the completion did not wait for them.
            if says == "did not render within" {
                assert!(completion_s < bomb_s, "{completion_s:?} >= {bomb_s:?}");
            }
            assert_eq!(s, 400, "{v}");
            let message = v["error"]["message"].as_str().unwrap();
            // (a fast machine may run out of fuel before the deadline)
            assert!(
                message.contains(says) || message.contains("instructions"),
                "{v}"
            );
            assert!(!message.contains("chat template: chat template"), "{v}");
        }
        eprintln!("{says}: completion answered in {completion_s:?} beside two bombs");
        server.shutdown().unwrap();
    }
}
