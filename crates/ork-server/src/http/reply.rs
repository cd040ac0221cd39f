//! Answering from the scheduler's events: one JSON object when the job is done, or an SSE
//! stream of chunks as the text arrives (tool calls parsed out of either).
use super::objects::{finish_reason, Format};
use super::Kind;
use crate::error::{ApiError, ApiErrorKind};
use crate::scheduler::{Event, TokenLogprob};
use crate::tools::{ToolDelta, ToolParser};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use tokio::sync::mpsc;

pub(super) async fn full_response(
    mut rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    prompt_tokens: usize,
    logprobs: bool,
    tools: Option<ToolParser>,
    echo: String,
) -> Response {
    // Completions' `echo`: the prompt's text first.
    let mut text = echo;
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Logprob(t) => tokens.push(t),
            Event::Done {
                finish,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => {
                let lp = format.logprobs(logprobs.then_some(&tokens[..]), 0);
                let mut calls = Vec::new();
                if let Some(mut parser) = tools {
                    let mut deltas = parser.push(&text);
                    deltas.extend(parser.finish());
                    text.clear();
                    for d in deltas {
                        match d {
                            ToolDelta::Content(c) => text.push_str(&c),
                            ToolDelta::Call(c) => calls.push(c),
                        }
                    }
                }
                let done = format.complete(
                    &text,
                    &calls,
                    lp,
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                );
                return Json(done).into_response();
            }
            Event::Failed(msg) => {
                return ApiError::new(ApiErrorKind::Internal, msg).into_response();
            }
        }
    }
    ApiError::new(
        ApiErrorKind::Internal,
        format!("the scheduler stopped before answering ({prompt_tokens} prompt tokens)"),
    )
    .into_response()
}

/// The state of one SSE stream.
struct Streaming {
    rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    include_usage: bool,
    /// Log probabilities asked for: those of tokens not yet sent ride on the next chunk.
    logprobs: bool,
    tokens: Vec<TokenLogprob>,
    /// Characters of text sent so far (completions' `text_offset`).
    sent_chars: usize,
    pending: VecDeque<SseEvent>,
    ended: bool,
    /// Chat with tools: the reply's parser, and the calls sent so far.
    tools: Option<ToolParser>,
    calls: usize,
}

impl Streaming {
    /// Put the log probabilities of the tokens not yet sent on `chunk`.
    fn attach_logprobs(&mut self, chunk: &mut Value) {
        if self.logprobs {
            let tokens = std::mem::take(&mut self.tokens);
            chunk["choices"][0]["logprobs"] = self.format.logprobs(Some(&tokens), self.sent_chars);
        }
    }

    /// Queue the chunks of `deltas` (the log probabilities not yet sent ride on the first).
    fn send_deltas(&mut self, deltas: Vec<ToolDelta>) {
        for d in deltas {
            let (chunks, chars) = match d {
                ToolDelta::Content(t) => (
                    vec![self.format.chunk(Some(&t), None, false)],
                    t.chars().count(),
                ),
                ToolDelta::Call(call) => {
                    self.calls += 1;
                    (self.format.call_chunks(self.calls - 1, &call).to_vec(), 0)
                }
            };
            for mut c in chunks {
                self.attach_logprobs(&mut c);
                self.pending.push_back(data(&c));
            }
            self.sent_chars += chars;
        }
    }
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

pub(super) fn stream_response(
    rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    include_usage: bool,
    logprobs: bool,
    tools: Option<ToolParser>,
    echo: String,
) -> Response {
    let mut pending = VecDeque::new();
    if format.kind == Kind::Chat {
        pending.push_back(data(&format.chunk(Some(""), None, true)));
    }
    if !echo.is_empty() {
        pending.push_back(data(&format.chunk(Some(&echo), None, false)));
    }
    let state = Streaming {
        rx,
        format,
        include_usage,
        logprobs,
        tokens: Vec::new(),
        sent_chars: 0,
        pending,
        ended: false,
        tools,
        calls: 0,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(ev), s));
            }
            if s.ended {
                return None;
            }
            match s.rx.recv().await {
                Some(Event::Text(t)) => {
                    let deltas = match &mut s.tools {
                        Some(parser) => parser.push(&t),
                        None => vec![ToolDelta::Content(t)],
                    };
                    s.send_deltas(deltas);
                }
                Some(Event::Logprob(t)) => s.tokens.push(t),
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                }) => {
                    if let Some(parser) = s.tools.take() {
                        s.send_deltas(parser.finish());
                    }
                    let reason = finish_reason(finish, s.calls);
                    let mut c = s.format.chunk(None, Some(reason), false);
                    s.attach_logprobs(&mut c);
                    s.pending.push_back(data(&c));
                    if s.include_usage {
                        let mut u = s.format.chunk(None, None, false);
                        u["choices"] = json!([]);
                        u["usage"] = Format::usage(prompt_tokens, cached_tokens, completion_tokens);
                        s.pending.push_back(data(&u));
                    }
                    s.pending.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                }
                Some(Event::Failed(msg)) => {
                    let e = ApiError::new(ApiErrorKind::Internal, msg);
                    s.pending.push_back(data(&e.body()));
                    s.pending.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                }
                None => s.ended = true,
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
