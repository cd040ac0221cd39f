//! Integration tests of ork-exec: tiny random-weight fixtures against a naive reference, and the
//! real SmolLM2 model (see `scripts/fetch-model.sh`).
mod ork_exec {
    pub mod chat_golden;
    pub mod fixtures;
    pub mod gemma3;
    pub mod gemma3_kv;
    pub mod gemma3_real;
    pub mod llama_cpp_logits;
    pub mod moe;
    pub mod moe_golden;
    pub mod real_model;
    pub mod reference;
    pub mod refuse;
    pub mod rope_golden;
    pub mod smooth;
    pub mod speculative;
    pub mod tiny_models;
    pub mod tokenizer_golden;
}
