//! The goldens of `scripts/blocks_golden.py` (ggml-cpu's quantizers and dot products,
//! gguf-py's dequantization), parsed for the tests.

/// `crates/ork-kernels/tests/data/blocks_golden.txt`.
const TEXT: &str = include_str!("../../tests/data/blocks_golden.txt");

/// One line: its tag, the words before the first `|`, then each `|`-separated field's words.
pub(super) struct Line {
    pub(super) tag: &'static str,
    pub(super) head: Vec<&'static str>,
    pub(super) fields: Vec<Vec<&'static str>>,
}

/// Every line with tag `tag`.
pub(super) fn lines(tag: &str) -> Vec<Line> {
    TEXT.lines()
        .filter_map(|l| {
            let mut parts = l.split(" | ");
            let mut head = parts.next()?.split_whitespace();
            let t = head.next()?;
            (t == tag).then(|| Line {
                tag: t,
                head: head.collect(),
                fields: parts.map(|p| p.split_whitespace().collect()).collect(),
            })
        })
        .collect()
}

/// Bytes from hex.
pub(super) fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("golden hex"))
        .collect()
}

/// f32s from their hex bit patterns.
pub(super) fn floats(words: &[&str]) -> Vec<f32> {
    words
        .iter()
        .map(|w| f32::from_bits(u32::from_str_radix(w, 16).expect("golden bits")))
        .collect()
}
