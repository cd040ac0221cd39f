//! The HTTP front: axum routes, authentication, request checks, JSON and SSE responses.
use crate::api::{self, ChatRequest, CompletionRequest, Prompt, Settings};
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::Metrics;
use crate::scheduler::{Event, Finish, Job};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ork_exec::{ChatMessage, ChatTemplate, SamplerOptions, Tokenizer};
use ork_runtime::Engine;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What every handler shares.
pub(crate) struct AppState {
    pub engine: Arc<Engine>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    pub context: usize,
    pub queue: crossbeam_channel::Sender<Job>,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Set by SIGTERM (or [`crate::Server::shutdown`]): new requests are refused.
    pub draining: AtomicBool,
    pub next_id: AtomicU64,
}

/// The routes: `/v1/*` behind the optional bearer key; `/health` and `/metrics` open.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            authenticate,
        ))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn authenticate(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            st.metrics.rejected_invalid.fetch_add(1, Ordering::Relaxed);
            return ApiError::new(
                ApiErrorKind::Authentication,
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found() -> Response {
    ApiError::new(ApiErrorKind::NotFound, "no such route").into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.draining.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(&st.engine);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "ork",
        }],
    }))
    .into_response()
}

/// Which endpoint a response is for (the shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let prepared = (|| {
        let (req, common): (ChatRequest, _) = api::parse(&body)?;
        check_model(&st, &common.model)?;
        let settings = common.settings()?;
        if req.messages.is_empty() {
            return Err(ApiError::invalid(
                Some("messages"),
                "messages is empty: give at least one message",
            ));
        }
        let mut messages = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].role")),
                        format!("role {other:?}: expected system, user or assistant"),
                    ))
                }
            };
            messages.push(ChatMessage::new(role, &m.text(i)?));
        }
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::invalid(None, "the model has no chat template: use /v1/completions")
        })?;
        let text = template
            .render(&messages, true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        let prompt = st
            .tokenizer
            .encode(&text, false, true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        Ok((prompt, settings))
    })();
    respond(&st, Kind::Chat, prepared).await
}

async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let prepared = (|| {
        let (req, common): (CompletionRequest, _) = api::parse(&body)?;
        check_model(&st, &common.model)?;
        let settings = common.settings()?;
        let prompt = match &req.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Texts(v) if v.len() == 1 => v[0].clone(),
            Prompt::Texts(v) => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    format!("{} prompts: ork takes one prompt per request", v.len()),
                ))
            }
            Prompt::Tokens(t) => {
                if let Some(bad) = t.iter().find(|&&t| t as usize >= st.tokenizer.vocab_size()) {
                    return Err(ApiError::invalid(
                        Some("prompt"),
                        format!(
                            "token id {bad} is out of range (vocabulary of {})",
                            st.tokenizer.vocab_size()
                        ),
                    ));
                }
                return Ok((t.clone(), settings));
            }
        };
        let tokens = st
            .tokenizer
            .encode(&prompt, true, false)
            .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?;
        Ok((tokens, settings))
    })();
    respond(&st, Kind::Completion, prepared).await
}

fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    if model == st.model_id {
        Ok(())
    } else {
        Err(ApiError {
            kind: ApiErrorKind::NotFound,
            message: format!(
                "the model {model:?} does not exist: this server serves {:?}",
                st.model_id
            ),
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
        })
    }
}

/// Check the length, queue the job and answer (JSON or SSE).
async fn respond(
    st: &Arc<AppState>,
    kind: Kind,
    prepared: Result<(Vec<u32>, Settings), ApiError>,
) -> Response {
    let submitted = prepared.and_then(|(prompt, settings)| submit(st, kind, prompt, settings));
    let (rx, settings, prompt_tokens) = match submitted {
        Ok(s) => s,
        Err(e) => {
            let counter = if e.kind == ApiErrorKind::Overloaded {
                &st.metrics.rejected_overloaded
            } else {
                &st.metrics.rejected_invalid
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let format = Format {
        kind,
        id: match kind {
            Kind::Chat => format!("chatcmpl-{id}"),
            Kind::Completion => format!("cmpl-{id}"),
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: st.model_id.clone(),
    };
    if settings.stream {
        stream_response(rx, format, settings.include_usage)
    } else {
        full_response(rx, format, prompt_tokens).await
    }
}

fn submit(
    st: &AppState,
    kind: Kind,
    prompt: Vec<u32>,
    settings: Settings,
) -> Result<(mpsc::UnboundedReceiver<Event>, Settings, usize), ApiError> {
    if st.draining.load(Ordering::Relaxed) {
        return Err(ApiError::new(
            ApiErrorKind::Overloaded,
            "the server is shutting down",
        ));
    }
    // The field the prompt came from.
    let prompt_param = match kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(Some(prompt_param), "the prompt is empty"));
    }
    let n = prompt.len();
    if n >= st.context {
        return Err(ApiError::invalid(
            Some(prompt_param),
            format!(
                "the prompt has {n} tokens, but the context is {} tokens (room is needed for at \
                 least one generated token)",
                st.context
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let max_tokens = match settings.max_tokens {
        None => st.context - n,
        Some(m) if m > st.context - n => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                format!(
                    "max_tokens is {m}, but the prompt has {n} tokens and the context is {} \
                     tokens: at most {} can be generated",
                    st.context,
                    st.context - n
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(m) => m,
    };
    let seed = settings.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ st.next_id.load(Ordering::Relaxed).rotate_left(32)
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler: SamplerOptions {
            temperature: settings.temperature,
            top_k: 0,
            top_p: settings.top_p,
            seed,
        },
        stop: settings.stop.clone(),
        ignore_eos: settings.ignore_eos,
        events: tx,
    };
    match st.queue.try_send(job) {
        Ok(()) => {
            st.metrics.accepted.fetch_add(1, Ordering::Relaxed);
            Ok((rx, settings, n))
        }
        Err(crossbeam_channel::TrySendError::Full(_)) => Err(ApiError::new(
            ApiErrorKind::Overloaded,
            "the request queue is full: try again shortly",
        )
        .with_code("queue_full")),
        Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(ApiError::new(
            ApiErrorKind::Overloaded,
            "the server is shutting down",
        )),
    }
}

/// The fixed fields of one response's objects.
struct Format {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Format {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn usage(prompt: usize, completion: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// A stream chunk with `text` (chat: a delta) and a finish reason.
    fn chunk(&self, text: Option<&str>, finish: Option<Finish>, first: bool) -> Value {
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
                    "finish_reason": finish.map(Finish::as_str),
                })
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish.map(Finish::as_str),
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

    /// The whole answer.
    fn complete(&self, text: &str, finish: Finish, prompt: usize, completion: usize) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": Self::usage(prompt, completion),
        })
    }
}

async fn full_response(
    mut rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    prompt_tokens: usize,
) -> Response {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                return Json(format.complete(&text, finish, prompt_tokens, completion_tokens))
                    .into_response()
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
    pending: VecDeque<SseEvent>,
    ended: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn stream_response(
    rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    include_usage: bool,
) -> Response {
    let mut pending = VecDeque::new();
    if format.kind == Kind::Chat {
        pending.push_back(data(&format.chunk(Some(""), None, true)));
    }
    let state = Streaming {
        rx,
        format,
        include_usage,
        pending,
        ended: false,
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
                    let c = s.format.chunk(Some(&t), None, false);
                    s.pending.push_back(data(&c));
                }
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let c = s.format.chunk(None, Some(finish), false);
                    s.pending.push_back(data(&c));
                    if s.include_usage {
                        let mut u = s.format.chunk(None, None, false);
                        u["choices"] = json!([]);
                        u["usage"] = Format::usage(prompt_tokens, completion_tokens);
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
