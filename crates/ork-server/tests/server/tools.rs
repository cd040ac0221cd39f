//! Tool calls through HTTP: the model's template shows the tools, the reply is parsed into
//! OpenAI `tool_calls` (whole and streamed), and what the template cannot express is a 400.
//! SmolLM2-135M does not call tools reliably, so the reply is scripted
//! (`Server::start_scripted`: its tokens stand in for the sampled ones, through the model and
//! the whole reply path), under Qwen2.5's template (ChatML, as SmolLM2's own).
use super::common::*;
use ork_server::{ServeConfig, Server};
use serde_json::{json, Value};

/// Qwen2.5-Instruct's chat template (Hermes-style `<tool_call>` calls).
pub const QWEN25_TEMPLATE: &str = include_str!("../templates/qwen2.5-instruct.jinja");

/// The scripted reply: text, then a call.
pub const REPLY: &str = "Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "unit": {"type": "string"}}, "required": ["city"]}}}])
}

fn scripted() -> Server {
    let config = ServeConfig {
        port: 0,
        chat_template: Some(QWEN25_TEMPLATE.to_owned()),
        api_key: Some("test-key".to_owned()),
        ..ServeConfig::default()
    };
    Server::start_scripted(engine(1024), config, REPLY).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_parsed_and_refused_when_the_template_cannot_show_tools() {
    let server = scripted();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", base(&server));
    let post = |body: Value| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let r = client
                .post(&url)
                .bearer_auth("test-key")
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let mut body = chat_body(&server, "What is the weather in Paris?", 200, false);
    let (s, plain) = post(body.clone()).await;
    assert_eq!(s, 200, "{plain}");
    body["tools"] = weather_tool();
    let (s, v) = post(body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Let me look that up.");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "unit": "celsius"}));
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    // The rendered prompt carried the tools (Qwen's tools block is ~100 tokens).
    let with = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let without = plain["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(with > without + 50, "{with} vs {without}");
    // tool_choice none: the tools are not shown and the reply is plain text.
    body["tool_choice"] = json!("none");
    let (s, v) = post(body.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), without);
    // Refusals name the field.
    for (patch, param) in [
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tools": [{"type": "function"}]}), "tools[0]"),
        (json!({"tools": "get_weather"}), "tools"),
        (
            json!({"tools": [], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": "get_weather", "arguments": "{not json"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
        ),
        // A tool turn answers a call: without its id it is refused.
        (
            json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "content": "sunny"}]}),
            "messages[2].tool_call_id",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools[0].function.parameters",
        ),
    ] {
        let mut b = body.clone();
        b["tool_choice"] = json!("auto");
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (s, v) = post(b).await;
        assert_eq!(s, 400, "{patch}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    // Arguments nested deeper than the JSON reader takes: refused saying so, not "not a
    // JSON object".
    let deep = format!("{}1{}", "{\"a\":".repeat(5000), "}".repeat(5000));
    let mut b = body.clone();
    b["tool_choice"] = json!("auto");
    b["messages"] = json!([{"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "get_weather", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}]);
    let (s, v) = post(b).await;
    assert_eq!(s, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("nest deeper"), "{v}");
    server.shutdown().unwrap();

    // SmolLM2's own template has no tools variable: tools, tool turns and calls are refused.
    let server = start(1024, |_| {});
    let url = format!("{}/v1/chat/completions", base(&server));
    let mut body = chat_body(&server, "Weather?", 4, false);
    body["tools"] = weather_tool();
    let (s, v) = super::common::post(&client, &url, &body).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tools variable"),
        "{v}"
    );
    let body = json!({"model": server.model_id(), "max_tokens": 4, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}]});
    let (s, v) = super::common::post(&client, &url, &body).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "messages[1].role");
    // tool_choice none asks for nothing the template cannot do.
    let mut body = chat_body(&server, "Weather?", 4, false);
    body["tools"] = weather_tool();
    body["tool_choice"] = json!("none");
    let (s, v) = super::common::post(&client, &url, &body).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = super::common::post(
        &client,
        &format!("{}/v1/completions", base(&server)),
        &json!({"model": server.model_id(), "prompt": "hi", "max_tokens": 2, "tools": weather_tool()}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("tools")),
        "{v}"
    );
    server.shutdown().unwrap();
}

#[test]
fn the_official_openai_client_reads_tool_calls() {
    let server = scripted();
    run_openai_script("openai_tools.py", &server, "test-key");
}
