//! ork — **server**: an OpenAI-compatible HTTP API over the engine, with continuous batching
//! (`ork serve`; design and figures in `docs/serve.md`).
//!
//! [`Server::start`] binds the address and runs two things: an HTTP front on a small tokio
//! runtime (axum), which checks and tokenizes each request and queues it, and one scheduler
//! thread that owns every running sequence, admits queued requests into free slots between
//! steps and runs one batched forward step for all of them (`ork_exec::Session::step`).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (JSON or server-sent events),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text). With an API key, the
//! `/v1` routes need `Authorization: Bearer KEY`. A full queue answers 503 at once; a client
//! that goes away frees its slot before the next step; [`Server::shutdown`] (SIGTERM in
//! [`run`]) drains: new requests are refused, running ones finish within the drain timeout.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod api;
mod error;
mod http;
mod metrics;
mod scheduler;

pub use api::{
    ChatRequest, Common, CompletionRequest, Content, ContentPart, Message, Prompt, Settings, Stop,
    StreamOptions,
};
pub use error::{ApiError, ApiErrorKind, ServerError};
pub use metrics::Metrics;
pub use scheduler::{Event, Finish, Job, SchedulerConfig};

use ork_runtime::Engine;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest context accepted for `--ctx`.
pub const MAX_CONTEXT: usize = 1 << 20;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to listen on (loopback by default).
    pub host: String,
    /// Port (0: any free port; [`Server::addr`] tells which).
    pub port: u16,
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Requests waiting for a slot at most; one more is refused with 503.
    pub queue: usize,
    /// Context per sequence (`None`: the model's trained context).
    pub context: Option<usize>,
    /// Bearer key the `/v1` routes require.
    pub api_key: Option<String>,
    /// Prompt tokens evaluated per step at most (the longest a new request delays the others).
    pub prefill_chunk: usize,
    /// How long a drain lets running requests finish before cutting them.
    pub drain_timeout: Duration,
    /// The model id clients name (`None`: the GGUF file name without `.gguf`).
    pub model_id: Option<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".to_owned(),
            port: 8080,
            max_seqs: 8,
            queue: 64,
            context: None,
            api_key: None,
            prefill_chunk: 64,
            drain_timeout: Duration::from_secs(30),
            model_id: None,
        }
    }
}

/// A running server: see the crate documentation.
pub struct Server {
    addr: SocketAddr,
    model_id: String,
    metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<JoinHandle<Result<(), ServerError>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("model_id", &self.model_id)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Bind `config`'s address and start serving `engine` on background threads.
    ///
    /// # Errors
    /// A setting out of range, a model without usable template metadata, or an address that
    /// cannot be bound.
    pub fn start(engine: Engine, config: ServeConfig) -> Result<Server, ServerError> {
        Self::start_with(engine, config, std::future::pending())
    }

    /// [`Server::start`], also draining when `signal` completes (SIGTERM in [`run`]).
    fn start_with(
        engine: Engine,
        config: ServeConfig,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Server, ServerError> {
        let trained = engine.model().config().context_length;
        let context = config.context.unwrap_or(trained);
        check(&config, context)?;
        let template = engine.chat_template()?;
        let model_id = config.model_id.clone().unwrap_or_else(|| {
            let name = engine
                .config()
                .model
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".to_owned());
            name.strip_suffix(".gguf").unwrap_or(&name).to_owned()
        });
        let addr_text = format!("{}:{}", config.host, config.port);
        let listener =
            std::net::TcpListener::bind(&addr_text).map_err(|source| ServerError::Bind {
                addr: addr_text.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: addr_text.clone(),
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| ServerError::Io { addr, source })?;

        let engine = Arc::new(engine);
        let metrics = Arc::new(Metrics::default());
        let abort = Arc::new(AtomicBool::new(false));
        let (queue_tx, queue_rx) = crossbeam_channel::bounded(config.queue);
        let scheduler = {
            let engine = Arc::clone(&engine);
            let metrics = Arc::clone(&metrics);
            let abort = Arc::clone(&abort);
            let sc = SchedulerConfig {
                max_seqs: config.max_seqs,
                context,
                prefill_chunk: config.prefill_chunk,
            };
            std::thread::Builder::new()
                .name("ork-scheduler".to_owned())
                .spawn(move || scheduler::run(engine, sc, queue_rx, metrics, abort))
                .map_err(|source| ServerError::Thread {
                    what: "scheduler",
                    source,
                })?
        };
        let state = Arc::new(http::AppState {
            tokenizer: Arc::clone(engine.tokenizer()),
            engine,
            template,
            model_id: model_id.clone(),
            context,
            queue: queue_tx,
            metrics: Arc::clone(&metrics),
            api_key: config.api_key.clone(),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ork-http")
            .enable_all()
            .build()
            .map_err(|source| ServerError::Io { addr, source })?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let drain = config.drain_timeout;
        let http = std::thread::Builder::new()
            .name("ork-http-main".to_owned())
            .spawn(move || {
                let result = runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .map_err(|source| ServerError::Io { addr, source })?;
                    let app = http::router(Arc::clone(&state));
                    let drain_state = Arc::clone(&state);
                    let drain_abort = Arc::clone(&abort);
                    let shutdown = async move {
                        tokio::select! {
                            _ = stop_rx => {}
                            _ = signal => {}
                        }
                        // No new requests from here on; running ones get `drain` to finish.
                        drain_state.draining.store(true, Ordering::Relaxed);
                        tokio::spawn(async move {
                            tokio::time::sleep(drain).await;
                            drain_abort.store(true, Ordering::Relaxed);
                        });
                    };
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                        .map_err(|source| ServerError::Io { addr, source });
                    // Every connection is closed: end the scheduler (it finishes nothing more).
                    abort.store(true, Ordering::Relaxed);
                    drop(state);
                    served
                });
                let joined = scheduler.join();
                runtime_shutdown(result, joined)
            })
            .map_err(|source| ServerError::Thread {
                what: "http",
                source,
            })?;
        Ok(Server {
            addr,
            model_id,
            metrics,
            stop: Some(stop_tx),
            http: Some(http),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model id clients name in requests.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Drain and stop: refuse new requests, let running ones finish (within the drain
    /// timeout), close, and wait for the threads.
    ///
    /// # Errors
    /// The HTTP server failed while running.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait()
    }

    /// Wait until the server stops (after a signal in [`run`], or [`Server::shutdown`]).
    ///
    /// # Errors
    /// The HTTP server failed while running.
    pub fn wait(&mut self) -> Result<(), ServerError> {
        match self.http.take() {
            Some(h) => h.join().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.wait();
    }
}

fn runtime_shutdown(
    result: Result<(), ServerError>,
    scheduler: std::thread::Result<()>,
) -> Result<(), ServerError> {
    if let Err(panic) = scheduler {
        // A panic in the scheduler is a bug: surface it rather than exit 0.
        std::panic::resume_unwind(panic);
    }
    result
}

fn check(config: &ServeConfig, context: usize) -> Result<(), ServerError> {
    let bad = |setting, what: String| Err(ServerError::Config { setting, what });
    if !(1..=256).contains(&config.max_seqs) {
        return bad(
            "--max-seqs",
            format!("{} is not in 1..=256", config.max_seqs),
        );
    }
    if !(1..=65_536).contains(&config.queue) {
        return bad("--queue", format!("{} is not in 1..=65536", config.queue));
    }
    if !(2..=MAX_CONTEXT).contains(&context) {
        return bad("--ctx", format!("{context} is not in 2..={MAX_CONTEXT}"));
    }
    if !(1..=65_536).contains(&config.prefill_chunk) {
        return bad(
            "--prefill-chunk",
            format!("{} is not in 1..=65536", config.prefill_chunk),
        );
    }
    if config.api_key.as_deref() == Some("") {
        return bad("--api-key", "the key is empty".to_owned());
    }
    Ok(())
}

/// Serve `engine` until SIGTERM or SIGINT, then drain and return: the `ork serve` command.
/// `on_listening` is called with the bound address once the server accepts connections.
///
/// # Errors
/// As [`Server::start`], or the HTTP server failing while running.
pub fn run(
    engine: Engine,
    config: ServeConfig,
    on_listening: impl FnOnce(SocketAddr, &str),
) -> Result<(), ServerError> {
    // The signal handlers are installed on the server's runtime; a small current-thread runtime
    // here only creates them before anything is accepted, so a signal is never missed.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    let mut terminate = watcher
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        })
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    let mut interrupt = watcher
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        })
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    let signal_thread = std::thread::Builder::new()
        .name("ork-signals".to_owned())
        .spawn(move || {
            watcher.block_on(async {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
            });
            let _ = tx.send(());
        })
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    let signal = async move {
        let _ = rx.await;
    };
    let mut server = Server::start_with(engine, config, signal)?;
    on_listening(server.addr(), server.model_id());
    let result = server.wait();
    drop(signal_thread);
    result
}
