use super::*;

/// A tiny byte-level vocabulary: all 256 byte symbols, a few merges and specials.
fn tiny() -> Tokenizer {
    let table = byte_to_char_table();
    let mut tokens = vec![
        "<|endoftext|>".to_owned(),
        "<|im_start|>".to_owned(),
        "<|im_end|>".to_owned(),
    ];
    let mut kinds = vec![TokenKind::Control; 3];
    for c in table {
        tokens.push(c.to_string());
        kinds.push(TokenKind::Normal);
    }
    let merges = vec![
        "h e".to_owned(),
        "l l".to_owned(),
        "he ll".to_owned(),
        "Ġ w".to_owned(),
    ];
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        kinds.push(TokenKind::Normal);
    }
    tokens.push("<tool>".to_owned());
    kinds.push(TokenKind::UserDefined);
    Tokenizer::new(Vocabulary {
        model: "gpt2".into(),
        pre: "smollm".into(),
        tokens,
        kinds,
        merges,
        bos: Some(1),
        eos: Some(2),
        eot: None,
        add_bos: false,
        add_eos: false,
        ..Vocabulary::default()
    })
    .unwrap()
}

fn id_of(t: &Tokenizer, text: &str) -> u32 {
    (0..t.vocab_size() as u32)
        .find(|&i| t.token_bytes(i, true) == Some(text.as_bytes()))
        .unwrap()
}

#[test]
fn byte_table_is_a_bijection() {
    let t = byte_to_char_table();
    let set: std::collections::HashSet<char> = t.iter().copied().collect();
    assert_eq!(set.len(), 256);
    assert_eq!(t[b' ' as usize], 'Ġ');
    assert_eq!(t[b'\n' as usize], 'Ċ');
    assert_eq!(t[b'A' as usize], 'A');
}

#[test]
fn merges_and_digits_split() {
    let t = tiny();
    let ids = t.encode("hello w12", false, false).unwrap();
    let hell = id_of(&t, "hell");
    let o = id_of(&t, "o");
    let sw = id_of(&t, " w");
    let one = id_of(&t, "1");
    let two = id_of(&t, "2");
    assert_eq!(ids, vec![hell, o, sw, one, two]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hello w12");
}

#[test]
fn control_tokens_only_with_parse_special() {
    let t = tiny();
    let with = t.encode("<|im_start|>hi<|im_end|>", false, true).unwrap();
    assert_eq!(with.first(), Some(&1));
    assert_eq!(with.last(), Some(&2));
    assert_eq!(with.len(), 4);
    let without = t.encode("<|im_start|>", false, false).unwrap();
    assert!(!without.contains(&1));
    assert_eq!(t.decode(&without, false).unwrap(), "<|im_start|>");
    // User-defined tokens are always matched.
    let tool = id_of(&t, "<tool>");
    assert_eq!(t.encode("<tool>", false, false).unwrap(), vec![tool]);
    // Control tokens render only when asked.
    assert_eq!(t.decode(&with, false).unwrap(), "hi");
    assert_eq!(t.decode(&with, true).unwrap(), "<|im_start|>hi<|im_end|>");
}

#[test]
fn eog_includes_eos_and_known_texts() {
    let t = tiny();
    assert!(t.is_end_of_generation(2));
    assert!(
        t.is_end_of_generation(0),
        "<|endoftext|> is an end-of-generation text"
    );
    assert!(!t.is_end_of_generation(1));
}

#[test]
fn empty_text_is_empty_without_bos() {
    assert!(tiny().encode("", true, true).unwrap().is_empty());
}

#[test]
fn stream_holds_back_partial_utf8() {
    let t = tiny();
    // "é" is two bytes, each its own byte-level token here.
    let ids = t.encode("é!", false, false).unwrap();
    assert_eq!(ids.len(), 3);
    let mut s = TextStream::new(&t, false);
    assert_eq!(s.push(ids[0]).unwrap(), "");
    assert_eq!(s.push(ids[1]).unwrap(), "é");
    assert_eq!(s.push(ids[2]).unwrap(), "!");
    assert_eq!(s.finish(), "");
    // A lone continuation byte can never complete: replaced at once.
    let mut s = TextStream::new(&t, false);
    assert_eq!(s.push(ids[1]).unwrap(), "\u{FFFD}");
    assert_eq!(s.push(ids[0]).unwrap(), "");
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn a_merge_whose_result_is_not_a_token_is_an_error_not_a_panic() {
    // From the tokenizer fuzz target: "ichuui" is longer than every token, which made the
    // BPE builder index past its buffer.
    for merges in [vec!["ich uui"], vec!["ich zz"], vec!["zz ich"]] {
        let r = Tokenizer::new(Vocabulary {
            model: "gpt2".into(),
            pre: "smollm".into(),
            tokens: vec!["ich".into(), "uui".into()],
            merges: merges.iter().map(|m| m.to_string()).collect(),
            ..Vocabulary::default()
        });
        assert!(
            matches!(r, Err(ExecError::InvalidMetadata { ref key, .. }) if key == "tokenizer.ggml.merges"),
            "{merges:?}: {r:?}"
        );
    }
}

#[test]
fn qwen2_and_smollm_pre_tokenizers_split_differently() {
    // Qwen2's expression keeps one leading non-letter with the letters ("!w"), and its digit
    // rule is `\p{N}` inside one expression; GPT-2's splits "!" from "w".
    let build = |pre: &str| {
        let mut tokens: Vec<String> = byte_to_char_table().iter().map(|c| c.to_string()).collect();
        tokens.push("!w".into());
        Tokenizer::new(Vocabulary {
            model: "gpt2".into(),
            pre: pre.into(),
            tokens,
            merges: vec!["! w".into()],
            ..Vocabulary::default()
        })
        .unwrap()
    };
    let merged = 256;
    assert_eq!(
        build("qwen2").encode("!w", false, false).unwrap(),
        vec![merged]
    );
    assert_eq!(build("smollm").encode("!w", false, false).unwrap().len(), 2);
    assert_eq!(build("qwen2").encode("12", false, false).unwrap().len(), 2);
}

// Ids of `tiny_spm`'s pieces (after 3 specials and 256 byte tokens).
const SP: u32 = 259;
const H: u32 = 260;
const I: u32 = 261;
const SP_H: u32 = 262;
const SP_HI: u32 = 263;
const HI: u32 = 264;
const AB: u32 = 265;
const BA: u32 = 266;
const A: u32 = 267;
const TOOL: u32 = 269;

/// A small SentencePiece vocabulary: specials, the 256 byte tokens, a few pieces with scores
/// (two of them tied), as a `llama` GGUF lays them out.
fn tiny_spm(add_space_prefix: bool) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut kinds = vec![TokenKind::Unknown, TokenKind::Control, TokenKind::Control];
    let mut scores = vec![0.0; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        kinds.push(TokenKind::Byte);
        scores.push(0.0);
    }
    for (t, s) in [
        ("\u{2581}", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("\u{2581}h", -3.0),
        ("\u{2581}hi", -4.0),
        ("hi", -5.0),
        ("ab", -6.0),
        ("ba", -6.0),
        ("a", -7.0),
        ("b", -7.0),
    ] {
        tokens.push(t.into());
        kinds.push(TokenKind::Normal);
        scores.push(s);
    }
    tokens.push("<tool>".into());
    kinds.push(TokenKind::UserDefined);
    scores.push(0.0);
    Tokenizer::new(Vocabulary {
        model: "llama".into(),
        pre: "default".into(),
        tokens,
        kinds,
        scores,
        bos: Some(1),
        eos: Some(2),
        add_bos: true,
        add_space_prefix,
        ..Vocabulary::default()
    })
    .unwrap()
}

#[test]
fn spm_space_prefix_merges_and_bos() {
    let t = tiny_spm(true);
    // " hi": "▁h" (-3) merges before "hi" (-5), then "▁hi".
    assert_eq!(t.encode("hi", false, false).unwrap(), vec![SP_HI]);
    assert_eq!(t.encode("hi", true, false).unwrap(), vec![1, SP_HI]);
    assert_eq!(t.encode("hi hi", false, false).unwrap(), vec![SP_HI, SP_HI]);
    // A trailing space is its own piece; an empty text gets no space and no tokens.
    assert_eq!(t.encode("hi ", false, false).unwrap(), vec![SP_HI, SP]);
    assert!(t.encode("", false, false).unwrap().is_empty());
    assert_eq!(t.encode("", true, false).unwrap(), vec![1]);
    // The space goes back after a special token, not after text.
    assert_eq!(
        t.encode("hi<tool>hi", false, false).unwrap(),
        vec![SP_HI, TOOL, SP_HI]
    );
    // Decoding drops the one space encoding added; streaming keeps it.
    assert_eq!(t.decode(&[SP_HI, SP_HI], false).unwrap(), "hi hi");
    let mut s = TextStream::new(&t, false);
    assert_eq!(s.push(SP_HI).unwrap(), " hi");
}

#[test]
fn spm_without_space_prefix_and_ties() {
    let t = tiny_spm(false);
    assert_eq!(t.encode("hi", false, false).unwrap(), vec![HI]);
    assert_eq!(t.encode("hhi", false, false).unwrap(), vec![H, HI]);
    assert_eq!(t.encode("ih", false, false).unwrap(), vec![I, H]);
    // "ab" and "ba" score the same: the leftmost pair merges first.
    assert_eq!(t.encode("aba", false, false).unwrap(), vec![AB, A]);
    assert_eq!(t.encode("baba", false, false).unwrap(), vec![BA, BA]);
    assert_eq!(t.decode(&[SP_H], false).unwrap(), " h");
}

#[test]
fn spm_byte_fallback_unknown_and_control_tokens() {
    let t = tiny_spm(false);
    // "é" is no piece: its two bytes, which decode (and stream) back to "é".
    let ids = t.encode("hé", false, false).unwrap();
    assert_eq!(ids, vec![H, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hé");
    // Control and unknown texts are tokens only with parse_special, and render only when
    // asked; without parse_special their characters are spelled out.
    assert_eq!(t.encode("<s><unk>", false, true).unwrap(), vec![1, 0]);
    let plain = t.encode("<s>", false, false).unwrap();
    assert_eq!(plain.len(), 3);
    assert_eq!(t.decode(&plain, false).unwrap(), "<s>");
    assert_eq!(t.decode(&[1, 0, 2], false).unwrap(), "");
    assert_eq!(t.decode(&[1, 0, 2], true).unwrap(), "<s><unk></s>");
}

#[test]
fn spm_bad_vocabularies_are_named() {
    let base = Vocabulary {
        model: "llama".into(),
        tokens: vec!["a".into(), "b".into()],
        ..Vocabulary::default()
    };
    let short = Vocabulary {
        scores: vec![0.0],
        ..base.clone()
    };
    assert!(
        matches!(Tokenizer::new(short), Err(ExecError::InvalidMetadata { ref key, .. }) if key == "tokenizer.ggml.scores")
    );
    let twice = Vocabulary {
        tokens: vec!["a".into(), "a".into()],
        ..base.clone()
    };
    assert!(
        matches!(Tokenizer::new(twice), Err(ExecError::InvalidMetadata { ref key, .. }) if key == "tokenizer.ggml.tokens")
    );
    // No byte tokens: a character outside the vocabulary is an error, not a panic.
    let t = Tokenizer::new(base).unwrap();
    assert!(matches!(
        t.encode("aé", false, false),
        Err(ExecError::Tokenizer { .. })
    ));
}

#[test]
fn unsupported_model_and_pre_are_named() {
    let mut v = Vocabulary {
        model: "bert".into(),
        pre: "smollm".into(),
        tokens: vec!["a".into()],
        ..Vocabulary::default()
    };
    assert!(matches!(
        Tokenizer::new(v.clone()),
        Err(ExecError::UnsupportedTokenizer { .. })
    ));
    v.model = "gpt2".into();
    v.pre = "jais".into();
    match Tokenizer::new(v) {
        Err(ExecError::UnsupportedTokenizer { what }) => assert!(what.contains("jais")),
        other => panic!("{other:?}"),
    }
}
