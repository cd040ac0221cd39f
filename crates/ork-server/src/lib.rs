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
mod listen;
mod metrics;
mod prefix;
mod saver;
mod scheduler;
mod tools;

pub use api::{
    ChatRequest, Common, CompletionRequest, Content, ContentPart, FunctionCall, Message,
    MessageToolCall, Prompt, Settings, Stop, StreamOptions,
};
pub use error::{ApiError, ApiErrorKind, ServerError};
pub use metrics::Metrics;
pub use prefix::{Loaded, PrefixCache};
pub use scheduler::{Event, Finish, Job, Persist, SchedulerConfig};
pub use tools::{ToolCall, ToolChoice, ToolDelta, ToolFormat, ToolParser};

use ork_runtime::Engine;
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
    /// A connection that has not sent a complete request head this long after it became ready
    /// for one (after connecting, or after its previous response) is closed: the header and
    /// idle timeout.
    pub header_timeout: Duration,
    /// A request whose body has not arrived this long after its head is refused (408).
    pub body_timeout: Duration,
    /// Connections open at once at most; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Bytes of finished sequences' KV caches kept for prefix reuse (0: no reuse).
    pub prefix_cache_bytes: usize,
    /// A directory where the prefix cache is kept across restarts (read at start, written when
    /// the server stops; `None`: in memory only). Created if missing.
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// With `prefix_cache_dir`: how often a changed prefix cache is written while serving
    /// (`None`: only when the server stops).
    pub prefix_cache_save_every: Option<Duration>,
    /// A chat template (Jinja source) used instead of the GGUF's own, as llama-server's
    /// `--chat-template-file` (for a file whose template lacks tool calls, or has none).
    pub chat_template: Option<String>,
    /// Speculative verification (`--draft lookup --draft-max K`): greedy requests without log
    /// probabilities draft up to this many tokens per step by prompt lookup and verify them on
    /// the prefill engine (`None`: off; docs/serve.md, "Speculative verification").
    pub draft_max: Option<usize>,
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
            header_timeout: Duration::from_secs(15),
            body_timeout: Duration::from_secs(60),
            max_connections: 256,
            prefix_cache_bytes: 256 << 20,
            prefix_cache_dir: None,
            prefix_cache_save_every: Some(Duration::from_secs(60)),
            chat_template: None,
            draft_max: None,
        }
    }
}

/// A running server: see the crate documentation.
pub struct Server {
    addr: SocketAddr,
    model_id: String,
    metrics: Arc<Metrics>,
    /// The first message starts a drain, the second ends it at once.
    stop: Option<tokio::sync::mpsc::UnboundedSender<()>>,
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
        Server::start_with(engine, config, None)
    }

    /// [`Server::start`], but every chat reply is `reply` (its tokens stand in for the sampled
    /// ones, run through the model and the whole reply path): a test hook, so that the parsing
    /// of tool calls is tested through HTTP with a model too small to call tools.
    #[cfg(feature = "test-hooks")]
    pub fn start_scripted(
        engine: Engine,
        config: ServeConfig,
        reply: &str,
    ) -> Result<Server, ServerError> {
        Server::start_with(engine, config, Some(reply.to_owned()))
    }

    fn start_with(
        engine: Engine,
        config: ServeConfig,
        forced_reply: Option<String>,
    ) -> Result<Server, ServerError> {
        let trained = engine.model().config().context_length;
        let context = config.context.unwrap_or(trained);
        check(&config, context)?;
        let template = chat_template(&engine, &config)?;
        let model_id = model_id(&engine, &config);
        let (listener, addr) = bind(&config)?;
        let persist = match &config.prefix_cache_dir {
            Some(dir) if config.prefix_cache_bytes > 0 => Some(saver::persist(
                &engine,
                dir,
                context,
                config.prefix_cache_bytes,
                config.prefix_cache_save_every,
            )?),
            _ => None,
        };
        let engine = Arc::new(engine);
        let metrics = Arc::new(Metrics::default());
        let abort = Arc::new(AtomicBool::new(false));
        let (queue_tx, queue_rx) = crossbeam_channel::bounded(config.queue);
        let sc = SchedulerConfig {
            max_seqs: config.max_seqs,
            context,
            prefill_chunk: config.prefill_chunk,
            prefix_cache_bytes: config.prefix_cache_bytes,
            persist,
            draft_max: config.draft_max,
        };
        let scheduler = spawn_scheduler(&engine, sc, queue_rx, &metrics, &abort)?;
        let prompt_bytes = http::max_prompt_bytes(engine.tokenizer(), context);
        let state = Arc::new(http::AppState {
            tokenizer: Arc::clone(engine.tokenizer()),
            engine,
            prompt_bytes,
            body_bytes: http::max_body_bytes(prompt_bytes),
            body_timeout: config.body_timeout,
            tokenizing: Arc::new(tokio::sync::Semaphore::new(TOKENIZING_TASKS)),
            rendering: Arc::new(tokio::sync::Semaphore::new(TOKENIZING_TASKS)),
            template: template.map(|t| t.with_max_bytes(prompt_bytes)),
            model_id: model_id.clone(),
            context,
            queue: queue_tx,
            metrics: Arc::clone(&metrics),
            api_key: config.api_key.clone(),
            forced_reply,
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ork-http")
            .enable_all()
            .build()
            .map_err(|source| ServerError::Io { addr, source })?;
        let (stop_tx, stop_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let drain = config.drain_timeout;
        let limits = listen::ConnLimits {
            header_timeout: config.header_timeout,
            max_connections: config.max_connections,
        };
        let http = std::thread::Builder::new()
            .name("ork-http-main".to_owned())
            .spawn(move || {
                let result = runtime.block_on(serve(
                    listener,
                    addr,
                    state,
                    limits,
                    drain,
                    stop_rx,
                    Arc::clone(&abort),
                ));
                // Connections still open after a cut drain end with the runtime; a tokenizing
                // task cannot hold the process for more than this.
                runtime.shutdown_timeout(Duration::from_secs(1));
                // The end of the queue (its sender was in the handlers' state) ends the scheduler.
                abort.store(true, Ordering::Relaxed);
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

    /// Start a drain (as SIGTERM does in [`run`]); a second call ends it at once, cutting the
    /// running requests (as a second Ctrl-C does).
    pub fn signal(&self) {
        if let Some(stop) = &self.stop {
            let _ = stop.send(());
        }
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

/// The chat template: `--chat-template`'s, else the model's own (if any).
fn chat_template(
    engine: &Engine,
    config: &ServeConfig,
) -> Result<Option<ork_exec::ChatTemplate>, ServerError> {
    let Some(source) = &config.chat_template else {
        return Ok(engine.chat_template()?);
    };
    let template =
        ork_exec::ChatTemplate::with_tokenizer(source, engine.tokenizer()).map_err(|e| {
            ServerError::Config {
                setting: "chat template",
                // The setting names it already: "chat template: {what}", once.
                what: match e {
                    ork_exec::ExecError::ChatTemplate { what } => what,
                    other => other.to_string(),
                },
            }
        })?;
    Ok(Some(template))
}

/// The model id the API reports: `--model-id`, else the model file's name without `.gguf`.
fn model_id(engine: &Engine, config: &ServeConfig) -> String {
    config.model_id.clone().unwrap_or_else(|| {
        let name = engine
            .config()
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_owned());
        name.strip_suffix(".gguf").unwrap_or(&name).to_owned()
    })
}

/// Bind the listening socket (non-blocking, for the runtime) and say where it is.
fn bind(config: &ServeConfig) -> Result<(std::net::TcpListener, SocketAddr), ServerError> {
    let addr_text = format!("{}:{}", config.host, config.port);
    let listener = std::net::TcpListener::bind(&addr_text).map_err(|source| ServerError::Bind {
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
    Ok((listener, addr))
}

/// Read the saved prefixes and start the scheduler thread. Both happen before anything
/// listens: the first request finds what the file holds, and the first /metrics shows it.
fn spawn_scheduler(
    engine: &Arc<Engine>,
    sc: SchedulerConfig,
    queue_rx: crossbeam_channel::Receiver<Job>,
    metrics: &Arc<Metrics>,
    abort: &Arc<AtomicBool>,
) -> Result<JoinHandle<()>, ServerError> {
    let prefixes = saver::load_prefixes(engine, &sc);
    metrics
        .prefix_cache_bytes
        .store(prefixes.bytes() as u64, Ordering::Relaxed);
    let (engine, metrics, abort) = (Arc::clone(engine), Arc::clone(metrics), Arc::clone(abort));
    std::thread::Builder::new()
        .name("ork-scheduler".to_owned())
        .spawn(move || scheduler::run(engine, sc, queue_rx, metrics, abort, prefixes))
        .map_err(|source| ServerError::Thread {
            what: "scheduler",
            source,
        })
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
    if let Some(k) = config.draft_max {
        if !(1..=256).contains(&k) {
            return bad("--draft-max", format!("{k} is not in 1..=256"));
        }
    }
    if let Some(key) = &config.api_key {
        if key.is_empty() {
            return bad("--api-key", "the key is empty".to_owned());
        }
        // It is compared with a header value: printable ASCII, no spaces or control characters.
        if let Some(c) = key.chars().find(|c| !c.is_ascii_graphic()) {
            return bad(
                "--api-key",
                format!(
                    "the key holds {c:?}: use printable ASCII without spaces or control \
                     characters (a key is sent as an HTTP header)"
                ),
            );
        }
    }
    if !(1..=65_536).contains(&config.max_connections) {
        return bad(
            "--max-connections",
            format!("{} is not in 1..=65536", config.max_connections),
        );
    }
    if config.header_timeout.is_zero() {
        return bad("--header-timeout-secs", "must be at least 1 s".to_owned());
    }
    if config.body_timeout.is_zero() {
        return bad("--body-timeout-secs", "must be at least 1 s".to_owned());
    }
    Ok(())
}

/// Tokenizing tasks run at once at most (off the HTTP threads; docs/serve.md); as many chat
/// renders again, in a lane of their own.
const TOKENIZING_TASKS: usize = 2;

/// How long the connections get to send the error event of a cut request before they close.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// Serve until the first stop message, then drain: answer new requests 503 (the listener stays
/// open, see [`listen::answer_while_draining`]) and let running ones finish within `drain` (or until a second stop message), then cut what still runs.
async fn serve(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    state: Arc<http::AppState>,
    limits: listen::ConnLimits,
    drain: Duration,
    mut stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    abort: Arc<AtomicBool>,
) -> Result<(), ServerError> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|source| ServerError::Io { addr, source })?;
    let app = http::router(Arc::clone(&state));
    let metrics = Arc::clone(&state.metrics);
    let (graceful, listener, open) = listen::accept_until(
        listener,
        app.clone(),
        limits,
        Arc::clone(&metrics),
        next_stop(&mut stop),
    )
    .await;
    // New requests are answered 503 from here on; running ones get `drain` to finish.
    state.draining.store(true, Ordering::Relaxed);
    drop(state);
    let mut closed = std::pin::pin!(graceful.shutdown());
    tokio::select! {
        _ = &mut closed => return Ok(()),
        _ = tokio::time::sleep(drain) => {}
        _ = next_stop(&mut stop) => {}
        _ = listen::answer_while_draining(listener, app, limits, metrics, open) => {}
    }
    // Cut: the scheduler ends every running and queued request with an error event; the
    // connections get a moment to send it, then close with the runtime.
    abort.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(CUT_GRACE, closed).await;
    Ok(())
}

/// The next stop message (never, once no sender is left).
async fn next_stop(stop: &mut tokio::sync::mpsc::UnboundedReceiver<()>) {
    if stop.recv().await.is_none() {
        std::future::pending::<()>().await;
    }
}

/// Serve `engine` until SIGTERM or SIGINT, then drain and return: the `ork serve` command.
/// A second SIGTERM or SIGINT during the drain ends it at once.
/// `on_listening` is called with the bound address once the server accepts connections.
///
/// # Errors
/// As [`Server::start`], or the HTTP server failing while running.
pub fn run(
    engine: Engine,
    config: ServeConfig,
    on_listening: impl FnOnce(SocketAddr, &str),
) -> Result<(), ServerError> {
    // The handlers are installed on a small current-thread runtime before anything is
    // accepted, so a signal is never missed (tokio keeps it until it is read).
    let watcher = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    let install = |kind| {
        watcher
            .block_on(async { tokio::signal::unix::signal(kind) })
            .map_err(|source| ServerError::Thread {
                what: "signal",
                source,
            })
    };
    let mut terminate = install(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = install(tokio::signal::unix::SignalKind::interrupt())?;
    // The signals are ours now: the pack writer's listener (armed if this process wrote its
    // .orkpack at start-up) must not kill the process in the middle of a drain.
    ork_io::temp::leave_signals_to_application();
    let mut server = Server::start(engine, config)?;
    let stop = server.stop.clone();
    std::thread::Builder::new()
        .name("ork-signals".to_owned())
        .spawn(move || {
            watcher.block_on(async {
                loop {
                    let got = tokio::select! {
                        t = terminate.recv() => t,
                        i = interrupt.recv() => i,
                    };
                    let sent = stop.as_ref().is_some_and(|s| s.send(()).is_ok());
                    if got.is_none() || !sent {
                        break;
                    }
                }
            });
        })
        .map_err(|source| ServerError::Thread {
            what: "signal",
            source,
        })?;
    on_listening(server.addr(), server.model_id());
    server.wait()
}
