//! Counters of the server, rendered as Prometheus text at `GET /metrics`.
use ork_runtime::Engine;
use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window over which `ork_decode_tokens_per_second` is measured.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Server counters; every field is updated with relaxed atomics (they are statistics).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests accepted into the queue.
    pub accepted: AtomicU64,
    /// Requests refused with a 4xx (malformed, unknown model, too long, unauthorized).
    pub rejected_invalid: AtomicU64,
    /// Requests refused because the queue was full or the server was draining.
    pub rejected_overloaded: AtomicU64,
    /// Requests that ran to their end and whose client received it.
    pub completed: AtomicU64,
    /// Requests whose client went away before the end.
    pub cancelled: AtomicU64,
    /// Requests that failed in the engine or were cut by shutdown.
    pub failed: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub completion_tokens: AtomicU64,
    /// Prompt tokens served from a cached prefix (not evaluated again).
    pub cached_tokens: AtomicU64,
    /// Bytes of keys and values held for prefix reuse.
    pub prefix_cache_bytes: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Sequences running.
    pub active: AtomicU64,
    /// Batched steps run.
    pub steps: AtomicU64,
    /// Sum of the time to first token, microseconds, and how many.
    pub ttft_micros: AtomicU64,
    /// Requests that produced a first token.
    pub ttft_count: AtomicU64,
    /// Speculation: verification parts run (one per sequence and step).
    pub verify_passes: AtomicU64,
    /// Speculation: draft tokens verified.
    pub drafted: AtomicU64,
    /// Speculation: draft tokens accepted.
    pub drafts_accepted: AtomicU64,
    /// (end of step, decode tokens, step time) of the recent steps.
    recent: Mutex<VecDeque<(Instant, u64, Duration)>>,
}

impl Metrics {
    /// Count one batched step that decoded `tokens` tokens in `elapsed`.
    pub fn record_step(&self, tokens: u64, elapsed: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_back((now, tokens, elapsed));
        while recent
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            recent.pop_front();
        }
    }

    /// A verification of `drafted` drafts that accepted `accepted`.
    pub fn record_verification(&self, drafted: u64, accepted: u64) {
        self.verify_passes.fetch_add(1, Ordering::Relaxed);
        self.drafted.fetch_add(drafted, Ordering::Relaxed);
        self.drafts_accepted.fetch_add(accepted, Ordering::Relaxed);
    }

    /// Count a first token `ttft` after admission.
    pub fn record_ttft(&self, ttft: Duration) {
        self.ttft_micros
            .fetch_add(ttft.as_micros() as u64, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Decode tokens per second of step time over the recent window (0 when idle).
    pub fn decode_rate(&self) -> f64 {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, time) = recent
            .iter()
            .filter(|(t, _, _)| now.duration_since(*t) <= RATE_WINDOW)
            .fold((0u64, Duration::ZERO), |(n, d), (_, k, e)| (n + k, d + *e));
        if time.is_zero() {
            0.0
        } else {
            tokens as f64 / time.as_secs_f64()
        }
    }

    /// The Prometheus text exposition of these counters and `engine`'s weight cache.
    pub fn render(&self, engine: &Engine) -> String {
        let mut out = String::new();
        self.render_requests(&mut out);
        self.render_speculation(&mut out);
        render_weights(&mut out, engine);
        out
    }

    /// Generation requests by outcome, as (labels, count).
    fn outcomes(&self) -> [(&'static str, f64); 5] {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        [
            ("{outcome=\"completed\"}", get(&self.completed)),
            ("{outcome=\"cancelled\"}", get(&self.cancelled)),
            ("{outcome=\"failed\"}", get(&self.failed)),
            (
                "{outcome=\"rejected_invalid\"}",
                get(&self.rejected_invalid),
            ),
            (
                "{outcome=\"rejected_overloaded\"}",
                get(&self.rejected_overloaded),
            ),
        ]
    }

    /// The server's own counters: requests, tokens, steps, latency, queue.
    fn render_requests(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let requests = self.outcomes();
        metric(
            out,
            "ork_requests_total",
            "counter",
            "Generation requests by outcome (accepted ones end completed, cancelled or failed).",
            &requests,
        );
        metric(
            out,
            "ork_requests_accepted_total",
            "counter",
            "Generation requests accepted into the queue.",
            &[("", get(&self.accepted) as f64)],
        );
        metric(
            out,
            "ork_prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated.",
            &[("", get(&self.prompt_tokens) as f64)],
        );
        metric(
            out,
            "ork_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens served from a cached prefix (not evaluated again).",
            &[("", get(&self.cached_tokens) as f64)],
        );
        metric(
            out,
            "ork_prefix_cache_bytes",
            "gauge",
            "Bytes of finished sequences' keys and values kept for prefix reuse.",
            &[("", get(&self.prefix_cache_bytes) as f64)],
        );
        metric(
            out,
            "ork_completion_tokens_total",
            "counter",
            "Tokens generated.",
            &[("", get(&self.completion_tokens) as f64)],
        );
        metric(
            out,
            "ork_decode_tokens_per_second",
            "gauge",
            "Decode tokens per second of step time over the last 10 s (all sequences).",
            &[("", self.decode_rate())],
        );
        metric(
            out,
            "ork_batched_steps_total",
            "counter",
            "Batched forward steps run.",
            &[("", get(&self.steps) as f64)],
        );
        let ttft_n = get(&self.ttft_count);
        metric(
            out,
            "ork_time_to_first_token_seconds_mean",
            "gauge",
            "Mean time from admission to the first token.",
            &[(
                "",
                if ttft_n == 0 {
                    0.0
                } else {
                    get(&self.ttft_micros) as f64 / ttft_n as f64 / 1e6
                },
            )],
        );
        metric(
            out,
            "ork_queue_depth",
            "gauge",
            "Requests waiting for a sequence slot.",
            &[("", get(&self.queue_depth) as f64)],
        );
        metric(
            out,
            "ork_active_sequences",
            "gauge",
            "Sequences running.",
            &[("", get(&self.active) as f64)],
        );
    }

    /// The speculation counters.
    fn render_speculation(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            out,
            "ork_verify_passes_total",
            "counter",
            "Speculation: verifications of drafted tokens (one per sequence and step).",
            &[("", get(&self.verify_passes))],
        );
        metric(
            out,
            "ork_draft_tokens_total",
            "counter",
            "Speculation: prompt-lookup draft tokens verified.",
            &[("", get(&self.drafted))],
        );
        metric(
            out,
            "ork_draft_tokens_accepted_total",
            "counter",
            "Speculation: draft tokens the verification accepted.",
            &[("", get(&self.drafts_accepted))],
        );
    }
}

/// One metric: its help and type lines, then a line per (labels, value) sample.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

/// `engine`'s weight cache: hits, loads, evictions, wall hits, resident bytes and budget.
fn render_weights(out: &mut String, engine: &Engine) {
    let cache = engine.cache_stats();
    // The CPU engine has no device: nothing is resident on one.
    let resident: u64 = match (engine.device_budget(), engine.device()) {
        (Some(budget), Some(device)) => (0..device.info().domains)
            .map(|d| budget.used(ork_device::DomainId(d)))
            .sum(),
        _ => 0,
    };
    metric(
        out,
        "ork_weight_cache_hits_total",
        "counter",
        "Weight uses that found the weight resident.",
        &[("", cache.hits as f64)],
    );
    metric(
        out,
        "ork_weight_loads_total",
        "counter",
        "Weights copied from the .orkpack into device buffers.",
        &[("", cache.loads as f64)],
    );
    metric(
        out,
        "ork_weight_evictions_total",
        "counter",
        "Weights evicted to make room.",
        &[("", cache.evictions as f64)],
    );
    metric(
        out,
        "ork_weight_wall_hits_total",
        "counter",
        "Device allocations refused although the budget allowed them.",
        &[("", cache.wall_hits as f64)],
    );
    metric(
        out,
        "ork_weight_resident_bytes",
        "gauge",
        "Weight bytes resident on the device now (all domains).",
        &[("", resident as f64)],
    );
    metric(
        out,
        "ork_weight_budget_bytes",
        "gauge",
        "Weight budget per domain (0 for the CPU engine: no device).",
        &[("", engine.device_budget().map_or(0, |b| b.budget()) as f64)],
    );
}
