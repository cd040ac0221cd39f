//! The HTTP front: axum routes, authentication, request checks, JSON and SSE responses.
use crate::api::{self, ChatRequest, CompletionRequest, Prompt, Settings};
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::Metrics;
use crate::scheduler::{Event, Finish, Job, TokenLogprob};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ork_exec::{ChatMessage, ChatTemplate, Sampler, SamplerOptions, Tokenizer};
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
    /// A prompt text longer than this many bytes cannot fit the context ([`max_prompt_bytes`]).
    pub prompt_bytes: usize,
    /// Request bodies are refused (413) beyond this many bytes.
    pub body_bytes: usize,
    /// Time a request body has to arrive.
    pub body_timeout: std::time::Duration,
    /// Permits to parse and tokenize a request off the HTTP threads (a few at once).
    pub tokenizing: tokio::sync::Semaphore,
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

/// The longest prompt text, in bytes, that can fit `context` tokens: every token covers at
/// most as many bytes of text as its longest piece, so a text longer than that many bytes per
/// token of the context has more tokens than the context — refused before tokenizing it. Twice
/// that bound, for normalizers that shorten text before it is split.
pub(crate) fn max_prompt_bytes(tokenizer: &Tokenizer, context: usize) -> usize {
    let longest = (0..tokenizer.vocab_size() as u32)
        .filter_map(|t| tokenizer.token_bytes(t, true).map(<[u8]>::len))
        .max()
        .unwrap_or(1)
        .max(1);
    longest.saturating_mul(context).saturating_mul(2)
}

/// The largest request body: a prompt of `prompt_bytes` written with JSON escapes (at most 6
/// bytes per byte of text), plus room for the other fields.
pub(crate) fn max_body_bytes(prompt_bytes: usize) -> usize {
    prompt_bytes.saturating_mul(6).saturating_add(1 << 16)
}

/// The routes: `/v1/*` behind the optional bearer key; `/health` and `/metrics` open. Every
/// refusal (4xx, 503) is OpenAI's JSON and counted in `/metrics`.
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
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            count_refusals,
        ))
        .with_state(state)
}

/// Count the refusals of every route but `/health` (whose 503 during a drain is its answer).
async fn count_refusals(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let probe = req.uri().path() == "/health";
    let resp = next.run(req).await;
    let status = resp.status();
    if !probe {
        if status == StatusCode::SERVICE_UNAVAILABLE {
            st.metrics
                .rejected_overloaded
                .fetch_add(1, Ordering::Relaxed);
        } else if status.is_client_error() {
            st.metrics.rejected_invalid.fetch_add(1, Ordering::Relaxed);
        }
    }
    resp
}

/// The key of an `Authorization` header value: scheme `Bearer` in any case (RFC 9110 §11.1),
/// then the token.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

async fn authenticate(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        if given != Some(key.as_str()) {
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

async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        ApiErrorKind::MethodNotAllowed,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .into_response()
}

/// The body of `req`, at most `body_bytes` and within `body_timeout`.
async fn read_body(st: &AppState, req: Request) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ApiErrorKind::TooLarge,
            format!(
                "the request body is larger than {} bytes, more than any prompt that fits the \
                 context of {} tokens",
                st.body_bytes, st.context
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.body_bytes as u64) {
        return Err(too_large());
    }
    let read = axum::body::to_bytes(req.into_body(), st.body_bytes);
    match tokio::time::timeout(st.body_timeout, read).await {
        Err(_) => Err(ApiError::new(
            ApiErrorKind::Timeout,
            format!(
                "the request body did not arrive within {} s",
                st.body_timeout.as_secs()
            ),
        )),
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => {
            let inner = e.into_inner();
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                cause = c.source();
            }
            Err(ApiError::invalid(
                None,
                format!("the request body cannot be read: {inner}"),
            ))
        }
    }
}

/// A prompt text longer than the context can hold, refused before it is tokenized.
fn too_long(st: &AppState, param: &str, bytes: usize) -> ApiError {
    ApiError::invalid(
        Some(param),
        format!(
            "the prompt is {bytes} bytes: more tokens than the context of {} tokens holds",
            st.context
        ),
    )
    .with_code("context_length_exceeded")
}

/// Run `prepare` (parse, render, tokenize) on the blocking pool, a few at once, so that a
/// large request never holds an HTTP thread (`/health` stays prompt).
async fn off_io<F>(st: &Arc<AppState>, prepare: F) -> Result<(Vec<u32>, Settings), ApiError>
where
    F: FnOnce(&AppState) -> Result<(Vec<u32>, Settings), ApiError> + Send + 'static,
{
    let shut = || ApiError::new(ApiErrorKind::Overloaded, "the server is shutting down");
    let _permit = st.tokenizing.acquire().await.map_err(|_| shut())?;
    let state = Arc::clone(st);
    tokio::task::spawn_blocking(move || prepare(&state))
        .await
        .map_err(|_| shut())?
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

async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let body = match read_body(&st, req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prepared = off_io(&st, move |st| {
        let (req, common): (ChatRequest, _) = api::parse(&body)?;
        drop(body);
        check_model(st, &common.model)?;
        let mut settings = common.settings()?;
        settings.logprobs = common.logprobs(true)?;
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
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if bytes > st.prompt_bytes {
            return Err(too_long(st, "messages", bytes));
        }
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::invalid(None, "the model has no chat template: use /v1/completions")
        })?;
        let text = template
            .render(&messages, true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        if text.len() > st.prompt_bytes {
            return Err(too_long(st, "messages", text.len()));
        }
        let prompt = st
            .tokenizer
            .encode(&text, false, true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        Ok((prompt, settings))
    })
    .await;
    respond(&st, Kind::Chat, prepared).await
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let body = match read_body(&st, req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prepared = off_io(&st, move |st| {
        let (req, common): (CompletionRequest, _) = api::parse(&body)?;
        drop(body);
        check_model(st, &common.model)?;
        let mut settings = common.settings()?;
        settings.logprobs = common.logprobs(false)?;
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
        if prompt.len() > st.prompt_bytes {
            return Err(too_long(st, "prompt", prompt.len()));
        }
        let tokens = st
            .tokenizer
            .encode(&prompt, true, false)
            .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?;
        Ok((tokens, settings))
    })
    .await;
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
        // Counted by `count_refusals`.
        Err(e) => return e.into_response(),
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
        stream_response(
            rx,
            format,
            settings.include_usage,
            settings.logprobs.is_some(),
        )
    } else {
        full_response(rx, format, prompt_tokens, settings.logprobs.is_some()).await
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
    let sampler = SamplerOptions {
        temperature: settings.temperature,
        top_k: 0,
        top_p: settings.top_p,
        seed,
    };
    // The scheduler builds the same sampler: whatever it would refuse is the client's 400 here,
    // never a 500 there.
    if let Err(e) = Sampler::new(sampler.clone()) {
        let param = match &e {
            ork_exec::ExecError::InvalidSampling { param, .. } => Some(*param),
            _ => None,
        };
        return Err(ApiError::invalid(param, e.to_string()));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler,
        stop: settings.stop.clone(),
        ignore_eos: settings.ignore_eos,
        logprobs: settings.logprobs,
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

    fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// OpenAI's `logprobs` object for `tokens` (`null` when none were asked for); completions'
    /// `text_offset`s count characters from `offset`, the length of the text before them.
    fn logprobs(&self, tokens: Option<&[TokenLogprob]>, offset: usize) -> Value {
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
    fn complete(
        &self,
        text: &str,
        logprobs: Value,
        finish: Finish,
        prompt: usize,
        cached: usize,
        completion: usize,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish.as_str(),
            }),
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

async fn full_response(
    mut rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    prompt_tokens: usize,
    logprobs: bool,
) -> Response {
    let mut text = String::new();
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
                let done = format.complete(
                    &text,
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
}

impl Streaming {
    /// Put the log probabilities of the tokens not yet sent on `chunk`.
    fn attach_logprobs(&mut self, chunk: &mut Value) {
        if self.logprobs {
            let tokens = std::mem::take(&mut self.tokens);
            chunk["choices"][0]["logprobs"] = self.format.logprobs(Some(&tokens), self.sent_chars);
        }
    }
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn stream_response(
    rx: mpsc::UnboundedReceiver<Event>,
    format: Format,
    include_usage: bool,
    logprobs: bool,
) -> Response {
    let mut pending = VecDeque::new();
    if format.kind == Kind::Chat {
        pending.push_back(data(&format.chunk(Some(""), None, true)));
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
                    let mut c = s.format.chunk(Some(&t), None, false);
                    s.attach_logprobs(&mut c);
                    s.sent_chars += t.chars().count();
                    s.pending.push_back(data(&c));
                }
                Some(Event::Logprob(t)) => s.tokens.push(t),
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                }) => {
                    let mut c = s.format.chunk(None, Some(finish), false);
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
