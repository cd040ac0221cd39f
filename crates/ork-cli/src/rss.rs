//! Memory figures of this process, read from `/proc/self/status` (no well-kept crate reads
//! VmHWM/RssAnon of the current process; a dozen lines did not justify one). RssAnon is reported
//! apart from the peak: file pages of the GGUF map count in VmHWM but are dropped by
//! `--evict-src`.

use serde::Serialize;

/// A snapshot of the process's memory counters, in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemSnapshot {
    /// Peak resident set size (VmHWM).
    pub peak_rss_bytes: u64,
    /// Current resident set size (VmRSS).
    pub rss_bytes: u64,
    /// Anonymous resident memory (RssAnon).
    pub rss_anon_bytes: u64,
    /// File-backed resident memory (RssFile).
    pub rss_file_bytes: u64,
}

/// Read the counters; zeros where the kernel does not provide them (non-Linux).
pub fn snapshot() -> MemSnapshot {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kb| kb * 1024)
    };
    MemSnapshot {
        peak_rss_bytes: field("VmHWM:"),
        rss_bytes: field("VmRSS:"),
        rss_anon_bytes: field("RssAnon:"),
        rss_file_bytes: field("RssFile:"),
    }
}
