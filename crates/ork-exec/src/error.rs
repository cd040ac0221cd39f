//! Errors of the executor layer.

/// Everything that can go wrong building or running a model. Variants name the metadata key,
/// tensor or token involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The GGUF layer failed (I/O, malformed file, undecodable tensor type).
    #[error(transparent)]
    Gguf(#[from] ork_gguf::GgufError),
    /// `general.architecture` names a model family ork-exec cannot run.
    #[error(
        "unsupported architecture '{arch}' (supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3)"
    )]
    UnsupportedArchitecture {
        /// The architecture string from the file.
        arch: String,
    },
    /// A required metadata key is absent.
    #[error("missing metadata key '{key}'")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A metadata key has the wrong type or an unusable value.
    #[error("metadata key '{key}': {what}")]
    InvalidMetadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        what: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("missing tensor '{tensor}'")]
    MissingTensor {
        /// Tensor name.
        tensor: String,
    },
    /// A tensor has dimensions other than the configuration implies.
    #[error("tensor '{tensor}': expected dims {expected:?}, found {found:?}")]
    TensorShape {
        /// Tensor name.
        tensor: String,
        /// Dims the configuration implies (`ne[0]` first).
        expected: Vec<u64>,
        /// Dims in the file.
        found: Vec<u64>,
    },
    /// A Mixture-of-Experts tensor disagrees with an expert metadata key (expert count, expert
    /// width), or a router exists where the metadata says the model is dense.
    #[error("tensor '{tensor}' disagrees with metadata key '{key}': {what}")]
    ExpertMismatch {
        /// Tensor name.
        tensor: String,
        /// The metadata key it disagrees with.
        key: String,
        /// How.
        what: String,
    },
    /// The file carries a tensor or a metadata key ork does not implement for its architecture
    /// (`ork_manifest::check_understood`; docs/models.md): refused rather than ignored. Shown
    /// without the file name, like the other variants (the caller names the file).
    #[error("{}", .0.without_file())]
    Unsupported(#[from] ork_manifest::ManifestError),
    /// A tensor's data cannot be laid out as its dims say (overflow, ragged rows).
    #[error("tensor '{tensor}': {what}")]
    TensorData {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// Smoothing parameters or factors that cannot be used (alpha outside `[0, 1]`, an empty
    /// calibration text, factors that do not fit the model; `docs/chip.md`).
    #[error("smoothing: {what}")]
    InvalidSmoothing {
        /// What is wrong.
        what: String,
    },
    /// A `Linear` was asked for a weight it does not hold.
    #[error("linear backend has no weight '{weight}'")]
    UnknownWeight {
        /// Weight (tensor) name.
        weight: String,
    },
    /// Buffer lengths passed to a matmul do not match the weight's shape.
    #[error("matmul '{weight}': {what}")]
    MatmulShape {
        /// Weight (tensor) name.
        weight: String,
        /// Which buffer is wrong and how.
        what: String,
    },
    /// A matmul backend (device, cache) failed.
    #[error("matmul '{weight}' failed in the backend: {source}")]
    Backend {
        /// Weight (tensor) name.
        weight: String,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A token id is not below the vocabulary size.
    #[error("token id {token} out of range (vocabulary has {vocab} tokens)")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// Nothing to evaluate: the prompt tokenized to no tokens and the vocabulary adds no BOS.
    #[error("empty prompt (and the model's vocabulary does not add a BOS token)")]
    EmptyPrompt,
    /// A key or value too large for an f16 KV cache (`--kv-cache f32` holds it).
    #[error(
        "layer {layer}: a {what} of {value} does not fit the f16 KV cache (|x| < 65520); \
         use an f32 cache (--kv-cache f32)"
    )]
    KvRange {
        /// The layer (block) whose projection gave it.
        layer: usize,
        /// `key` or `value`.
        what: &'static str,
        /// The value.
        value: f32,
    },
    /// A context length that cannot be used (zero, or too small for the request).
    #[error("context length {context}: {what}")]
    InvalidContext {
        /// The context length asked for.
        context: usize,
        /// Why it cannot be used.
        what: String,
    },
    /// The tokens would not fit in the context window.
    #[error("context overflow: {needed} positions needed, context is {context}")]
    ContextOverflow {
        /// Positions the request needs (cached + new, or prompt + tokens to generate).
        needed: usize,
        /// The context length in force.
        context: usize,
    },
    /// The tokenizer model or pre-tokenizer in the file is not one ork-exec implements.
    #[error("unsupported tokenizer: {what}")]
    UnsupportedTokenizer {
        /// Which model/pre-tokenizer value, under which key.
        what: String,
    },
    /// Building or running the tokenizer failed.
    #[error("tokenizer: {what}")]
    Tokenizer {
        /// What failed.
        what: String,
    },
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {what}")]
    ChatTemplate {
        /// What failed.
        what: String,
    },
    /// A chat template was stopped for exceeding a bound on its output or its work
    /// ([`crate::ChatTemplate`]: the bytes the context can hold, the instructions allowed, the
    /// nesting depth): a hostile or broken template, never a hang or an abort.
    #[error("chat template stopped: {what}")]
    ChatTemplateLimit {
        /// Which bound, and its value.
        what: String,
    },
    /// Invalid sampling parameters.
    #[error("sampling parameter {param}: {what}")]
    InvalidSampling {
        /// Parameter name.
        param: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A batched step ([`crate::Session::step`]) mixes sessions of different models or matmul
    /// backends: one step runs every matmul once for all of its parts.
    #[error("batched step: part {part} runs on another model or matmul backend than part 0")]
    BatchMismatch {
        /// Index of the part that differs.
        part: usize,
    },
    /// A speculative-decoding setting or draft that cannot be used (`--draft-max 0`, a self draft
    /// with more layers than the model …).
    #[error("speculative decoding: {what}")]
    InvalidDraft {
        /// What is wrong.
        what: String,
    },
    /// A tree of drafted tokens that is not a tree ([`crate::Session::forward_tree`]: a parent
    /// after its child, a parent count other than the token count) or a branch to keep that is
    /// not in the cache ([`crate::Session::keep_branch`]).
    #[error("token tree: {what}")]
    InvalidTree {
        /// What is wrong.
        what: String,
    },
    /// A prefix that [`crate::Session::fork`] or [`crate::Session::truncate`] cannot keep: its
    /// sliding-window layers dropped keys that the prefix's next position would need
    /// ([`crate::Session::min_prefix`], docs/kv-cache.md "Sliding-window layers").
    #[error(
        "cannot keep the first {len} of {position} positions: the sliding-window layers hold \
         only what a prefix of at least {min} positions needs"
    )]
    PrefixDropped {
        /// The prefix length asked for.
        len: usize,
        /// The shortest prefix (other than none) the session can keep.
        min: usize,
        /// The positions the session holds.
        position: usize,
    },
    /// A saved KV cache ([`crate::Session::save_kv`]) that this session cannot hold: cut short,
    /// or made for another layer count, head layout or cache type.
    #[error("a saved KV cache does not fit this session: {0}")]
    KvImage(String),
    /// The draft model's vocabulary is not the verifier's (checked as llama.cpp does: size,
    /// special tokens, and the text of every shared token).
    #[error("draft model {draft}: its vocabulary does not match the model's: {what}")]
    DraftVocabMismatch {
        /// The draft model's file.
        draft: String,
        /// What differs (sizes, which special token, the first differing token id).
        what: String,
    },
    /// Perplexity needs at least two context windows of tokens.
    #[error("perplexity needs at least {needed} tokens (one window of {context}), got {got}")]
    NotEnoughTokens {
        /// Tokens needed.
        needed: usize,
        /// Window size.
        context: usize,
        /// Tokens given.
        got: usize,
    },
}
