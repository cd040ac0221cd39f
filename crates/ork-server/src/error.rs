//! The server's errors: [`ServerError`] for starting and running it, [`ApiError`] for one
//! request (an HTTP status with an OpenAI-style error body).
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

/// What can stop the server from starting or running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The listening socket cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The address does not parse as `HOST:PORT`.
    #[error("invalid listen address {addr:?}: {what}")]
    Address {
        /// The address given.
        addr: String,
        /// What is wrong.
        what: String,
    },
    /// A setting is out of range (no sequence slots, an empty queue, a context of 0 …).
    #[error("{setting}: {what}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// The model cannot be served (its chat template does not parse …); boxed, being large.
    #[error(transparent)]
    Runtime(Box<ork_runtime::RuntimeError>),
    /// The async runtime or the HTTP server failed.
    #[error("serving on {addr}: {source}")]
    Io {
        /// The address being served.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A server thread could not be started.
    #[error("starting the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl From<ork_runtime::RuntimeError> for ServerError {
    fn from(e: ork_runtime::RuntimeError) -> Self {
        ServerError::Runtime(Box::new(e))
    }
}

/// The kind of a refused request, as OpenAI's error `type` field names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiErrorKind {
    /// The request is malformed or asks for something impossible (400).
    InvalidRequest,
    /// No or a wrong bearer key (401).
    Authentication,
    /// The model or route named does not exist (404).
    NotFound,
    /// The route exists, not with this method (405).
    MethodNotAllowed,
    /// The client did not send its request body in time (408).
    Timeout,
    /// The body is larger than the server takes (413).
    TooLarge,
    /// The queue is full or the server is draining (503).
    Overloaded,
    /// The engine failed while running the request (500).
    Internal,
}

/// A request refused or failed: an HTTP status and an OpenAI-style body
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// What kind of failure.
    pub kind: ApiErrorKind,
    /// A sentence for the client.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A short machine-readable code (`context_length_exceeded`, `model_not_found` …).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            kind: ApiErrorKind::InvalidRequest,
            message: message.into(),
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// An error of `kind` with no parameter.
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self.kind {
            ApiErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ApiErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ApiErrorKind::NotFound => StatusCode::NOT_FOUND,
            ApiErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ApiErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ApiErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` string.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            ApiErrorKind::InvalidRequest
            | ApiErrorKind::NotFound
            | ApiErrorKind::MethodNotAllowed
            | ApiErrorKind::Timeout
            | ApiErrorKind::TooLarge => "invalid_request_error",
            ApiErrorKind::Authentication => "authentication_error",
            ApiErrorKind::Overloaded => "server_overloaded",
            ApiErrorKind::Internal => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.type_name(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if self.kind == ApiErrorKind::Overloaded {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}
