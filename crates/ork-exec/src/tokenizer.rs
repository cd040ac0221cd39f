//! Text ↔ token ids from the vocabulary stored in the GGUF, following llama.cpp's
//! `src/llama-vocab.cpp`:
//!
//! 1. special-token partition (`tokenizer_st_partition`): control / user-defined / unknown token
//!    texts are cut out of the input, longest first, before anything else (control and unknown
//!    ones only when `parse_special` is set, as llama.cpp does for chat prompts);
//! 2. the remaining raw fragments are encoded by the vocabulary's model:
//!    - `gpt2`: the pre-tokenizer regexes of `tokenizer.ggml.pre` and byte-level BPE with the
//!      file's merges — built in memory with the `tokenizers` crate;
//!    - `llama` (SentencePiece): a space is put before a fragment that starts the text or follows
//!      a special token when `tokenizer.ggml.add_space_prefix` asks, spaces become U+2581, and
//!      the score-ordered merge loop of [`crate::spm`] runs, with `<0xNN>` byte fallback;
//! 3. decoding maps each token back to bytes: byte-level text (`llama_decode_text`) for `gpt2`,
//!    U+2581 → space and `<0xNN>` → the byte for `llama`; control tokens render only when asked.
//!
//! docs/models.md (Tokenizers) lists what is checked against llama.cpp.
use crate::config::{meta_str, opt_bool, opt_usize};
use crate::spm::SpmModel;
use crate::ExecError;
use aho_corasick::AhoCorasick;
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
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre` (`smollm`, `qwen2`).
    pub pre: String,
    /// Token texts, by id.
    pub tokens: Vec<String>,
    /// Token kinds, by id (empty: all normal).
    pub kinds: Vec<TokenKind>,
    /// Merges, `"left right"`, highest priority first (`gpt2` only).
    pub merges: Vec<String>,
    /// Scores, by id (`tokenizer.ggml.scores`; `llama` merges the best-scoring pair first;
    /// empty: all 0, as llama.cpp reads a file without them).
    pub scores: Vec<f32>,
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
    /// `tokenizer.ggml.add_space_prefix`: a space before text that starts the input or follows
    /// a special token (`llama` encoding), and one leading space removed when decoding.
    pub add_space_prefix: bool,
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

/// How raw text fragments become ids.
enum Model {
    /// `gpt2`: byte-level BPE.
    Bpe(Box<tokenizers::Tokenizer>),
    /// `llama`: SentencePiece score merges with byte fallback.
    Spm(Box<SpmModel>),
}

/// A tokenizer built from a GGUF vocabulary: byte-level BPE or SentencePiece.
pub struct Tokenizer {
    model: Model,
    add_space_prefix: bool,
    kinds: Vec<TokenKind>,
    /// Bytes each token renders to (control tokens: their text).
    pieces: Vec<Box<[u8]>>,
    /// Partition tokens (control, user-defined, unknown), longest text first.
    specials: Vec<(String, u32, TokenKind)>,
    /// Finds which of `specials` occur in a text at all, in one pass.
    special_finder: AhoCorasick,
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
            .field(
                "model",
                &match self.model {
                    Model::Bpe(_) => "gpt2",
                    Model::Spm(_) => "llama",
                },
            )
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
        let scores = match gguf.metadata("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or_else(|| invalid("tokenizer.ggml.scores", "not an array"))?
                .iter()
                .map(|s| match s {
                    MetaValue::F32(x) => Ok(*x),
                    MetaValue::I32(x) => Ok(*x as f32),
                    _ => Err(invalid(
                        "tokenizer.ggml.scores",
                        "not an array of f32 or i32 (as llama.cpp reads it)",
                    )),
                })
                .collect::<Result<_, _>>()?,
        };
        let id = |key: &str| -> Result<Option<u32>, ExecError> {
            opt_usize(gguf, key)?
                .map(|v| u32::try_from(v).map_err(|_| invalid(key, "too large")))
                .transpose()
        };
        // llama.cpp's defaults when a key is absent (`llama_vocab::impl::load`): a `llama`
        // vocabulary has BOS 1 and EOS 2 (kept only if inside the vocabulary), adds BOS and
        // puts a space before the text; `gpt2` files name their ids and flags.
        let spm = model == "llama";
        let n = tokens.len();
        let default_id = |id: u32| (spm && (id as usize) < n).then_some(id);
        let vocab = Vocabulary {
            bos: id("tokenizer.ggml.bos_token_id")?.or(default_id(1)),
            eos: id("tokenizer.ggml.eos_token_id")?.or(default_id(2)),
            eot: id("tokenizer.ggml.eot_token_id")?,
            add_bos: opt_bool(gguf, "tokenizer.ggml.add_bos_token")?.unwrap_or(spm),
            add_eos: opt_bool(gguf, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: opt_bool(gguf, "tokenizer.ggml.add_space_prefix")?.unwrap_or(spm),
            model,
            pre,
            tokens,
            kinds,
            merges,
            scores,
        };
        Tokenizer::new(vocab)
    }

    /// Build from an in-memory vocabulary.
    pub fn new(vocab: Vocabulary) -> Result<Tokenizer, ExecError> {
        let spm = match vocab.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(ExecError::UnsupportedTokenizer {
                    what: format!("tokenizer.ggml.model = '{other}' (supported: gpt2, llama)"),
                })
            }
        };
        let kinds = check_vocabulary(&vocab)?;
        let n = vocab.tokens.len();
        // llama.cpp renames an empty token text "[EMPTY_<id>]" when loading; both encoding (by
        // text) and decoding (control/user-defined texts) see the new name.
        let tokens: Vec<String> = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() && spm {
                    format!("[EMPTY_{i}]")
                } else {
                    t.clone()
                }
            })
            .collect();
        let model = if spm {
            let scores = match vocab.scores.len() {
                0 => vec![0.0; n],
                m if m >= n => vocab.scores[..n].to_vec(),
                m => {
                    return Err(invalid(
                        "tokenizer.ggml.scores",
                        &format!("{m} entries for {n} tokens"),
                    ))
                }
            };
            Model::Spm(Box::new(SpmModel::new(&tokens, &scores)?))
        } else {
            Model::Bpe(Box::new(bpe_model(&vocab)?))
        };
        let pieces = token_pieces(&tokens, &kinds, spm);
        let (specials, special_finder) = special_tokens(&tokens, &kinds)?;
        let mut eog: Vec<u32> = [vocab.eos, vocab.eot].into_iter().flatten().collect();
        for (i, (text, kind)) in tokens.iter().zip(&kinds).enumerate() {
            if matches!(kind, TokenKind::Control | TokenKind::UserDefined)
                && EOG_TEXTS.contains(&text.as_str())
            {
                eog.push(i as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer {
            model,
            add_space_prefix: vocab.add_space_prefix,
            kinds,
            pieces,
            specials,
            special_finder,
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
        // SentencePiece puts a space before text at the start or after a special token.
        let mut after_special = true;
        for fragment in self.partition(text, parse_special) {
            match (fragment, &self.model) {
                (Fragment::Token(id), _) => {
                    out.push(id);
                    after_special = true;
                }
                (Fragment::Text(s), Model::Bpe(bpe)) => {
                    let enc = bpe.encode(s, false).map_err(|e| ExecError::Tokenizer {
                        what: format!("encoding {s:?}: {e}"),
                    })?;
                    out.extend_from_slice(enc.get_ids());
                }
                (Fragment::Text(s), Model::Spm(spm)) => {
                    let space = self.add_space_prefix && after_special;
                    let mut escaped = String::with_capacity(s.len() + 3);
                    for ch in space.then_some(' ').into_iter().chain(s.chars()) {
                        escaped.push(if ch == ' ' { '\u{2581}' } else { ch });
                    }
                    spm.encode(&escaped, &mut out)?;
                    after_special = false;
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
        // A special token that is nowhere in `text` is in none of its fragments: skipping it is
        // exact, and saves a scan of the text per special token (Gemma has 6,414 of them).
        let mut present = vec![false; self.specials.len()];
        for m in self.special_finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        let mut frags = vec![Fragment::Text(text)];
        for ((special, id, kind), _) in self.specials.iter().zip(present).filter(|s| s.1) {
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

    /// Decode ids to text (invalid UTF-8 becomes U+FFFD), as `llama_detokenize` with
    /// `remove_special = false`: with `tokenizer.ggml.add_space_prefix` the first token's piece
    /// loses one leading space (the one encoding put there). [`TextStream`] keeps every space, as
    /// llama.cpp's per-token `token_to_piece` does while generating.
    pub fn decode(&self, tokens: &[u32], render_special: bool) -> Result<String, ExecError> {
        let mut bytes = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let piece = self
                .token_bytes(t, render_special)
                .ok_or(ExecError::TokenOutOfRange {
                    token: t,
                    vocab: self.vocab_size(),
                })?;
            let strip = i == 0 && self.add_space_prefix && piece.first() == Some(&b' ');
            bytes.extend_from_slice(&piece[usize::from(strip)..]);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Check the vocabulary's sizes and special ids; returns each token's kind (all normal when
/// the file gives none).
fn check_vocabulary(vocab: &Vocabulary) -> Result<Vec<TokenKind>, ExecError> {
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
    Ok(kinds)
}

/// The bytes each token decodes to.
fn token_pieces(tokens: &[String], kinds: &[TokenKind], spm: bool) -> Vec<Box<[u8]>> {
    let table = byte_to_char_table();
    let char_to_byte: std::collections::HashMap<char, u8> = table
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect();
    tokens
        .iter()
        .zip(kinds)
        .map(|(text, kind)| -> Box<[u8]> {
            match kind {
                // SentencePiece: U+2581 stands for a space (`llama_unescape_whitespace`).
                TokenKind::Normal if spm => text.replace('\u{2581}', " ").into_bytes().into(),
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
        .collect()
}

/// The special tokens (control, user-defined, unknown) that encoding matches in text, longest
/// first, and their matcher.
#[allow(clippy::type_complexity)]
fn special_tokens(
    tokens: &[String],
    kinds: &[TokenKind],
) -> Result<(Vec<(String, u32, TokenKind)>, AhoCorasick), ExecError> {
    let mut specials: Vec<(String, u32, TokenKind)> = tokens
        .iter()
        .zip(kinds)
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
    let finder = AhoCorasick::new(specials.iter().map(|s| s.0.as_str())).map_err(|e| {
        ExecError::Tokenizer {
            what: format!("indexing {} special tokens: {e}", specials.len()),
        }
    })?;
    Ok((specials, finder))
}

/// The byte-level BPE of a `gpt2` vocabulary, with its pre-tokenizer.
fn bpe_model(vocab: &Vocabulary) -> Result<tokenizers::Tokenizer, ExecError> {
    let n = vocab.tokens.len();
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
    Ok(hf)
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
mod tests;
