//! Queueing a prepared request: the checks against the context and the sampler, the job sent
//! to the scheduler, and the answer chosen (one JSON object, or an SSE stream).
use super::objects::Format;
use super::reply::{full_response, stream_response};
use super::{AppState, Kind};
use crate::api::Settings;
use crate::error::{ApiError, ApiErrorKind};
use crate::scheduler::{Event, Job};
use crate::tools::ToolParser;
use axum::response::{IntoResponse, Response};
use ork_exec::{Sampler, SamplerOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Check the length, queue the job and answer (JSON or SSE).
pub(super) async fn respond(
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
    // The reply is read in the model's tool-call format, from the prefill the prompt ends with.
    let tools = settings.tool_format.map(|f| {
        let mut parser = ToolParser::new(f, &format!("call_{id}_"));
        let early = parser.push(&settings.tool_prefill);
        debug_assert!(early.is_empty(), "a prefill opens a call: {early:?}");
        parser
    });
    let echo = settings.echo.unwrap_or_default();
    if settings.stream {
        stream_response(
            rx,
            format,
            settings.include_usage,
            settings.logprobs.is_some(),
            tools,
            echo,
        )
    } else {
        full_response(
            rx,
            format,
            prompt_tokens,
            settings.logprobs.is_some(),
            tools,
            echo,
        )
        .await
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
    let (n, max_tokens) = generation_room(st, kind, &prompt, &settings)?;
    let sampler = sampler_options(st, &settings)?;
    // A format's markers that are control tokens here (not rendered otherwise).
    let shown = settings
        .tool_format
        .map(|f| {
            f.markers()
                .iter()
                .filter_map(|m| match st.tokenizer.encode(m, false, true).as_deref() {
                    Ok(&[t]) if st.tokenizer.token_bytes(t, false) == Some(&[]) => Some(t),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let forced = match (&st.forced_reply, kind) {
        (Some(text), Kind::Chat) => {
            let mut t = st.tokenizer.encode(text, false, true).unwrap_or_default();
            t.extend(st.tokenizer.end_of_generation().first());
            t
        }
        _ => Vec::new(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        shown,
        forced,
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

/// The prompt's length and the tokens it may generate: the prompt must leave room in the
/// context for at least one token, and `max_tokens` (default: the rest) must fit.
fn generation_room(
    st: &AppState,
    kind: Kind,
    prompt: &[u32],
    settings: &Settings,
) -> Result<(usize, usize), ApiError> {
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
    Ok((n, max_tokens))
}

/// The request's sampler options (a seed from the clock and the request count when it gives
/// none), refused here when the scheduler would refuse them: the client's 400, never a 500.
fn sampler_options(st: &AppState, settings: &Settings) -> Result<SamplerOptions, ApiError> {
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
    if let Err(e) = Sampler::new(sampler.clone()) {
        let param = match &e {
            ork_exec::ExecError::InvalidSampling { param, .. } => Some(*param),
            _ => None,
        };
        return Err(ApiError::invalid(param, e.to_string()));
    }
    Ok(sampler)
}
