//! The API's shapes, usage counts, streaming == non-streaming, and batched greedy identity.
use super::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_stream_the_same_text_with_correct_usage() {
    let server = start(1024, |_| {});
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", base(&server));
    let (status, full) = post(
        &client,
        &url,
        &chat_body(&server, "What is 2+2?", 10, false),
    )
    .await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!text.is_empty());
    let usage = &full["usage"];
    let (p, c) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), p + c);
    // The prompt is the model's chat template around the message (SmolLM2 adds its system turn).
    assert!(p > 20, "{usage}");
    assert!((1..=10).contains(&c));
    if c == 10 {
        assert_eq!(full["choices"][0]["finish_reason"], "length");
    }

    let mut body = chat_body(&server, "What is 2+2?", 10, true);
    body["stream_options"] = json!({"include_usage": true});
    let sse = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(sse.status(), 200);
    assert!(sse.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let sse = sse.text().await.unwrap();
    let (streamed, last) = sse_text(&sse);
    assert_eq!(streamed, text);
    assert_eq!(last["object"], "chat.completion.chunk");
    assert_eq!(
        last["choices"][0]["finish_reason"],
        full["choices"][0]["finish_reason"]
    );
    let data = sse_data(&sse);
    let usage_chunk: serde_json::Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    let streamed_usage = &usage_chunk["usage"];
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(streamed_usage[field], usage[field], "{field}");
    }
    // The same prompt again: all of it but its last token came from the first one's cache.
    assert_eq!(
        streamed_usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        usage["prompt_tokens"].as_u64().map(|n| n - 1)
    );

    let url = format!("{}/v1/completions", base(&server));
    let body = json!({"model": server.model_id(), "prompt": "The capital of France is",
                      "max_tokens": 6, "temperature": 0});
    let (status, full) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["object"], "text_completion");
    let text = full["choices"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(full["usage"]["completion_tokens"], 6);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let sse = client
        .post(&url)
        .json(&sbody)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(sse_text(&sse).0, text);

    // A stop sequence cuts the text before it and ends with "stop".
    let cut = text.chars().skip(2).take(2).collect::<String>();
    if !cut.trim().is_empty() {
        let mut b = body.clone();
        b["stop"] = json!([cut.clone()]);
        let (_, stopped) = post(&client, &url, &b).await;
        let s = stopped["choices"][0]["text"].as_str().unwrap();
        assert_eq!(s, &text[..text.find(&cut).unwrap()]);
        assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    }

    // echo: the prompt's text before the completion's, whole and streamed; not with logprobs.
    let mut b = body.clone();
    b["echo"] = json!(true);
    let (status, echoed) = post(&client, &url, &b).await;
    assert_eq!(status, 200, "{echoed}");
    assert_eq!(
        echoed["choices"][0]["text"].as_str().unwrap(),
        format!("The capital of France is{text}")
    );
    b["stream"] = json!(true);
    let sse = post_text(&client, &url, &b).await;
    assert_eq!(sse_text(&sse).0, format!("The capital of France is{text}"));
    b["stream"] = json!(false);
    b["logprobs"] = json!(1);
    let (status, refused) = post(&client, &url, &b).await;
    assert_eq!(
        (status, refused["error"]["param"].as_str()),
        (400, Some("echo"))
    );

    let models: serde_json::Value = client
        .get(format!("{}/v1/models", base(&server)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], server.model_id());
    let health = client
        .get(format!("{}/health", base(&server)))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        metric(
            &client,
            &server,
            "ork_requests_total",
            "{outcome=\"completed\"}"
        )
        .await,
        6.0 + f64::from(u8::from(!cut.trim().is_empty()))
    );
}

/// Four different prompts sent at once (batched in the same steps) give each the text it gets
/// alone, at a quarter budget (streamed weights) and resident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_greedy_requests_match_their_answers_alone() {
    let prompts = [
        "What is the capital of France?",
        "Name three colours.",
        "Write a haiku about the sea.",
        "How many legs does a spider have?",
    ];
    for budget_mb in [33, 1024] {
        let server = start(budget_mb, |c| c.prefill_chunk = 16);
        let client = reqwest::Client::new();
        let url = format!("{}/v1/chat/completions", base(&server));
        let mut alone = Vec::new();
        for p in prompts {
            let (s, v) = post(&client, &url, &chat_body(&server, p, 12, false)).await;
            assert_eq!(s, 200);
            alone.push(
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        let steps_before = metric(&client, &server, "ork_batched_steps_total", "").await;
        let together = futures_util::future::join_all(prompts.iter().map(|p| {
            let (client, url, body) =
                (client.clone(), url.clone(), chat_body(&server, p, 12, true));
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
        assert_eq!(alone, together, "budget {budget_mb} MiB");
        // Batched: far fewer steps than the four run one after the other would take.
        let steps = metric(&client, &server, "ork_batched_steps_total", "").await - steps_before;
        let alone_steps = 4.0 * (12.0 + 3.0);
        assert!(
            steps < alone_steps * 0.6,
            "{steps} steps for 4 concurrent requests"
        );
    }
}
