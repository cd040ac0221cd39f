//! A Chrome trace-event / Perfetto timeline of loads, computes and waits.
//!
//! Events are complete events (`"ph": "X"`) on named lanes (`tid`): the prefetch thread, the
//! compute path, and waits. Open the file in `ui.perfetto.dev` or `chrome://tracing`.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// One span on the timeline.
#[derive(Clone, Debug, Serialize)]
pub struct TraceEvent {
    /// What happened (weight name).
    pub name: String,
    /// Category: "load", "pack", "compute", "wait", "evict".
    pub cat: &'static str,
    /// Phase: always "X" (complete event).
    pub ph: &'static str,
    /// Start, microseconds since the trace began.
    pub ts: f64,
    /// Duration in microseconds.
    pub dur: f64,
    /// Process id (always 1).
    pub pid: u32,
    /// Lane: 1 = compute, 2 = prefetch, 3 = waits.
    pub tid: u32,
}

/// Lanes of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// The thread running the model (and loading on demand).
    Compute = 1,
    /// The prefetch thread.
    Prefetch = 2,
    /// Time the compute path spent waiting for a weight.
    Wait = 3,
}

/// A thread-safe event recorder.
#[derive(Debug)]
pub struct Trace {
    t0: Instant,
    events: Mutex<Vec<TraceEvent>>,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    /// Start a timeline now.
    pub fn new() -> Self {
        Trace {
            t0: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Record a span that started at `start` and lasted `dur`.
    pub fn span(&self, lane: Lane, cat: &'static str, name: &str, start: Instant, dur: Duration) {
        let ev = TraceEvent {
            name: name.to_owned(),
            cat,
            ph: "X",
            ts: start.saturating_duration_since(self.t0).as_secs_f64() * 1e6,
            dur: dur.as_secs_f64() * 1e6,
            pid: 1,
            tid: lane as u32,
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ev);
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Write `{"traceEvents": [...]}` with lane names to `path`, under the rule for every file
    /// ork writes (`ork_io::output`: never over one of `inputs`, a model or a pack; atomic
    /// for a regular file; a terminal or a pipe with a reader as a stream).
    pub fn write(&self, path: &Path, inputs: &[&Path]) -> Result<(), ork_store::StoreError> {
        let doc = self.chrome_json().map_err(|e| ork_store::StoreError::Io {
            path: path.to_path_buf(),
            op: "serialize the trace",
            source: e,
        })?;
        ork_io::output::write_output(path, &doc, inputs).map_err(ork_store::StoreError::from)
    }

    /// The trace as Chrome trace-event JSON bytes.
    fn chrome_json(&self) -> std::io::Result<Vec<u8>> {
        let mut events: Vec<serde_json::Value> = [
            (Lane::Compute, "compute"),
            (Lane::Prefetch, "prefetch"),
            (Lane::Wait, "wait"),
        ]
        .iter()
        .map(|(lane, name)| {
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": *lane as u32,
                               "args": {"name": name}})
        })
        .collect();
        for e in self.events() {
            events.push(serde_json::to_value(e).map_err(std::io::Error::other)?);
        }
        let doc = serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" });
        serde_json::to_vec(&doc).map_err(std::io::Error::other)
    }
}
