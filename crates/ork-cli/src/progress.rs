//! The conversion progress bar (bytes of source packed, rate, ETA) shared by `ork convert` and the
//! self-populating cache of `ork run` / `ork perplexity`. Drawn on stderr only when it is a
//! terminal; hidden with `--json`.

use std::collections::HashMap;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ork_gguf::GgufFile;
use ork_store::matmul_weights;

/// A bar over the source bytes of a model's matmul weights.
pub struct ConvertBar {
    bar: ProgressBar,
    src_bytes: HashMap<String, u64>,
}

impl ConvertBar {
    /// A bar for converting `model`; `hidden` draws nothing.
    pub fn new(model: &GgufFile, hidden: bool) -> anyhow::Result<ConvertBar> {
        let src_bytes: HashMap<String, u64> = matmul_weights(model)
            .iter()
            .map(|t| (t.name.clone(), t.size))
            .collect();
        let total: u64 = src_bytes.values().sum();
        let bar = if hidden {
            ProgressBar::hidden()
        } else {
            // `stderr()` draws nothing when stderr is not a terminal.
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} \
                     ETA {eta} {wide_msg}",
                )?
                .progress_chars("=> "),
            );
            bar
        };
        Ok(ConvertBar { bar, src_bytes })
    }

    /// Advance past one handled tensor (the `ConvertOptions::progress` callback).
    pub fn tensor_done(&self, p: &ork_store::Progress<'_>) {
        self.bar
            .inc(self.src_bytes.get(p.tensor).copied().unwrap_or(0));
        self.bar.set_message(p.tensor.to_string());
    }

    /// Remove the bar from the terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
