//! Accepting connections: HTTP/1.1 on hyper with the limits a server on a network needs.
//!
//! `axum::serve` has no header-read timeout and no connection limit, so a client that sends
//! half a request line and stalls holds its connection (and a drain) forever. Here every
//! connection is served by hyper's HTTP/1 connection with
//! - a header timeout (`--header-timeout-secs`): a connection that has not sent a complete
//!   request head this long after it became ready for one — after connecting, or after its
//!   previous response — is closed; the same clock is the idle timeout of a kept-alive
//!   connection;
//! - half-close support: a client that shuts down its write side after pipelining requests
//!   still receives every response;
//! - a connection limit (`--max-connections`): one more is answered 503 (OpenAI's JSON body,
//!   counted in `/metrics`) and closed at once.
//!
//! Connections are watched by a [`GracefulShutdown`]: at a drain each one closes once its
//! running request has its answer. During the drain the listener stays open and answers each
//! new connection once, without keep-alive ([`answer_while_draining`]): `/health` 503 for a
//! balancer's probe, a 503 JSON error for a new request.
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::Metrics;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Limits of the connections (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnLimits {
    /// Time to send a complete request head once the connection is ready for one.
    pub header_timeout: Duration,
    /// Connections open at once at most.
    pub max_connections: usize,
}

/// Accept connections on `listener` until `stop` completes, serving each with `app`; then
/// return the watcher of the connections still open (its `shutdown` waits for them to finish
/// their requests) and the listener, still open for [`answer_while_draining`].
pub(crate) async fn accept_until(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> (GracefulShutdown, TcpListener, Arc<Semaphore>) {
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let builder = connection_builder(limits, true);
    let mut stop = std::pin::pin!(stop);
    loop {
        let next = tokio::select! {
            _ = &mut stop => break,
            next = next_connection(&listener, &open, limits, &metrics) => next,
        };
        let Some((stream, permit)) = next else {
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection error (timeout, reset, malformed request head) only ends that
            // connection.
            let _ = conn.await;
            drop(permit);
        });
    }
    (graceful, listener, open)
}

/// During a drain: keep accepting, one request per connection (no keep-alive), so that a
/// balancer's probe reads `/health` 503 and a new request gets its 503 JSON error (which a
/// balancer can retry on another replica) rather than a refused connection. Runs until dropped
/// (the listener closes with it); these connections are not waited for by the drain.
pub(crate) async fn answer_while_draining(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    open: Arc<Semaphore>,
) {
    let builder = connection_builder(limits, false);
    loop {
        let Some((stream, permit)) = next_connection(&listener, &open, limits, &metrics).await
        else {
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
}

/// HTTP/1 with the header timeout and half-close support; `keep_alive` off during a drain.
fn connection_builder(limits: ConnLimits, keep_alive: bool) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .half_close(true)
        .keep_alive(keep_alive);
    builder
}

/// The next connection within the limit, with its permit; `None` after an accept error (after
/// a short wait) or a connection beyond the limit (answered 503 and closed).
async fn next_connection(
    listener: &TcpListener,
    open: &Arc<Semaphore>,
    limits: ConnLimits,
    metrics: &Metrics,
) -> Option<(TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let stream = match listener.accept().await {
        Ok((stream, _)) => stream,
        // Out of file descriptors and the like: wait a little rather than spin.
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return None;
        }
    };
    let Ok(permit) = Arc::clone(open).try_acquire_owned() else {
        metrics.rejected_overloaded.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(refuse(stream, limits.max_connections));
        return None;
    };
    let _ = stream.set_nodelay(true);
    Some((stream, permit))
}

/// Answer a connection beyond the limit with a 503 and close it.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = ApiError::new(
        ApiErrorKind::Overloaded,
        format!("the server has {limit} connections open, its limit: try again shortly"),
    )
    .with_code("too_many_connections")
    .body()
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
