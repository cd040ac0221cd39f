//! Sessions: what a front end runs prompts through, each owning the pieces of the engine it
//! needs.

use std::sync::Arc;

use ork_exec::{ExecError, Linear, Session};
use ork_residency::Trace;

use crate::Engine;

impl Engine {
    /// A new session over the model's trained context.
    ///
    /// The session owns `Arc`s of the engine's model and matmul backend (and, through the
    /// backend, of the weight cache, the device and the prefetcher): it is `Send + 'static`, can
    /// run on another thread or task, and keeps those pieces alive after the engine is dropped.
    pub fn session(&self) -> Session {
        Session::new(Arc::clone(&self.model), self.shared_linear())
            .with_kv_type(self.config.kv_cache)
    }

    /// A new session with an explicit context length (owned, as [`Engine::session`]).
    ///
    /// # Errors
    /// A context of 0.
    pub fn session_with_context(&self, context: usize) -> Result<Session, ExecError> {
        Ok(
            Session::with_context(Arc::clone(&self.model), self.shared_linear(), context)?
                .with_kv_type(self.config.kv_cache),
        )
    }

    /// An identity of the keys and values this engine's sessions of `context` positions
    /// compute, for KV caches kept beyond the process (`ork serve --prefix-cache-dir`): two
    /// engines with the same identity compute the same numbers for the same tokens. It hashes
    /// ork's version, the model file (its metadata but the tokenizer's, and every tensor's fingerprint, after
    /// smoothing: `ork_store::fingerprint`), the quantization (dtype, activations, scale
    /// groups), the device that computes and the chip it keeps to, the compute threads, the KV
    /// cache type and the context (which picks LongRoPE's factors). What does not change a
    /// number — the budget, domains, prefetch, the pack's path — is left out. Reads ~200 KiB
    /// per tensor (the fingerprints' sample).
    pub fn numbers_identity(&self, context: usize) -> u64 {
        let c = &self.config;
        let mut text = format!(
            "ork {} numbers v1\nmodel {} bytes\n",
            env!("CARGO_PKG_VERSION"),
            self.gguf.file_len()
        );
        // The tokenizer's keys map text to tokens; the cache is keyed by tokens already.
        for (k, v) in self
            .gguf
            .metadata_iter()
            .filter(|(k, _)| !k.starts_with("tokenizer."))
        {
            text.push_str(&format!("{k}={v:?}\n"));
        }
        for t in self.gguf.tensors() {
            let fp = ork_store::fingerprint(&self.gguf, t);
            text.push_str(&format!("{} {fp:016x}\n", t.name));
        }
        text.push_str(&format!(
            "dtype {:?} activations {:?} group {:?} device {} soc {:?} threads {} kv {:?} \
             context {context}\n",
            c.dtype,
            c.activations,
            c.group,
            self.compute_name(),
            c.soc,
            self.threads(),
            c.kv_cache,
        ));
        ork_store::xxh3_64(text.as_bytes())
    }

    /// The matmul backend as the executor holds it.
    pub fn shared_linear(&self) -> Arc<dyn Linear> {
        Arc::clone(&self.linear)
    }

    /// Stop the prefetcher and drop the device state, keeping the trace (complete once the
    /// engine is closed). Sessions still alive keep the matmul backend, and with it the
    /// prefetcher and the cache, until the last of them is dropped.
    pub fn close(self) -> Option<Arc<Trace>> {
        let Engine { trace, linear, .. } = self;
        drop(linear);
        trace
    }
}
