//! The tokenizer on untrusted input, two ways:
//! 1. arbitrary text through a fixed byte-level vocabulary (all 256 byte tokens, a few merges, a
//!    control token): encoding never fails, and decoding gives the text back exactly — with
//!    special-token parsing off and on;
//! 2. an arbitrary vocabulary (token texts, kinds, merges or SentencePiece scores, BOS/EOS ids,
//!    the space-prefix flag from the input), as a hostile GGUF would carry it: building it either
//!    fails with an `ExecError` or gives a tokenizer that encodes and decodes without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_exec::{TokenKind, Tokenizer, Vocabulary};

/// GPT-2's byte → printable code point table (the byte-level BPE alphabet).
fn byte_chars() -> Vec<char> {
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

fn fixed_tokenizer() -> Tokenizer {
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let sp = chars[b' ' as usize];
    let mut merges = Vec::new();
    for (l, r) in [
        ("t", "h"),
        ("th", "e"),
        (&*sp.to_string(), "the"),
        ("i", "n"),
    ] {
        merges.push(format!("{l} {r}"));
        tokens.push(format!("{l}{r}"));
    }
    let mut kinds = vec![TokenKind::Normal; tokens.len()];
    tokens.push("<|im_start|>".to_owned());
    kinds.push(TokenKind::Control);
    Tokenizer::new(Vocabulary {
        model: "gpt2".to_owned(),
        pre: "smollm".to_owned(),
        tokens,
        kinds,
        merges,
        bos: None,
        eos: None,
        eot: None,
        add_bos: false,
        add_eos: false,
        ..Vocabulary::default()
    })
    .expect("the fixed vocabulary is valid")
}

/// Built once: constructing the BPE model per input would cap the run at a few dozen inputs/s.
static FIXED: std::sync::LazyLock<Tokenizer> = std::sync::LazyLock::new(fixed_tokenizer);

fn arbitrary_vocab(data: &[u8]) -> Vocabulary {
    let mut parts = data.split(|&b| b == 0xFF);
    let head = parts.next().unwrap_or_default();
    let tokens: Vec<String> = parts
        .by_ref()
        .take(512)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let kinds = head
        .iter()
        .map(|&b| TokenKind::from_id(i64::from(b % 8)))
        .take(tokens.len())
        .collect::<Vec<_>>();
    let kinds = if kinds.len() == tokens.len() {
        kinds
    } else {
        Vec::new()
    };
    let merges = tokens
        .windows(2)
        .map(|w| format!("{} {}", w[0], w[1]))
        .collect();
    let id = |i: usize| head.get(i).map(|&b| u32::from(b));
    // Bit 1 of the first byte picks SentencePiece (`llama`), scored by the head bytes.
    let spm = head.first().is_some_and(|b| b & 2 == 2);
    let scores = (0..tokens.len())
        .map(|i| head.get(i).map_or(0.0, |&b| f32::from(b) - 128.0))
        .collect();
    Vocabulary {
        model: if spm { "llama" } else { "gpt2" }.to_owned(),
        scores,
        add_space_prefix: head.get(4).is_some_and(|b| b & 4 == 4),
        pre: if head.first().is_some_and(|b| b & 1 == 1) {
            "qwen2"
        } else {
            "smollm"
        }
        .to_owned(),
        tokens,
        kinds,
        merges,
        bos: id(1),
        eos: id(2),
        eot: id(3),
        add_bos: head.get(4).is_some_and(|b| b & 1 == 1),
        add_eos: head.get(4).is_some_and(|b| b & 2 == 2),
        ..Vocabulary::default()
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some((&mode, rest)) = data.split_first() {
        if mode & 1 == 0 {
            let tok = &*FIXED;
            let text = String::from_utf8_lossy(rest);
            for parse_special in [false, true] {
                let ids = tok
                    .encode(&text, false, parse_special)
                    .expect("byte-level encodes any text");
                let back = tok
                    .decode(&ids, parse_special)
                    .expect("ids come from the vocabulary");
                assert_eq!(back, text, "roundtrip (parse_special {parse_special})");
            }
        } else if let Ok(tok) = Tokenizer::new(arbitrary_vocab(rest)) {
            let text = String::from_utf8_lossy(rest);
            if let Ok(ids) = tok.encode(&text, true, true) {
                let _ = tok.decode(&ids, true);
            }
            let _ = tok.decode(&[0, u32::MAX], false);
        }
    }
});
