//! The conversion progress bar (bytes of source packed, rate, ETA) shared by `ork convert` and the
//! self-populating cache of `ork run` / `ork perplexity`. Drawn on stderr only when it is a
//! terminal; hidden with `--json`.

use std::collections::HashMap;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ork_gguf::GgufFile;
use ork_manifest::Manifest;
use ork_store::matmul_weights;

/// A bar over the source bytes of a model's matmul weights.
pub struct ConvertBar {
    bar: ProgressBar,
    src_bytes: Mutex<HashMap<String, u64>>,
}

impl ConvertBar {
    /// A bar for converting `model`; `hidden` draws nothing.
    pub fn new(model: &GgufFile, hidden: bool) -> anyhow::Result<ConvertBar> {
        let bar = Self::hidden_until_started(hidden);
        bar.set_sizes(
            matmul_weights(model)?
                .iter()
                .map(|t| (t.name.clone(), t.size))
                .collect(),
        );
        Ok(bar)
    }

    /// A bar whose weights are given when conversion starts ([`ork_runtime::ConvertObserver`]);
    /// `hidden` draws nothing.
    pub fn hidden_until_started(hidden: bool) -> ConvertBar {
        let bar = if hidden {
            ProgressBar::hidden()
        } else {
            // `stderr()` draws nothing when stderr is not a terminal.
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} \
                     ETA {eta} {wide_msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar
        };
        ConvertBar {
            bar,
            src_bytes: Mutex::new(HashMap::new()),
        }
    }

    fn set_sizes(&self, sizes: HashMap<String, u64>) {
        self.bar.set_length(sizes.values().sum());
        *self.src_bytes.lock().unwrap_or_else(|p| p.into_inner()) = sizes;
    }

    /// Advance past one handled tensor (the `ConvertOptions::progress` callback).
    pub fn tensor_done(&self, p: &ork_store::Progress<'_>) {
        let bytes = self
            .src_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(p.tensor)
            .copied()
            .unwrap_or(0);
        self.bar.inc(bytes);
        self.bar.set_message(p.tensor.to_string());
    }

    /// Remove the bar from the terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl ork_runtime::ConvertObserver for ConvertBar {
    fn started(&self, manifest: &Manifest) {
        self.set_sizes(
            manifest
                .weights()
                .iter()
                .map(|w| (w.key.clone(), w.slice.size))
                .collect(),
        );
    }

    fn tensor_done(&self, progress: &ork_store::Progress<'_>) {
        ConvertBar::tensor_done(self, progress);
    }

    fn finished(&self) {
        self.finish();
    }
}
