//! What a user sees: TTFT, prefill and decode rates and the per-token breakdown, labelled
//! projected, from a replayed [`Timeline`].

use serde::Serialize;

use crate::replay::{Breakdown, Timeline};

/// The projection of a run on a board. Every figure is projected, not measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Projection {
    /// Always `"projected"`.
    pub label: &'static str,
    /// The board (preset, chip or file name).
    pub board: String,
    /// Its chip.
    pub chip: String,
    /// The cost model's version (`ork-board` crate version and calibration).
    pub model_version: String,
    /// Time to first token: from the prompt to the end of its prefill, the model already loaded.
    pub ttft_s: f64,
    /// Prompt tokens per second of the prefill.
    pub prefill_tok_s: f64,
    /// Generated tokens per second after the first (`None` with one token or none).
    pub decode_tok_s: Option<f64>,
    /// Where one decoded token's time goes (`None` without decode).
    pub per_token: Option<Breakdown>,
    /// Loading the resident weights before the first prompt.
    pub load_s: f64,
    /// Bytes read from storage while the clock ran (page-cache misses).
    pub storage_bytes: f64,
    /// Forward passes replayed.
    pub passes: usize,
    /// The projected schedule when it is not plain decoding (a speculative plan's draft, draft
    /// length and the acceptance given as input).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
}

impl Projection {
    /// The figures of `timeline` for a prompt of `prompt_tokens` that generated `generated`
    /// tokens. Prefill is every pass that ends at or before the prompt's last position (the
    /// model's and a draft's); decode is the rest.
    pub fn new(
        timeline: &Timeline,
        board: &crate::Board,
        prompt_tokens: usize,
        generated: usize,
    ) -> Projection {
        let prefill_end = timeline
            .passes
            .iter()
            .filter(|p| p.context + p.tokens <= prompt_tokens)
            .map(|p| p.end_s)
            .fold(0.0, f64::max);
        let decode: Vec<_> = timeline
            .passes
            .iter()
            .filter(|p| p.context + p.tokens > prompt_tokens)
            .collect();
        let last = decode.iter().map(|p| p.end_s).fold(prefill_end, f64::max);
        let steps = generated.saturating_sub(1);
        let (decode_tok_s, per_token) = if steps > 0 && last > prefill_end {
            let mut b = Breakdown::default();
            for p in &decode {
                b.add(&p.breakdown);
            }
            (
                Some(steps as f64 / (last - prefill_end)),
                Some(b.scaled(steps as f64)),
            )
        } else {
            (None, None)
        };
        Projection {
            label: "projected",
            board: board.name.clone(),
            chip: board.chip.name.clone(),
            model_version: crate::MODEL_VERSION.to_owned(),
            ttft_s: prefill_end,
            prefill_tok_s: if prefill_end > 0.0 {
                prompt_tokens as f64 / prefill_end
            } else {
                0.0
            },
            decode_tok_s,
            per_token,
            load_s: timeline.load_s,
            storage_bytes: timeline.storage_bytes,
            passes: timeline.passes.len(),
            schedule: None,
        }
    }

    /// One line for the stats: `projected on BOARD (model M): TTFT … ms, prefill … tok/s,
    /// decode … tok/s; per token: NPU …, copy stalls …, host …, submit … ms`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "projected on {} ({}, board model {}): TTFT {:.0} ms, prefill {:.1} tok/s",
            self.board,
            self.chip,
            self.model_version,
            self.ttft_s * 1e3,
            self.prefill_tok_s
        );
        if let Some(d) = self.decode_tok_s {
            s += &format!(", decode {d:.2} tok/s");
        }
        if let Some(b) = &self.per_token {
            s += &format!(
                "; per token: NPU {:.2} ms, copy stalls {:.2} ms, host {:.2} ms, submit {:.2} ms, \
                 domain switches {:.2} ms",
                b.npu_s * 1e3,
                b.copy_stall_s * 1e3,
                b.host_s * 1e3,
                b.submit_s * 1e3,
                b.domain_switch_s * 1e3
            );
        }
        s
    }
}
