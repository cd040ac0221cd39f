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

/// llama.cpp's greedy continuation of a fixed prompt with its top-5 log probabilities
/// (scripts/serve_logprobs_golden.py).
#[derive(serde::Deserialize)]
struct Golden {
    prompt_tokens: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(serde::Deserialize)]
struct Step {
    token: String,
    logprob: f64,
    top: Vec<Alt>,
}

#[derive(serde::Deserialize)]
struct Alt {
    token: String,
    logprob: f64,
}

/// How far ork serve's log probabilities are from llama.cpp's for `quant` (asserting the same
/// greedy tokens): the largest difference of the sampled tokens' log probabilities, and of the
/// top-5 alternatives' probabilities.
/// Tolerances (sampled log probability in nats, alternative probability) for fp16 weights and
/// activations, and for the default int8 ones.
const TOL_FP16: (f64, f64) = (0.1, 0.06);
const TOL_INT8: (f64, f64) = (0.4, 0.3);

async fn differences(quant: ork_runtime::Quant, name: &str) -> (f64, f64) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/smollm2_logprobs.json"
    );
    let g: Golden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut c = ork_runtime::EngineConfig::new(ork_testkit::model_path());
    // The default quantization shares the other tests' pack.
    c.pack = ork_runtime::PackChoice::Path(if quant == ork_runtime::Quant::W8a8 {
        pack_path()
    } else {
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ork-server-smollm2-{name}.orkpack"))
    });
    c.budget_bytes = Some(1024 << 20);
    c.device = ork_runtime::DeviceKind::Emu;
    c.set_quant(quant);
    let engine = ork_runtime::Engine::open(c).unwrap();
    let config = ork_server::ServeConfig {
        port: 0,
        ..ork_server::ServeConfig::default()
    };
    let server = ork_server::Server::start(engine, config).unwrap();
    let (s, v) = post(
        &reqwest::Client::new(),
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": server.model_id(), "prompt": g.prompt_tokens,
                "max_tokens": g.steps.len(), "temperature": 0, "logprobs": 5}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let (mut sampled, mut alt_prob) = (0.0f64, 0.0f64);
    for (i, step) in g.steps.iter().enumerate() {
        assert_eq!(
            lp["tokens"][i],
            step.token.as_str(),
            "{name} step {i}: {lp}"
        );
        let ours = lp["token_logprobs"][i].as_f64().unwrap();
        sampled = sampled.max((ours - step.logprob).abs());
        let alts = lp["top_logprobs"][i].as_object().unwrap();
        // ork's fifth alternative: one of llama.cpp's top 5 that ork ranks below it (a near
        // tie at the cut) must be no more likely than it, within the tolerance.
        let cut = alts
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::INFINITY, f64::min);
        for a in &step.top {
            let d = match alts.get(&a.token).and_then(Value::as_f64) {
                Some(ours) => (ours.exp() - a.logprob.exp()).abs(),
                None => (a.logprob.exp() - cut.exp()).max(0.0),
            };
            alt_prob = alt_prob.max(d);
        }
    }
    eprintln!(
        "{name}: {} greedy tokens as llama.cpp's; largest difference of a sampled token's log \
         probability {sampled:.4} nats, of a top-5 alternative's probability {alt_prob:.4}",
        g.steps.len()
    );
    (sampled, alt_prob)
}

/// ork serve's log probabilities against llama.cpp's for the same file and prompt (greedy
/// tokens identical; values within the tolerances docs/serve.md states, "Log probabilities").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_match_llama_cpp() {
    let _memory = MEMORY.lock().await;
    let fp16 = differences(ork_runtime::Quant::W16a16, "w16a16").await;
    let int8 = differences(ork_runtime::Quant::W8a8, "w8a8").await;
    assert!(
        fp16.0 < TOL_FP16.0 && fp16.1 < TOL_FP16.1,
        "w16a16: {fp16:?}"
    );
    assert!(int8.0 < TOL_INT8.0 && int8.1 < TOL_INT8.1, "w8a8: {int8:?}");
}
