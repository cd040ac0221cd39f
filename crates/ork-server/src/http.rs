//! The HTTP front: axum routes, authentication, request checks, JSON and SSE responses.
//!
//! Here: what every handler shares ([`AppState`]), the size limits drawn from the context, the
//! router and the routes that need no model. The rest, in the order a request meets it:
//! - [`intake`]: the bearer key, the request body within its size and time limits, and the
//!   blocking pool a prompt is prepared on;
//! - [`prompt`]: `/v1/chat/completions` and `/v1/completions`, each request checked and turned
//!   into prompt tokens and settings;
//! - [`submit`]: the checks against the context and the sampler, the job queued for the
//!   scheduler, and the answer (JSON or SSE) chosen;
//! - [`objects`]: OpenAI's response objects (completion, chunk, usage, log probabilities,
//!   tool calls);
//! - [`reply`]: the scheduler's events turned into one JSON answer or an SSE stream.
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::Metrics;
use crate::scheduler::Job;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ork_exec::{ChatTemplate, Tokenizer};
use ork_runtime::Engine;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

mod intake;
mod objects;
mod prompt;
mod reply;
mod submit;

use intake::authenticate;
use prompt::{chat, completions};

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
    pub tokenizing: Arc<tokio::sync::Semaphore>,
    /// Permits to render a chat template (and tokenize its text): a lane of its own, so that
    /// templates that take long never hold the completions' permits (docs/serve.md).
    pub rendering: Arc<tokio::sync::Semaphore>,
    /// The chat template, its output bounded by `prompt_bytes`.
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    pub context: usize,
    pub queue: crossbeam_channel::Sender<Job>,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Every chat reply is these tokens (the test hook of `Server::start_scripted`).
    pub forced_reply: Option<String>,
    /// Set by SIGTERM (or [`crate::Server::shutdown`]): new requests are refused.
    pub draining: AtomicBool,
    pub next_id: AtomicU64,
}

/// The longest prompt text, in bytes, that can fit `context` tokens
/// ([`ork_exec::max_text_bytes`]).
pub(crate) fn max_prompt_bytes(tokenizer: &Tokenizer, context: usize) -> usize {
    ork_exec::max_text_bytes(tokenizer, context)
}

/// The largest request body: a prompt of `prompt_bytes` written with JSON escapes (at most 6
/// bytes per byte of text), plus room for the other fields.
pub(crate) fn max_body_bytes(prompt_bytes: usize) -> usize {
    prompt_bytes.saturating_mul(6).saturating_add(1 << 16)
}

/// The routes: `/v1/*` behind the optional bearer key; `/health`, `/health/ready`,
/// `/health/live` and `/metrics` open. Every
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
        .route("/health/ready", get(health))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            count_refusals,
        ))
        .with_state(state)
}

/// Count the refusals of every route but the probes `/health*` (whose 503 during a drain is
/// their answer).
async fn count_refusals(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let probe = matches!(
        req.uri().path(),
        "/health" | "/health/ready" | "/health/live"
    );
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

/// `/health` and `/health/ready`: 200 while serving, 503 from the start of a drain (the
/// process goes on answering during the drain so that a balancer or Kubernetes sees it).
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

/// `/health/live`: 200 while the process answers, draining or not (a Kubernetes liveness
/// probe must not restart a replica that is finishing its requests).
async fn live(State(st): State<Arc<AppState>>) -> Response {
    let draining = st.draining.load(Ordering::Relaxed);
    Json(json!({"status": "live", "draining": draining})).into_response()
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
