//! The two generating routes, `/v1/chat/completions` and `/v1/completions`: each request is
//! parsed and checked, its prompt rendered (chat) and tokenized off the HTTP threads, then
//! handed to [`respond`].
use super::intake::{off_io, read_body, Lane};
use super::submit::respond;
use super::{AppState, Kind};
use crate::api::{self, ChatRequest, CompletionRequest, Prompt};
use crate::error::{ApiError, ApiErrorKind};
use crate::tools;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub(super) async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let body = match read_body(&st, req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prepared = off_io(&st, Lane::Chat, move |st| {
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
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::invalid(None, "the model has no chat template: use /v1/completions")
        })?;
        let tools = tools::plan(template, &req)?;
        let mut messages = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].role")),
                        format!("role {other:?}: expected system, user, assistant or tool"),
                    ))
                }
            };
            messages.push(tools::chat_message(template, i, m, role, &m.text(i)?)?);
        }
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if bytes > st.prompt_bytes {
            return Err(too_long(st, "messages", bytes));
        }
        let mut text = template
            .render_with_tools(&messages, tools.tools.as_ref(), true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        text.push_str(&tools.prefill);
        if text.len() > st.prompt_bytes {
            return Err(too_long(st, "messages", text.len()));
        }
        let prompt = st
            .tokenizer
            .encode(&text, false, true)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        settings.tool_format = tools.format;
        settings.tool_prefill = tools.prefill;
        Ok((prompt, settings))
    })
    .await;
    respond(&st, Kind::Chat, prepared).await
}

pub(super) async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let body = match read_body(&st, req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prepared = off_io(&st, Lane::Completion, move |st| {
        let (req, common): (CompletionRequest, _) = api::parse(&body)?;
        drop(body);
        req.check()?;
        check_model(st, &common.model)?;
        let mut settings = common.settings()?;
        settings.logprobs = common.logprobs(false)?;
        let echo = req.echo.unwrap_or(false);
        if echo && settings.logprobs.is_some() {
            return Err(ApiError::invalid(
                Some("echo"),
                "echo with logprobs: ork does not compute the prompt's log probabilities \
                 (its prefill keeps only the last position's logits); leave one out",
            ));
        }
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
                if echo {
                    let text = st
                        .tokenizer
                        .decode(t, true)
                        .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?;
                    settings.echo = Some(text);
                }
                return Ok((t.clone(), settings));
            }
        };
        if echo {
            settings.echo = Some(prompt.clone());
        }
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
