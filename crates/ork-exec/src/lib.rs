//! ork layer 6 — **executor**: runs llama-family models (llama, qwen2, qwen3, phi3, gemma3, and the
//! Mixture-of-Experts llama (Mixtral layout), qwen2moe and qwen3moe) from GGUF, with
//! every matmul delegated to a [`Linear`] so weights can live anywhere (CPU, NPU weight cache).
//!
//! - [`ModelConfig`] / [`Model`]: hyper-parameters and the non-matmul tensors, checked at load.
//! - [`Linear`]: `y = x·Wᵀ` by [`WeightId`] (the manifest's, `docs/architecture.md`);
//!   [`CpuF32Linear`] is the correctness reference, [`CpuW8A8Linear`] the device's quantization
//!   scheme on the CPU.
//! - [`Session`]: KV cache, batched prefill, decode, all-position logits, and one step over
//!   several sessions ([`Session::step`], continuous batching).
//! - [`Tokenizer`], [`TextStream`], [`ChatTemplate`]: text in and out, as llama.cpp does it.
//! - [`Sampler`], [`generate`]: token selection and the generation loop.
//! - [`generate_speculative`]: speculative decoding, a draft's tokens verified in batches.
//! - [`perplexity`]: llama.cpp's `llama-perplexity` protocol.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

// The f32 loops compiled wide and the f16 KV widening live with the other CPU kernels.
use ork_kernels::{wide, widen};
mod chat;
pub mod chat_worker;
mod config;
mod error;
mod fused;
mod gemma3;
mod generate;
mod linear;
mod model;
mod moe;
pub mod ops;
mod perplexity;
mod rope_factors;
mod sample;
mod session;
mod smooth;
mod speculative;
mod spm;
mod tokenizer;
mod weights;

pub use chat::{max_text_bytes, ChatMessage, ChatTemplate, GEMMA3_TEMPLATE};
pub use config::{Arch, ModelConfig, MoeConfig, RopeStyle};
pub use error::ExecError;
pub use gemma3::Gemma3Config;
pub use generate::{generate, GenerateOptions, Generation, StopReason};
pub use linear::{dot_i8, quantize_row_i8, CpuF32Linear, CpuW8A8Linear, Linear, Phase};
pub use model::Model;
pub use moe::{MoeStats, Routing};
pub use ork_manifest::WeightId;
pub use perplexity::{perplexity, PerplexityReport};
pub use sample::{Distribution, Sampler, SamplerOptions};
pub use session::{BatchPart, KvType, Logits, Session};
pub use smooth::{
    smooth_reference, smoothed_gguf, smoothing_factors, BlockSmoothing, SmoothTargets,
};
pub use speculative::{
    check_draft_vocabulary, generate_speculative, judge_chain, Acceptance, Draft, LookupDraft,
    ModelDraft, Proposal, SpeculativeGeneration, SpeculativeOptions, SpeculativeStats,
    StandardAcceptance, TreeProposal, DRAFT_VOCAB_MAX_SIZE_DIFFERENCE,
};
pub use tokenizer::{TextStream, TokenKind, Tokenizer, Vocabulary};
pub use weights::WeightSpec;
