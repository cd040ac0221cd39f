//! Log probabilities on chat and completions: one entry per generated token, a distribution
//! (log-softmax of the logits the sampler saw), the greedy token first among its alternatives,
//! the same streamed and not.
use super::common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_describe_each_generated_token() {
    let server = start(1024, |_| {});
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", base(&server));
    let mut body = chat_body(&server, "Name three colours.", 10, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(20);
    let (s, v) = post(&client, &chat, &body).await;
    assert_eq!(s, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut spelled = Vec::new();
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 20);
        // Greedy: the sampled token is the most likely one.
        assert_eq!(top[0]["token"], t["token"], "{t}");
        assert_eq!(top[0]["logprob"], t["logprob"]);
        let lps: Vec<f64> = top.iter().map(|e| e["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        let mass: f64 = lps.iter().map(|l| l.exp()).sum();
        assert!(lp <= 0.0 && mass <= 1.0 + 1e-4 && mass > 0.0, "{lp} {mass}");
        spelled.extend(
            t["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&spelled),
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // Streamed: the same entries, spread over the chunks.
    body["stream"] = json!(true);
    let text = post_text(&client, &chat, &body).await;
    let mut streamed: Vec<Value> = Vec::new();
    for d in sse_data(&text) {
        if d == "[DONE]" {
            continue;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        if let Some(lp) = c["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(lp.iter().cloned());
        }
    }
    assert_eq!(&streamed, content);
    // Without asking: null.
    let (_, v) = post(&client, &chat, &chat_body(&server, "Hi", 2, false)).await;
    assert!(v["choices"][0]["logprobs"].is_null());
    // Completions: the count of alternatives in `logprobs`.
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": server.model_id(), "prompt": "One, two, three,", "max_tokens": 6,
                "temperature": 0, "logprobs": 3}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["text_offset"][0], 0);
    for (tok, alts) in lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["top_logprobs"].as_array().unwrap())
    {
        let alts = alts.as_object().unwrap();
        assert!(!alts.is_empty() && alts.len() <= 3);
        assert!(
            alts.contains_key(tok.as_str().unwrap()),
            "{tok} not in {alts:?}"
        );
    }
}
