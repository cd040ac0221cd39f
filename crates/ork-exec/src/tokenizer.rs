//! Text ↔ token ids from the vocabulary stored in the GGUF, following llama.cpp's
//! `src/llama-vocab.cpp`:
//!
//! 1. special-token partition (`tokenizer_st_partition`): control / user-defined / unknown token
//!    texts are cut out of the input, longest first, before anything else (control and unknown
//!    ones only when `parse_special` is set, as llama.cpp does for chat prompts);
//! 2. the remaining raw fragments go through the pre-tokenizer regexes of
//!    `tokenizer.ggml.pre` and byte-level BPE with the file's merges — built in memory with the
//!    `tokenizers` crate;
//! 3. decoding maps each token's byte-level text back to bytes (`llama_decode_text`); control
//!    tokens render only when asked.
use crate::config::{meta_str, opt_bool, opt_usize};
use crate::ExecError;
use ork_gguf::{GgufFile, MetaValue};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

/// llama.cpp's `llama_token_type` values stored in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenKind {
    /// 1: ordinary BPE token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: control token (`<|im_start|>`, BOS, EOS, …).
    Control,
    /// 4: user-defined token, always matched as a whole in text.
    UserDefined,
    /// 5: unused slot.
    Unused,
    /// 6: a raw byte `<0xNN>`.
    Byte,
    /// 0 or any other value.
    Undefined,
}

impl TokenKind {
    /// From the stored integer.
    pub fn from_id(v: i64) -> TokenKind {
        match v {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }
}

/// Everything a tokenizer is built from, as stored under `tokenizer.ggml.*`.
#[derive(Clone, Debug, Default)]
pub struct Vocabulary {
    /// `tokenizer.ggml.model` (only `gpt2`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre` (`smollm`, `qwen2`).
    pub pre: String,
    /// Token texts, by id.
    pub tokens: Vec<String>,
    /// Token kinds, by id (empty: all normal).
    pub kinds: Vec<TokenKind>,
    /// Merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// BOS id.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
    /// End-of-turn id (`tokenizer.ggml.eot_token_id`).
    pub eot: Option<u32>,
    /// Whether encoding with specials prepends BOS.
    pub add_bos: bool,
    /// Whether encoding with specials appends EOS.
    pub add_eos: bool,
}

/// Pre-tokenizer regexes per `tokenizer.ggml.pre`, copied from llama.cpp's
/// `llm_tokenizer_bpe::llm_tokenizer_bpe` (src/llama-vocab.cpp). Each expression splits the
/// pieces the previous one produced; unmatched text stays as its own piece.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, ExecError> {
    let split = |re: &str| -> Result<PreTokenizerWrapper, ExecError> {
        let pattern = SplitPattern::Regex(re.to_owned());
        Split::new(pattern, SplitDelimiterBehavior::Isolated, false)
            .map(PreTokenizerWrapper::Split)
            .map_err(|e| ExecError::Tokenizer {
                what: format!("pre-tokenizer regex {re:?}: {e}"),
            })
    };
    // The byte-level step maps bytes to GPT-2's printable code points; its own regex is off
    // because the splits above already did the work.
    let bytes = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false));
    let gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
    let steps = match pre {
        // LLAMA_VOCAB_PRE_TYPE_SMOLLM: single digits first, then the GPT-2 expression.
        // (STARCODER, REFACT, … share the regexes but detokenize with `clean_spaces`, which ork
        // does not implement, so they are refused.)
        "smollm" => vec![split(r"\p{N}")?, split(gpt2)?, bytes],
        // LLAMA_VOCAB_PRE_TYPE_QWEN2 (as in llama.cpp, which spells out the case-insensitive
        // contractions); like smollm it sets `clean_spaces = false`.
        "qwen2" | "deepseek-r1-qwen" => vec![
            split(concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
                r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ))?,
            bytes,
        ],
        other => {
            return Err(ExecError::UnsupportedTokenizer {
                what: format!("tokenizer.ggml.pre = '{other}' (supported: smollm, qwen2)"),
            })
        }
    };
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
}

/// GPT-2's byte → printable code point table (`bytes_to_unicode`): printable Latin-1 bytes map
/// to themselves, the other 68 to U+0100 onwards in byte order.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are valid chars");
            next += 1;
            c
        };
    }
    table
}

/// Byte-level text → bytes (`llama_decode_text`). A code point outside the table (never in a
/// well-formed byte-level vocabulary) is kept as its own UTF-8 bytes.
fn decode_byte_level(text: &str, char_to_byte: &std::collections::HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for ch in text.chars() {
        match char_to_byte.get(&ch) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// Token texts that llama.cpp also treats as end-of-generation when present
/// (`llama_vocab::impl::load`, the `special_eog_ids` scan).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
];

/// A byte-level BPE tokenizer built from a GGUF vocabulary.
pub struct Tokenizer {
    bpe: tokenizers::Tokenizer,
    kinds: Vec<TokenKind>,
    /// Bytes each token renders to (control tokens: their text).
    pieces: Vec<Box<[u8]>>,
    /// Partition tokens (control, user-defined, unknown), longest text first.
    specials: Vec<(String, u32, TokenKind)>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Read `tokenizer.ggml.*` from the GGUF and build the tokenizer.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, ExecError> {
        let model = meta_str(gguf, "tokenizer.ggml.model")?.to_owned();
        let pre = match gguf.metadata("tokenizer.ggml.pre") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| invalid("tokenizer.ggml.pre", "not a string"))?
                .to_owned(),
            None => "default".to_owned(),
        };
        let strings = |key: &str| -> Result<Vec<String>, ExecError> {
            let arr = gguf
                .metadata(key)
                .ok_or_else(|| ExecError::MissingMetadata {
                    key: key.to_owned(),
                })?
                .as_array()
                .ok_or_else(|| invalid(key, "not an array"))?;
            arr.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| invalid(key, "not an array of strings"))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = if model == "gpt2" {
            strings("tokenizer.ggml.merges")?
        } else {
            Vec::new()
        };
        let kinds = match gguf.metadata("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or_else(|| invalid("tokenizer.ggml.token_type", "not an array"))?
                .iter()
                .map(|t| match t {
                    MetaValue::I32(x) => Ok(TokenKind::from_id(i64::from(*x))),
                    other => other
                        .as_u64()
                        .map(|x| TokenKind::from_id(x as i64))
                        .ok_or_else(|| {
                            invalid("tokenizer.ggml.token_type", "not an integer array")
                        }),
                })
                .collect::<Result<_, _>>()?,
        };
        let id = |key: &str| -> Result<Option<u32>, ExecError> {
            opt_usize(gguf, key)?
                .map(|v| u32::try_from(v).map_err(|_| invalid(key, "too large")))
                .transpose()
        };
        let vocab = Vocabulary {
            model,
            pre,
            tokens,
            kinds,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            add_bos: opt_bool(gguf, "tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: opt_bool(gguf, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        };
        Tokenizer::new(vocab)
    }

    /// Build from an in-memory vocabulary.
    pub fn new(vocab: Vocabulary) -> Result<Tokenizer, ExecError> {
        if vocab.model != "gpt2" {
            return Err(ExecError::UnsupportedTokenizer {
                what: format!("tokenizer.ggml.model = '{}' (supported: gpt2)", vocab.model),
            });
        }
        let n = vocab.tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(invalid("tokenizer.ggml.tokens", "empty or too large"));
        }
        let kinds = if vocab.kinds.is_empty() {
            vec![TokenKind::Normal; n]
        } else if vocab.kinds.len() == n {
            vocab.kinds.clone()
        } else {
            return Err(invalid(
                "tokenizer.ggml.token_type",
                &format!("{} entries for {n} tokens", vocab.kinds.len()),
            ));
        };
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", vocab.bos),
            ("tokenizer.ggml.eos_token_id", vocab.eos),
            ("tokenizer.ggml.eot_token_id", vocab.eot),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(invalid(
                        key,
                        &format!("id {id} is not below the vocabulary size {n}"),
                    ));
                }
            }
        }
        if vocab.add_bos && vocab.bos.is_none() {
            return Err(invalid(
                "tokenizer.ggml.add_bos_token",
                "set, but there is no BOS id",
            ));
        }
        if vocab.add_eos && vocab.eos.is_none() {
            return Err(invalid(
                "tokenizer.ggml.add_eos_token",
                "set, but there is no EOS id",
            ));
        }

        let pre = pre_tokenizer(&vocab.pre)?;
        let mut map = tokenizers::models::bpe::Vocab::with_capacity(n);
        for (i, t) in vocab.tokens.iter().enumerate() {
            // Duplicate texts: the first id wins, as in llama.cpp's token_to_id map.
            map.entry(t.clone()).or_insert(i as u32);
        }
        let merges = vocab
            .merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (a, b) = m.split_once(' ').ok_or_else(|| {
                    invalid(
                        "tokenizer.ggml.merges",
                        &format!("entry {i} {m:?} is not 'left right'"),
                    )
                })?;
                // Checked here, not left to the BPE builder: `tokenizers` 0.23 indexes past its
                // buffer (a panic) when a merge's result is longer than every token, which a
                // hostile file can arrange (found by fuzz/fuzz_targets/tokenizer.rs).
                for part in [a, b, &format!("{a}{b}")] {
                    if !map.contains_key(part) {
                        return Err(invalid(
                            "tokenizer.ggml.merges",
                            &format!("entry {i} {m:?}: {part:?} is not in the vocabulary"),
                        ));
                    }
                }
                Ok((a.to_owned(), b.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(map, merges)
            .build()
            .map_err(|e| ExecError::Tokenizer {
                what: format!("building BPE: {e}"),
            })?;
        let mut hf = tokenizers::Tokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(pre));

        let table = byte_to_char_table();
        let char_to_byte: std::collections::HashMap<char, u8> = table
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let pieces = vocab
            .tokens
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| -> Box<[u8]> {
                match kind {
                    TokenKind::Normal => decode_byte_level(text, &char_to_byte).into(),
                    TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                        text.as_bytes().into()
                    }
                    TokenKind::Byte => {
                        parse_byte_token(text).map_or_else(|| Box::from([]), |b| Box::from([b]))
                    }
                    // llama.cpp renders other kinds as nothing.
                    TokenKind::Unused | TokenKind::Undefined => Box::from([]),
                }
            })
            .collect();

        let mut specials: Vec<(String, u32, TokenKind)> = vocab
            .tokens
            .iter()
            .zip(&kinds)
            .enumerate()
            .filter(|(_, (text, kind))| {
                !text.is_empty()
                    && matches!(
                        kind,
                        TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                    )
            })
            .map(|(i, (text, kind))| (text.clone(), i as u32, *kind))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let mut eog: Vec<u32> = [vocab.eos, vocab.eot].into_iter().flatten().collect();
        for (i, (text, kind)) in vocab.tokens.iter().zip(&kinds).enumerate() {
            if matches!(kind, TokenKind::Control | TokenKind::UserDefined)
                && EOG_TEXTS.contains(&text.as_str())
            {
                eog.push(i as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            bpe: hf,
            kinds,
            pieces,
            specials,
            bos: vocab.bos,
            eos: vocab.eos,
            add_bos: vocab.add_bos,
            add_eos: vocab.add_eos,
            eog,
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// BOS id.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// EOS id.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(…, add_special = true, …)` prepends BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generation stops at `token` (EOS, EOT, and the end-of-turn texts llama.cpp knows).
    pub fn is_end_of_generation(&self, token: u32) -> bool {
        self.eog.binary_search(&token).is_ok()
    }

    /// The end-of-generation ids.
    pub fn end_of_generation(&self) -> &[u32] {
        &self.eog
    }

    /// The kind of a token.
    pub fn kind(&self, token: u32) -> Option<TokenKind> {
        self.kinds.get(token as usize).copied()
    }

    /// Encode `text`. `add_special` adds BOS/EOS as the vocabulary asks; `parse_special` lets
    /// control-token texts in `text` (e.g. `<|im_start|>`) become those tokens.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, ExecError> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s) => {
                    let enc = self
                        .bpe
                        .encode(s, false)
                        .map_err(|e| ExecError::Tokenizer {
                            what: format!("encoding {s:?}: {e}"),
                        })?;
                    out.extend_from_slice(enc.get_ids());
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Cut special-token texts out of `text` (llama.cpp's `tokenizer_st_partition`).
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        for (special, id, kind) in &self.specials {
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Token(_) => next.push(f),
                    Fragment::Text(mut s) => {
                        while let Some(at) = s.find(special.as_str()) {
                            if at > 0 {
                                next.push(Fragment::Text(&s[..at]));
                            }
                            next.push(Fragment::Token(*id));
                            s = &s[at + special.len()..];
                        }
                        if !s.is_empty() {
                            next.push(Fragment::Text(s));
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes `token` renders to; control/unknown tokens render their text only with
    /// `render_special`. `None` for an id out of range.
    pub fn token_bytes(&self, token: u32, render_special: bool) -> Option<&[u8]> {
        let i = token as usize;
        let kind = *self.kinds.get(i)?;
        if !render_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
            return Some(&[]);
        }
        Some(&self.pieces[i])
    }

    /// Decode ids to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, tokens: &[u32], render_special: bool) -> Result<String, ExecError> {
        let mut bytes = Vec::new();
        for &t in tokens {
            bytes.extend_from_slice(self.token_bytes(t, render_special).ok_or(
                ExecError::TokenOutOfRange {
                    token: t,
                    vocab: self.vocab_size(),
                },
            )?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// `<0xNN>` → NN.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

fn invalid(key: &str, what: &str) -> ExecError {
    ExecError::InvalidMetadata {
        key: key.to_owned(),
        what: what.to_owned(),
    }
}

/// Turns generated tokens into text as they arrive, holding back an incomplete UTF-8 sequence
/// until the token that completes it (one character may span several byte-level tokens).
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
}

impl<'t> TextStream<'t> {
    /// A stream over `tokenizer`; `render_special` shows control tokens' text.
    pub fn new(tokenizer: &'t Tokenizer, render_special: bool) -> TextStream<'t> {
        TextStream {
            tokenizer,
            render_special,
            pending: Vec::new(),
        }
    }

    /// Add a token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, token: u32) -> Result<String, ExecError> {
        let bytes = self
            .tokenizer
            .token_bytes(token, self.render_special)
            .ok_or(ExecError::TokenOutOfRange {
                token,
                vocab: self.tokenizer.vocab_size(),
            })?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("validated prefix"),
                    );
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        // Bytes that can never become valid: replace them, as a lossy decode would.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Flush whatever is held back (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
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
            let mut tokens: Vec<String> =
                byte_to_char_table().iter().map(|c| c.to_string()).collect();
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

    #[test]
    fn unsupported_model_and_pre_are_named() {
        let mut v = Vocabulary {
            model: "llama".into(),
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
}
