//! SentencePiece (`tokenizer.ggml.model = llama`) encoding of one text fragment, as llama.cpp's
//! `llm_tokenizer_spm_session::tokenize` (src/llama-vocab.cpp, llama-cpp-python 0.3.36's
//! vendored copy) does it:
//!
//! 1. the fragment (spaces already escaped to U+2581) is split into UTF-8 characters, one
//!    symbol each;
//! 2. every adjacent pair whose concatenation is a token is queued with that token's score; the
//!    best pair (highest score, then leftmost) is merged, and the pairs it forms with its
//!    neighbours are queued, until no pair is left;
//! 3. each remaining symbol becomes its token; a character that is no token becomes its bytes'
//!    `<0xNN>` tokens (byte fallback).
//!
//! Written here rather than through the `tokenizers` crate: that crate's SentencePiece models are
//! Unigram (Viterbi over log-probabilities) or BPE over a merge list, and the GGUF stores no merge
//! list for `llama` vocabularies — only scores. llama.cpp's greedy score merge is a third
//! algorithm, and ids must equal llama.cpp's (tests/golden/tokenizer_gemma3.json checks them).
use crate::ExecError;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The vocabulary lookups the merge loop needs.
#[derive(Debug)]
pub(crate) struct SpmModel {
    /// Token text → id, every kind of token (llama.cpp's `token_to_id`).
    ids: HashMap<Box<str>, u32>,
    /// Score per id (`tokenizer.ggml.scores`).
    scores: Vec<f32>,
    /// The longest token text in bytes: a longer pair can never be a token.
    max_len: usize,
    /// The byte-fallback token of each byte (`<0xNN>`, else the byte's own one-character token).
    bytes: [Option<u32>; 256],
}

/// One symbol of the text being merged: a byte range and its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// 0 once merged into the symbol on its left.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// The merged length in bytes when queued; a mismatch later means one side has changed.
    size: usize,
}

impl Ord for Bigram {
    /// The heap's greatest is merged first: the highest score, then the leftmost pair
    /// (`llm_bigram_spm::comparator`). Scores are never NaN (checked when the model is built).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl SpmModel {
    /// Build from the token texts (empty ones already renamed) and their scores.
    pub(crate) fn new(tokens: &[String], scores: &[f32]) -> Result<SpmModel, ExecError> {
        let mut ids: HashMap<Box<str>, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if let Some(first) = ids.insert(t.as_str().into(), i as u32) {
                // llama.cpp asserts `id_to_token.size() == token_to_id.size()` and stops.
                return Err(ExecError::InvalidMetadata {
                    key: "tokenizer.ggml.tokens".to_owned(),
                    what: format!("token {t:?} appears twice (ids {first} and {i})"),
                });
            }
        }
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(ExecError::InvalidMetadata {
                key: "tokenizer.ggml.scores".to_owned(),
                what: format!("score of token {i} is NaN"),
            });
        }
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            // `llama_vocab::byte_to_token`: "<0xNN>" in upper-case hex, else the byte itself
            // (only an ASCII byte is a whole character a token text can hold).
            *slot = ids
                .get(format!("<0x{b:02X}>").as_str())
                .copied()
                .or_else(|| {
                    u8::try_from(b)
                        .ok()
                        .filter(u8::is_ascii)
                        .and_then(|a| ids.get(char::from(a).to_string().as_str()).copied())
                });
        }
        Ok(SpmModel {
            max_len: tokens.iter().map(String::len).max().unwrap_or(0),
            ids,
            scores: scores.to_vec(),
            bytes,
        })
    }

    /// The token whose text is `text`.
    fn id(&self, text: &str) -> Option<u32> {
        if text.len() > self.max_len {
            return None;
        }
        self.ids.get(text).copied()
    }

    /// Append the ids of `text` (already escaped) to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), ExecError> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, ch) in text.char_indices() {
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len: ch.len_utf8(),
                prev: index.checked_sub(1),
                next: (start + ch.len_utf8() < text.len()).then_some(index + 1),
            });
        }
        let mut queue = BinaryHeap::with_capacity(symbols.len());
        for right in 1..symbols.len() {
            self.try_add_bigram(text, &symbols, &mut queue, Some(right - 1), Some(right));
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // One side merged since this pair was queued: stale.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bigram.left);
            }
            self.try_add_bigram(text, &symbols, &mut queue, l.prev, Some(bigram.left));
            self.try_add_bigram(text, &symbols, &mut queue, Some(bigram.left), r.next);
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.id(piece) {
                Some(id) => out.push(id),
                None => {
                    // A merged symbol is always a token, so this is one character outside the
                    // vocabulary: its bytes (llama.cpp's `resegment`).
                    for &b in piece.as_bytes() {
                        out.push(self.bytes[b as usize].ok_or_else(|| ExecError::Tokenizer {
                            what: format!(
                                "{piece:?} is not in the vocabulary and there is no byte token \
                                 <0x{b:02X}> to spell it with"
                            ),
                        })?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    fn try_add_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        // Live neighbours are contiguous in `text`.
        let merged = &text[l.start..r.start + r.len];
        if let Some(id) = self.id(merged) {
            queue.push(Bigram {
                left,
                right,
                score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                size: merged.len(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[(&str, f32)]) -> SpmModel {
        let texts: Vec<String> = tokens.iter().map(|t| t.0.to_owned()).collect();
        let scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        SpmModel::new(&texts, &scores).unwrap()
    }

    fn encode(m: &SpmModel, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode(text, &mut out).unwrap();
        out
    }

    #[test]
    fn best_score_merges_first() {
        // "abc": "ab" (-1) beats "bc" (-2), and "abc" is reachable only through "ab".
        let m = model(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -1.0),
            ("bc", -2.0),
            ("abc", -3.0),
        ]);
        assert_eq!(encode(&m, "abc"), vec![5]);
        // With "bc" better, "a" + "bc" — and "abc" is not formed from "a"+"bc" unless a token.
        let m = model(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -2.0),
            ("bc", -1.0),
        ]);
        assert_eq!(encode(&m, "abc"), vec![0, 4]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        // "aaa": pairs (0,1) and (1,2) both give "aa" with one score; the left one wins.
        let m = model(&[("a", 0.0), ("aa", -1.0)]);
        assert_eq!(encode(&m, "aaa"), vec![1, 0]);
        // Different tokens, same score: still the leftmost pair.
        let m = model(&[("x", 0.0), ("y", 0.0), ("xy", -5.0), ("yx", -5.0)]);
        assert_eq!(encode(&m, "xyx"), vec![2, 0]);
        assert_eq!(encode(&m, "yxy"), vec![3, 1]);
    }

    #[test]
    fn byte_fallback_spells_unknown_characters() {
        let mut tokens: Vec<(String, f32)> =
            (0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect();
        tokens.push(("h".into(), 0.0));
        tokens.push(("i".into(), 0.0));
        tokens.push(("hi".into(), -1.0));
        let texts: Vec<String> = tokens.iter().map(|t| t.0.clone()).collect();
        let scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        let m = SpmModel::new(&texts, &scores).unwrap();
        // "é" (C3 A9) is no token: two byte tokens; "hi" merges.
        assert_eq!(encode(&m, "hié"), vec![258, 0xC3, 0xA9]);
        // A lone character adjacent to nothing still falls back.
        assert_eq!(encode(&m, "😀"), vec![0xF0, 0x9F, 0x98, 0x80]);
        assert!(encode(&m, "").is_empty());
    }

    #[test]
    fn ascii_byte_fallback_uses_the_character_token_and_missing_bytes_are_errors() {
        // No "<0xNN>" tokens: the ASCII byte's own token stands in; a non-ASCII one is an error.
        let m = model(&[("a", 0.0), ("b", 0.0)]);
        assert_eq!(m.bytes[b'a' as usize], Some(0));
        assert!(matches!(
            m.encode("é", &mut Vec::new()),
            Err(ExecError::Tokenizer { .. })
        ));
    }

    #[test]
    fn duplicate_tokens_and_nan_scores_are_refused() {
        let r = SpmModel::new(&["a".into(), "a".into()], &[0.0, 0.0]);
        assert!(
            matches!(r, Err(ExecError::InvalidMetadata { ref key, .. }) if key == "tokenizer.ggml.tokens")
        );
        let r = SpmModel::new(&["a".into()], &[f32::NAN]);
        assert!(
            matches!(r, Err(ExecError::InvalidMetadata { ref key, .. }) if key == "tokenizer.ggml.scores")
        );
    }
}
