//! Taking a request in: the bearer key, the body within its size and time limits, and the
//! blocking pool a prompt is parsed, rendered and tokenized on.
use super::AppState;
use crate::api::Settings;
use crate::error::{ApiError, ApiErrorKind};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;

/// The key of an `Authorization` header value: scheme `Bearer` in any case (RFC 9110 §11.1),
/// then the token.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

pub(super) async fn authenticate(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
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

/// Bodies declared larger than the limit but at most this are read and dropped before the 413
/// is sent, so that the client reads the answer (larger ones: the connection is closed at once).
const DRAIN_LIMIT: u64 = 16 << 20;

/// The body of `req`, at most `body_bytes` and within `body_timeout`.
pub(super) async fn read_body(st: &AppState, req: Request) -> Result<Bytes, ApiError> {
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
    if let Some(n) = declared.filter(|&n| n > st.body_bytes as u64) {
        // A client still sending the body would see its connection reset instead of the 413
        // if the server answered and closed at once: a body up to DRAIN_LIMIT is read and
        // dropped frame by frame (nothing kept) within the body timeout first.
        if n <= DRAIN_LIMIT {
            let mut body = req.into_body();
            let drain = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(st.body_timeout, drain).await;
        }
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

/// The lane a request is prepared in (see [`off_io`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Lane {
    /// Parse and tokenize a prompt: `AppState::tokenizing`, no deadline (the work is bounded by
    /// the body's size).
    Completion,
    /// Parse, render a chat template and tokenize: `AppState::rendering`, within
    /// [`RENDER_DEADLINE`].
    Chat,
}

/// How long a request waits for a chat render (its turn in the lane, and the render): a
/// template is stopped by its fuel and output bound well before this (seconds at worst); past
/// it the request is answered and the render finishes alone, holding its permit.
pub(super) const RENDER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Run `prepare` (parse, render, tokenize) on the blocking pool, a few at once per lane, so
/// that a large request never holds an HTTP thread (`/health` stays prompt) and a slow chat
/// template never holds the completions' lane.
pub(super) async fn off_io<F>(
    st: &Arc<AppState>,
    lane: Lane,
    prepare: F,
) -> Result<(Vec<u32>, Settings), ApiError>
where
    F: FnOnce(&AppState) -> Result<(Vec<u32>, Settings), ApiError> + Send + 'static,
{
    let shut = || ApiError::new(ApiErrorKind::Overloaded, "the server is shutting down");
    let state = Arc::clone(st);
    let permits = match lane {
        Lane::Completion => Arc::clone(&st.tokenizing),
        Lane::Chat => Arc::clone(&st.rendering),
    };
    let work = async move {
        let permit = permits.acquire_owned().await.map_err(|_| shut())?;
        // The permit goes with the work: a render past the deadline still holds it.
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            prepare(&state)
        });
        task.await.map_err(|_| shut())?
    };
    match lane {
        Lane::Completion => work.await,
        Lane::Chat => match tokio::time::timeout(RENDER_DEADLINE, work).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::invalid(
                Some("messages"),
                format!(
                    "the chat template did not render within {} s (the server's bound; the \
                     template or the renders before this one take too long)",
                    RENDER_DEADLINE.as_secs()
                ),
            )),
        },
    }
}
