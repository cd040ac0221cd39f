//! Integration tests of ork-gguf (one test binary; topics in `ork-gguf/`).

#[path = "ork-gguf/bad_input.rs"]
mod bad_input;
#[path = "ork-gguf/common.rs"]
mod common;
#[path = "ork-gguf/evict.rs"]
mod evict;
#[path = "ork-gguf/golden.rs"]
mod golden;
#[path = "ork-gguf/real_model.rs"]
mod real_model;
#[path = "ork-gguf/roundtrip.rs"]
mod roundtrip;
#[path = "ork-gguf/throughput.rs"]
mod throughput;
