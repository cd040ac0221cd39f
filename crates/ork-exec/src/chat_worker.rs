//! Chat templates rendered in a child process whose memory and time are bounded by the kernel
//! (docs/serve.md, "Templates").
//!
//! Fuel bounds the instructions a render executes and [`crate::ChatTemplate::with_max_bytes`]
//! its output, but neither bounds the values it builds: `{% set ns.s = ns.s ~ ns.s %}` doubles
//! a string in a handful of instructions, so forty of them ask for a terabyte, and minijinja
//! has no hook on `~`, `+` or a filter's result. A failed allocation aborts a Rust process, so
//! the bound cannot live in the allocator of the process that serves. It lives in a child:
//!
//! - A program that calls [`isolate_renders`] at start (the `ork` binary does) renders every
//!   template by running itself again with [`WORKER_ENV`] set; its `main` first calls
//!   [`worker_main`], which renders the request read from stdin and writes the reply to stdout.
//! - The child lowers its own `RLIMIT_AS` to its address space at start plus
//!   [`memory_bytes`] of the output bound, and `RLIMIT_CPU` to [`CPU_SECONDS`]: an allocation
//!   past the bound fails and the child dies (SIGABRT), a loop past the time is killed
//!   (SIGXCPU). The parent kills it at [`WALL_SECONDS`] in any case and reports any of these
//!   as [`ExecError::ChatTemplateLimit`]: a 400 from the server, exit 2 from `ork run`.
//! - The child is started with `posix_spawn` (std's `Command`), which does not copy the
//!   parent's page tables, so a render costs a process start (a few milliseconds), never a
//!   copy of a served model's memory.
//!
//! Without [`isolate_renders`] (a library user, unit tests) renders run in the calling process
//! with the fuel and output bounds only.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::ExecError;

/// Set in a child started to render one template ([`worker_main`]).
pub const WORKER_ENV: &str = "ORK_CHAT_TEMPLATE_WORKER";
/// CPU seconds a render may use (`RLIMIT_CPU` of the child).
pub const CPU_SECONDS: u64 = 5;
/// Wall-clock seconds the parent waits for a render before it kills the child (below the
/// server's 10 s answer deadline, so a render's thread and lane permit are free by then).
pub const WALL_SECONDS: u64 = 8;
/// Memory a render may allocate beyond what the child has at start: 256 MiB plus four times
/// the output bound (the output, the string it is built from, and room for the template's
/// own values).
pub fn memory_bytes(max_output: usize) -> u64 {
    (256u64 << 20).saturating_add(4u64.saturating_mul(max_output as u64))
}

static WORKER: OnceLock<PathBuf> = OnceLock::new();

/// Render every chat template of this process in a child running `exe` (this program, whose
/// `main` calls [`worker_main`] first). Call once at start; later calls change nothing.
pub fn isolate_renders(exe: PathBuf) {
    let _ = WORKER.set(exe);
}

/// One render, as the parent sends it.
#[derive(Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) source: String,
    pub(crate) bos_token: String,
    pub(crate) eos_token: String,
    pub(crate) max_bytes: usize,
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Option<serde_json::Value>,
    pub(crate) add_generation_prompt: bool,
}

/// The child's answer.
#[derive(Serialize, Deserialize)]
enum Reply {
    Rendered(String),
    Template(String),
    Limit(String),
}

/// If this process was started to render a template ([`WORKER_ENV`] set), render the request
/// on stdin, write the reply to stdout and return the exit code for `main` to exit with.
pub fn worker_main() -> Option<u8> {
    std::env::var_os(WORKER_ENV)?;
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        return Some(3);
    }
    let Ok(req) = serde_json::from_str::<Request>(&input) else {
        return Some(3);
    };
    drop(input);
    bound_self(memory_bytes(req.max_bytes));
    let rendered = ChatTemplate::new(&req.source, &req.bos_token, &req.eos_token).and_then(|t| {
        t.with_max_bytes(req.max_bytes).render_here(
            &req.messages,
            req.tools.as_ref(),
            req.add_generation_prompt,
        )
    });
    let reply = match rendered {
        Ok(text) => Reply::Rendered(text),
        Err(ExecError::ChatTemplateLimit { what }) => Reply::Limit(what),
        Err(ExecError::ChatTemplate { what }) => Reply::Template(what),
        Err(e) => Reply::Template(e.to_string()),
    };
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &reply).is_ok() && out.flush().is_ok();
    Some(if written { 0 } else { 3 })
}

/// Lower this process's address space to its size now plus `extra` bytes, and its CPU time to
/// [`CPU_SECONDS`] (failures leave the parent's wall-clock bound).
fn bound_self(extra: u64) {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let now = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(|pages| pages.saturating_mul(rustix::param::page_size() as u64));
    if let Some(now) = now {
        let limit = Some(now.saturating_add(extra));
        let _ = setrlimit(
            Resource::As,
            Rlimit {
                current: limit,
                maximum: limit,
            },
        );
    }
    let cpu = Some(CPU_SECONDS);
    let _ = setrlimit(
        Resource::Cpu,
        Rlimit {
            current: cpu,
            maximum: cpu,
        },
    );
}

/// The program renders run in, if [`isolate_renders`] was called.
pub(crate) fn worker() -> Option<&'static PathBuf> {
    WORKER.get()
}

/// Render `req` in a child running `exe` (see the module docs).
pub(crate) fn render_in_child(exe: &PathBuf, req: &Request) -> Result<String, ExecError> {
    let failed = |what: String| ExecError::ChatTemplate {
        what: format!("rendering in a child process ({}): {what}", exe.display()),
    };
    let body = serde_json::to_vec(req).map_err(|e| failed(e.to_string()))?;
    let mut child = Command::new(exe)
        .env(WORKER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| failed("no stdin".into()))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| failed("no stdout".into()))?;
    // Write and read on their own threads so that neither side waits on a full pipe; the reply
    // is at most the output bound, escaped (6 bytes a byte at worst), plus its frame.
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let cap = (req.max_bytes as u64)
        .saturating_mul(6)
        .saturating_add(1 << 16);
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        (&mut stdout).take(cap).read_to_end(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + Duration::from_secs(WALL_SECONDS);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let _ = writer.join();
    let text = reader.join().ok().and_then(Result::ok).unwrap_or_default();
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) if s.success() => {}
        // Ended by a signal (SIGABRT: an allocation past the memory bound; SIGXCPU: past the
        // CPU time) or killed at the wall-clock bound: the template's doing.
        Some(s) if s.signal().is_some() => return Err(limit(req, &s.to_string())),
        None => return Err(limit(req, "killed at the time bound")),
        Some(s) => return Err(failed(format!("it exited with {s}"))),
    }
    match serde_json::from_slice::<Reply>(&text) {
        Ok(Reply::Rendered(text)) => Ok(text),
        Ok(Reply::Limit(what)) => Err(ExecError::ChatTemplateLimit { what }),
        Ok(Reply::Template(what)) => Err(ExecError::ChatTemplate { what }),
        Err(e) => Err(failed(format!("unreadable reply: {e}"))),
    }
}

fn limit(req: &Request, how: &str) -> ExecError {
    ExecError::ChatTemplateLimit {
        what: format!(
            "it needed more than {} MiB of memory, {CPU_SECONDS} s of CPU or {WALL_SECONDS} s \
             (the render's child process: {how})",
            memory_bytes(req.max_bytes) >> 20
        ),
    }
}
