//! Prefix reuse: the KV caches of finished sequences, kept in host memory so that a request
//! whose tokens begin with one (the next turn of a conversation, a shared system prompt)
//! prefills only the rest.
//!
//! An LRU of whole prefixes within a byte budget (`--prefix-cache-mb`): each entry is a
//! finished sequence's [`Session`] and the tokens its cache holds. A lookup finds the entry
//! with the longest common prefix with the new prompt (leaving at least the prompt's last token
//! to run, whose logits start the answer). If the whole entry matches — the conversation goes
//! on — its session is taken out and continues; if only part of it does, the matching
//! positions are copied ([`Session::fork`]) and the entry stays. An entry is only used by a
//! session that computes the same numbers ([`Session::same_numbers`]: the same model, matmul
//! backend and KV cache type). Greedy output from a reused prefix equals the output served
//! cold, because every operator works row by row (`crates/ork-server/tests/server/prefix.rs`).
//!
//! A model with sliding-window layers (gemma3) keeps only the last positions in those layers
//! (docs/kv-cache.md, "Sliding-window layers"), so an entry can give only the prefixes it still
//! holds the window of ([`Session::can_fork`]): its whole length and those near its end, or any
//! prefix while it is shorter than the window. A lookup uses the longest prefix some entry can
//! give, else none (a cold prefill); an entry is dropped for a new one that extends it only when
//! the new one can give every prefix the old one could.
use ork_exec::Session;

/// One cached prefix.
struct Entry {
    /// The tokens whose keys and values `session` holds (`session.position()` of them).
    tokens: Vec<u32>,
    session: Session,
    bytes: usize,
}

/// Finished sequences' KV caches, least recently used first (see the module documentation).
pub struct PrefixCache {
    budget: usize,
    bytes: usize,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixCache")
            .field("budget", &self.budget)
            .field("bytes", &self.bytes)
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// The length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// An empty cache holding at most `budget` bytes of keys and values (0: none kept).
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            bytes: 0,
            entries: Vec::new(),
        }
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Prefixes held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no prefix is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keep `session`, whose cache holds the first `session.position()` of `tokens`, as the
    /// most recently used entry; entries it extends are dropped, the least recently used ones
    /// go until the budget holds. A session larger than the whole budget is not kept.
    pub fn insert(&mut self, mut tokens: Vec<u32>, mut session: Session) {
        let len = session.position();
        if len == 0 || tokens.len() < len {
            return;
        }
        tokens.truncate(len);
        if session.kv_bytes() > self.budget {
            return;
        }
        // What it holds is then what it costs (a grown cache reserves up to twice that).
        session.shrink_to_fit();
        let bytes = session.kv_bytes();
        if bytes > self.budget {
            return;
        }
        // An entry this one extends (or repeats) is of no more use.
        let before = self.entries.len();
        self.entries.retain(|e| {
            !(e.session.same_numbers(&session)
                && common(&e.tokens, &tokens) == e.tokens.len()
                && session.can_fork(e.session.min_prefix().max(1)))
        });
        if self.entries.len() != before {
            self.bytes = self.entries.iter().map(|e| e.bytes).sum();
        }
        self.bytes += bytes;
        self.entries.push(Entry {
            tokens,
            session,
            bytes,
        });
        while self.bytes > self.budget {
            let old = self.entries.remove(0);
            self.bytes -= old.bytes;
        }
    }

    /// A session for a request with `prompt`, holding the longest cached prefix of it that a
    /// session like `fresh` may use (the same numbers, see [`Session::same_numbers`]), and the
    /// length of that prefix; `None` if no entry shares a token with `prompt` (or none still
    /// holds what continuing its shared prefix needs, [`Session::can_fork`]). At least the last
    /// prompt token is left to run.
    pub fn take(&mut self, prompt: &[u32], fresh: &Session) -> Option<(Session, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (at, len) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.session.same_numbers(fresh) && e.session.context() == fresh.context()
            })
            .map(|(i, e)| {
                let len = common(&e.tokens, prompt).min(limit);
                (i, if e.session.can_fork(len) { len } else { 0 })
            })
            .max_by_key(|&(i, len)| (len, i))?;
        if len == 0 {
            return None;
        }
        let entry = self.entries.remove(at);
        if len == entry.tokens.len() {
            // The conversation goes on: its session continues (and comes back when done).
            self.bytes -= entry.bytes;
            return Some((entry.session, len));
        }
        let session = entry.session.fork(len);
        // Used: now the most recently used.
        self.entries.push(entry);
        // `can_fork(len)` held above, so the fork succeeds; a failure would only mean a cold
        // prefill.
        session.ok().map(|s| (s, len))
    }
}
