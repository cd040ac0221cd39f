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
