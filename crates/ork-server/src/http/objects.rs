//! OpenAI's response objects: the whole completion, the stream chunks, usage, log
//! probabilities and tool calls, for chat and for completions.
use super::Kind;
use crate::scheduler::{Finish, TokenLogprob};
use crate::tools::ToolCall;
use serde_json::{json, Value};

/// The fixed fields of one response's objects.
pub(super) struct Format {
    pub(super) kind: Kind,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
}

impl Format {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    pub(super) fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// OpenAI's `logprobs` object for `tokens` (`null` when none were asked for); completions'
    /// `text_offset`s count characters from `offset`, the length of the text before them.
    pub(super) fn logprobs(&self, tokens: Option<&[TokenLogprob]>, offset: usize) -> Value {
        let Some(tokens) = tokens else {
            return Value::Null;
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self.kind {
            Kind::Chat => {
                let entry =
                    |b: &[u8], lp: f32| json!({"token": text(b), "logprob": lp, "bytes": b});
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let mut e = entry(&t.bytes, t.logprob);
                        e["top_logprobs"] = t.top.iter().map(|(b, lp)| entry(b, *lp)).collect();
                        e
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Completion => {
                let mut at = offset;
                let mut offsets = Vec::with_capacity(tokens.len());
                for t in tokens {
                    offsets.push(at);
                    at += text(&t.bytes).chars().count();
                }
                json!({
                    "tokens": tokens.iter().map(|t| text(&t.bytes)).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens
                        .iter()
                        .map(|t| {
                            t.top
                                .iter()
                                .map(|(b, lp)| (text(b), json!(lp)))
                                .collect::<serde_json::Map<_, _>>()
                        })
                        .collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    /// The stream chunks of call `index` (chat): its id and name, then its arguments.
    pub(super) fn call_chunks(&self, index: usize, call: &ToolCall) -> [Value; 2] {
        let with = |delta: Value| {
            let mut c = self.chunk(None, None, false);
            c["choices"][0]["delta"] = json!({ "tool_calls": [delta] });
            c
        };
        [
            with(json!({
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            })),
            with(json!({"index": index, "function": {"arguments": call.arguments}})),
        ]
    }

    /// A stream chunk with `text` (chat: a delta) and a finish reason.
    pub(super) fn chunk(&self, text: Option<&str>, finish: Option<&str>, first: bool) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({
                    "index": 0,
                    "delta": delta,
                    "logprobs": null,
                    "finish_reason": finish,
                })
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    /// The whole answer (chat: `calls` parsed out of the reply, `text` the rest).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete(
        &self,
        text: &str,
        calls: &[ToolCall],
        logprobs: Value,
        finish: Finish,
        prompt: usize,
        cached: usize,
        completion: usize,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls.iter().map(call_json).collect();
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(finish, calls.len()),
                })
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": Self::usage(prompt, cached, completion),
        })
    }
}

/// OpenAI's `finish_reason`: `tool_calls` when the model stopped after calling.
pub(super) fn finish_reason(finish: Finish, calls: usize) -> &'static str {
    if calls > 0 && finish == Finish::Stop {
        "tool_calls"
    } else {
        finish.as_str()
    }
}

/// A complete call as in a message's `tool_calls`.
fn call_json(c: &ToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}
