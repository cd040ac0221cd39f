//! OpenAI's request bodies (the fields ork serves) and their checks.
//!
//! Bodies are parsed with `serde_json` by the handlers themselves, so that malformed JSON and
//! wrong types come back as OpenAI-style errors naming the field, not as the HTTP framework's
//! plain-text rejections. Fields that change nothing in ork's answer (`user`, `metadata` …)
//! are ignored, as other local servers do; fields asking for what ork cannot honour (`n` > 1,
//! penalties, tools, structured output …) are refused at any value but their neutral one.
use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;

/// `stop`: one string or a list of strings.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Stop {
    /// One stop sequence.
    One(String),
    /// Several (OpenAI allows up to 4).
    Many(Vec<String>),
}

/// A message's `content`: a string, or a list of parts of which the text ones are used.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": …}`).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ContentPart {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` (or `developer`, treated as `system`).
    pub role: String,
    /// The text; `null` is allowed for an assistant turn.
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A `tool` turn answers this call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` turn's function name (optional).
    #[serde(default)]
    pub name: Option<String>,
}

/// A call in an assistant message of the conversation.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct MessageToolCall {
    /// The call's id.
    #[serde(default)]
    pub id: Option<String>,
    /// `function`.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The function called.
    pub function: FunctionCall,
}

/// The function of a [`MessageToolCall`].
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments: a JSON object as text (OpenAI's form), or the object itself.
    pub arguments: Value,
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StreamOptions {
    /// Send a last chunk with the `usage` counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length fields both endpoints share.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Common {
    /// The model id (must be the one served).
    pub model: String,
    /// Upper bound on generated tokens (default: the rest of the context).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Newer name of `max_tokens` for chat.
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Temperature in [0, 2]; 0 is greedy (default 1).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass in (0, 1] (default 1).
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Seed of the sampler (default: drawn per request).
    #[serde(default)]
    pub seed: Option<i64>,
    /// Stop sequences.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Number of choices (only 1).
    #[serde(default)]
    pub n: Option<u64>,
    /// Keep generating past end-of-generation tokens (llama.cpp server's extension; for
    /// benchmarks that need a fixed number of tokens).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Log probabilities: chat's `true`/`false`, completions' number of alternatives.
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0–20, with `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<Value>,
    /// The first field of the body that asks for what ork does not do, and why (`UNSERVED`),
    /// found by `parse`; [`Common::settings`] refuses the request with it.
    #[serde(skip)]
    pub unserved: Option<(&'static str, &'static str)>,
}

/// A field ork cannot honour: its name, whether a value is neutral (asks for nothing), and why
/// ork refuses any other value.
type UnservedField = (&'static str, fn(&Value) -> bool, &'static str);

/// OpenAI fields ork cannot honour, in the order they are checked. Clients send the neutral
/// values by default, so those are accepted; anything else is a 400 naming the field, never an
/// answer that silently lacks what was asked.
const UNSERVED: &[UnservedField] = &[
    (
        "best_of",
        |v| v.is_null() || v.as_u64() == Some(1),
        "ork samples one completion per request (best_of must be 1)",
    ),
    (
        "suffix",
        neutral,
        "ork does not fill in between a prompt and a suffix",
    ),
    ("logit_bias", neutral, "ork does not apply logit biases"),
    (
        "frequency_penalty",
        neutral,
        "ork does not apply repetition penalties",
    ),
    (
        "presence_penalty",
        neutral,
        "ork does not apply repetition penalties",
    ),
    (
        "functions",
        neutral,
        "the legacy functions field is not served: send tools",
    ),
    (
        "response_format",
        text_format,
        "ork produces free text only (type \"text\")",
    ),
];

/// `null`, `false`, 0, `""`, `[]` or `{}`.
fn neutral(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Bool(true) => false,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// `null` or `{"type": "text"}`.
fn text_format(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(o) => o.len() == 1 && o.get("type").and_then(Value::as_str) == Some("text"),
        _ => false,
    }
}

/// The first [`UNSERVED`] field of `body` that holds more than its neutral value.
fn unserved(body: &Value) -> Option<(&'static str, &'static str)> {
    UNSERVED.iter().find_map(|&(name, is_neutral, why)| {
        body.get(name)
            .is_some_and(|v| !is_neutral(v))
            .then_some((name, why))
    })
}

/// `POST /v1/chat/completions`: its own fields (the shared ones are in [`Common`], read from
/// the same body; not `#[serde(flatten)]`, which would lose the path of a field at fault).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Functions the model may call (`[{"type": "function", "function": {"name", …}}]`).
    #[serde(default)]
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": …}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// A list of one text.
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`: its own fields (the shared ones are in [`Common`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Refused unless empty: tools are a chat field.
    #[serde(default)]
    pub tools: Option<Value>,
    /// Put the prompt's text before the completion's.
    #[serde(default)]
    pub echo: Option<bool>,
}

impl CompletionRequest {
    /// Refuse chat-only fields that ask for something.
    pub fn check(&self) -> Result<(), ApiError> {
        match &self.tools {
            Some(v) if !neutral(v) => Err(ApiError::invalid(
                Some("tools"),
                "tools are served on /v1/chat/completions, where the chat template shows them \
                 to the model",
            )),
            _ => Ok(()),
        }
    }
}

/// Most alternatives per token `logprobs` / `top_logprobs` may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Largest number of stop sequences, and their longest length in bytes.
const MAX_STOPS: usize = 4;
const MAX_STOP_BYTES: usize = 256;

/// Parse a JSON body into the endpoint's fields `T` and the shared [`Common`] ones, naming the
/// field at fault.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(T, Common), ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(None, "the body is not a JSON object"));
    }
    let mut common: Common = typed(&value)?;
    common.unserved = unserved(&value);
    Ok((typed(&value)?, common))
}

fn typed<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let mut param = (path != "." && !path.is_empty()).then_some(path);
        // serde says "missing field `name`" at the path of the object lacking it: name it.
        if let Some(field) = missing_field(&inner) {
            param = Some(match param {
                Some(p) => format!("{p}.{field}"),
                None => field.to_owned(),
            });
        }
        ApiError::invalid(param.as_deref(), format!("invalid request body: {inner}"))
    })
}

/// The field serde's "missing field `name`" message names.
fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

/// The checked sampling and stopping settings of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Asked bound on generated tokens (`None`: the rest of the context).
    pub max_tokens: Option<usize>,
    /// Temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Sampler seed.
    pub seed: Option<u64>,
    /// Stop sequences (non-empty strings).
    pub stop: Vec<String>,
    /// Stream the answer.
    pub stream: bool,
    /// Add a usage chunk to the stream.
    pub include_usage: bool,
    /// Do not stop at end-of-generation tokens.
    pub ignore_eos: bool,
    /// Log probabilities with this many alternatives per token ([`Common::logprobs`]).
    pub logprobs: Option<usize>,
    /// Chat with tools: the model's tool-call format, parsed out of the reply.
    pub tool_format: Option<crate::tools::ToolFormat>,
    /// Chat with `tool_choice` required or named: the start of the reply already in the prompt.
    pub tool_prefill: String,
    /// Completions with `echo`: the prompt's text, sent before the completion's.
    pub echo: Option<String>,
}

impl Common {
    /// How many alternatives per generated token the request wants with its log probability
    /// (`None`: no log probabilities). Chat: `logprobs: true` and `top_logprobs` (0–20, only
    /// with `logprobs`); completions: `logprobs` as the number of alternatives (0–20; 0 still
    /// asks for the sampled token's).
    pub fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let count = |name: &str, v: &Value| -> Result<usize, ApiError> {
            match v.as_u64() {
                Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(n as usize),
                _ => Err(ApiError::invalid(
                    Some(name),
                    format!("{name} is {v}: expected an integer in 0..={MAX_TOP_LOGPROBS}"),
                )),
            }
        };
        let logprobs = self.logprobs.as_ref().filter(|v| !v.is_null());
        let top = self.top_logprobs.as_ref().filter(|v| !v.is_null());
        if !chat {
            if top.is_some() {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs is a chat field: completions take the count in logprobs",
                ));
            }
            return logprobs.map(|v| count("logprobs", v)).transpose();
        }
        let wanted = match logprobs {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(v) => {
                return Err(ApiError::invalid(
                    Some("logprobs"),
                    format!("logprobs is {v}: expected true or false"),
                ))
            }
        };
        let top = top.map(|v| count("top_logprobs", v)).transpose()?;
        match (wanted, top) {
            (true, top) => Ok(Some(top.unwrap_or(0))),
            (false, Some(n)) if n > 0 => Err(ApiError::invalid(
                Some("top_logprobs"),
                "top_logprobs needs logprobs: true",
            )),
            (false, _) => Ok(None),
        }
    }

    /// Check the fields shared by both endpoints.
    pub fn settings(&self) -> Result<Settings, ApiError> {
        if let Some((param, why)) = self.unserved {
            return Err(ApiError::invalid(
                Some(param),
                format!("{param}: {why}; leave it out or at its default"),
            ));
        }
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    Some("n"),
                    format!("n = {n}: ork returns one choice per request (n must be 1)"),
                ));
            }
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => Some(("max_completion_tokens", v)),
            (None, Some(v)) => Some(("max_tokens", v)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((param, 0)) => {
                return Err(ApiError::invalid(
                    Some(param),
                    format!("{param} must be at least 1"),
                ))
            }
            Some((_, v)) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
            None => None,
        };
        // Checked as the f32 the sampler uses: 1e-300 is in (0, 1] as f64 but 0 as f32.
        let temperature = self.temperature.unwrap_or(1.0);
        let temperature32 = temperature as f32;
        if !(0.0..=2.0).contains(&temperature32) || !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("temperature {temperature} is not in [0, 2]"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        let top_p32 = top_p as f32;
        if !(top_p32 > 0.0 && top_p32 <= 1.0 && top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!(
                    "top_p {top_p} is not in (0, 1] as a 32-bit float (the smallest is {:e})",
                    f32::from_bits(1)
                ),
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("{} stop sequences: at most {MAX_STOPS}", stop.len()),
            ));
        }
        if stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("a stop sequence is longer than {MAX_STOP_BYTES} bytes"),
            ));
        }
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        Ok(Settings {
            max_tokens,
            temperature: temperature32,
            top_p: top_p32,
            seed: self.seed.map(|s| s as u64),
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs: None,
            tool_format: None,
            tool_prefill: String::new(),
            echo: None,
        })
    }
}

impl Message {
    /// The message's text (parts joined), or an error naming the message.
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(s)) => Ok(s.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                Some(&format!("messages[{index}].content[{j}]")),
                                format!(
                                    "content part of type {:?}: only text parts are served",
                                    p.kind
                                ),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiErrorKind;

    #[test]
    fn wrong_types_name_the_field() {
        let e =
            parse::<ChatRequest>(br#"{"model":"m","messages":[],"max_tokens":"ten"}"#).unwrap_err();
        assert_eq!(e.kind, ApiErrorKind::InvalidRequest);
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = parse::<ChatRequest>(br#"{"model":"m","messages":[{"role":"user","content":"hi""#)
            .unwrap_err();
        assert_eq!(e.kind, ApiErrorKind::InvalidRequest);
        let e = parse::<ChatRequest>(br#"{"model":"m","messages":[{"role":"user","content":5}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        // A missing field is named, at its own path.
        let e = parse::<ChatRequest>(br#"{"messages":[]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = parse::<ChatRequest>(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse::<ChatRequest>(br#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = parse::<CompletionRequest>(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse::<ChatRequest>(b"[1]").unwrap_err();
        assert_eq!(e.kind, ApiErrorKind::InvalidRequest);
    }

    #[test]
    fn neutral_values_of_unserved_fields_are_accepted() {
        for ok in [
            r#"{"model":"m","messages":[],"logprobs":false,"top_logprobs":0}"#,
            r#"{"model":"m","messages":[],"logprobs":true,"top_logprobs":20}"#,
            r#"{"model":"m","messages":[],"logprobs":null,"best_of":1}"#,
            r#"{"model":"m","messages":[],"suffix":"","logit_bias":{},"tools":[]}"#,
            r#"{"model":"m","messages":[],"frequency_penalty":0,"presence_penalty":0.0}"#,
            r#"{"model":"m","messages":[],"response_format":{"type":"text"},"user":"u"}"#,
        ] {
            let (_, common) = parse::<ChatRequest>(ok.as_bytes()).unwrap();
            common
                .settings()
                .unwrap_or_else(|e| panic!("{ok}: {}", e.message));
        }
        let (_, common) =
            parse::<ChatRequest>(br#"{"model":"m","messages":[],"presence_penalty":0.1}"#).unwrap();
        let e = common.settings().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("presence_penalty"));
        assert!(e.message.contains("repetition penalties"), "{}", e.message);
    }

    #[test]
    fn logprobs_are_checked_per_endpoint() {
        let lp = |body: &str, chat: bool| {
            let (_, common) = parse::<Value>(body.as_bytes()).unwrap();
            common.logprobs(chat)
        };
        assert_eq!(lp(r#"{"model":"m"}"#, true), Ok(None));
        assert_eq!(lp(r#"{"model":"m","logprobs":true}"#, true), Ok(Some(0)));
        assert_eq!(
            lp(r#"{"model":"m","logprobs":true,"top_logprobs":5}"#, true),
            Ok(Some(5))
        );
        assert_eq!(lp(r#"{"model":"m","logprobs":0}"#, false), Ok(Some(0)));
        assert_eq!(lp(r#"{"model":"m","logprobs":3}"#, false), Ok(Some(3)));
        for (bad, chat, param) in [
            (
                r#"{"model":"m","logprobs":true,"top_logprobs":21}"#,
                true,
                "top_logprobs",
            ),
            (r#"{"model":"m","top_logprobs":2}"#, true, "top_logprobs"),
            (r#"{"model":"m","logprobs":3}"#, true, "logprobs"),
            (r#"{"model":"m","logprobs":21}"#, false, "logprobs"),
            (r#"{"model":"m","logprobs":true}"#, false, "logprobs"),
            (r#"{"model":"m","logprobs":-1}"#, false, "logprobs"),
            (r#"{"model":"m","top_logprobs":1}"#, false, "top_logprobs"),
        ] {
            let e = lp(bad, chat).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{bad}");
        }
    }

    #[test]
    fn settings_are_checked() {
        let (_, common) = parse::<ChatRequest>(
            br#"{"model":"m","messages":[],"temperature":0,"stop":"\n","seed":3}"#,
        )
        .unwrap();
        let s = common.settings().unwrap();
        assert_eq!(
            (s.temperature, s.stop, s.seed),
            (0.0, vec!["\n".to_owned()], Some(3))
        );
        for bad in [
            r#"{"model":"m","messages":[],"temperature":3}"#,
            r#"{"model":"m","messages":[],"top_p":0}"#,
            r#"{"model":"m","messages":[],"top_p":1e-300}"#,
            r#"{"model":"m","messages":[],"temperature":1e300}"#,
            r#"{"model":"m","messages":[],"n":2}"#,
            r#"{"model":"m","messages":[],"max_tokens":0}"#,
            r#"{"model":"m","messages":[],"stop":["a","b","c","d","e"]}"#,
            r#"{"model":"m","messages":[],"best_of":2}"#,
            r#"{"model":"m","messages":[],"suffix":"end"}"#,
            r#"{"model":"m","messages":[],"logit_bias":{"50256":-100}}"#,
            r#"{"model":"m","messages":[],"frequency_penalty":0.5}"#,
            r#"{"model":"m","messages":[],"presence_penalty":-1}"#,
            r#"{"model":"m","messages":[],"functions":[{"name":"f"}]}"#,
            r#"{"model":"m","messages":[],"response_format":{"type":"json_object"}}"#,
            r#"{"model":"m","messages":[],"response_format":"json"}"#,
        ] {
            let (_, common) = parse::<ChatRequest>(bad.as_bytes()).unwrap();
            let e = common.settings().unwrap_err();
            assert_eq!(e.kind, ApiErrorKind::InvalidRequest, "{bad}");
            // The field at fault is named.
            let field = bad.split('"').nth(7).unwrap();
            assert_eq!(e.param.as_deref(), Some(field), "{bad}");
        }
    }
}
