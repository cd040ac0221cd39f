//! `ork-server` on the real model (`ORK_MODEL`), emulated device: the API's shapes, batched
//! greedy identity, errors, queue, disconnect, drain, load, and the official Python client.

mod server {
    mod api;
    pub mod common;
    mod health;
    mod hostile;
    mod load;
    mod logprobs;
    pub mod phases;
    mod prefix;
    mod python;
    mod robustness;
    /// ork-runtime's test helpers (the engines-per-phase setup), shared rather than copied.
    #[path = "../../../ork-runtime/tests/common/mod.rs"]
    mod runtime_common;
    mod speculative;
    mod tools;
}
