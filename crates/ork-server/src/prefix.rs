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
//!
//! With `--prefix-cache-dir DIR` the entries outlive the process ([`PrefixCache::save`],
//! [`PrefixCache::load`]): written when the server stops, to one file per numbers identity
//! (`ork_runtime::Engine::numbers_identity`: the model, quantization, device, threads, KV cache
//! type, context and ork's version), atomically and checksummed; read when it starts. A file of
//! another identity is never read, and a damaged one is refused whole.
use ork_exec::Session;
use std::path::{Path, PathBuf};

/// The first bytes of a saved prefix cache (format version 1).
const MAGIC: &[u8; 8] = b"ORKPFX01";

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
    /// Counts the changes to `entries` (what a saver compares to know it has something new).
    generation: u64,
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
            generation: 0,
        }
    }

    /// A number that changes whenever the entries do (an insert, a take).
    pub fn generation(&self) -> u64 {
        self.generation
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
        self.generation += 1;
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
        self.generation += 1;
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

/// What [`PrefixCache::load`] put back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Entries read from the file.
    pub entries: usize,
    /// Entries kept (within the budget, each holding what its sequence needs).
    pub kept: usize,
    /// Positions the kept entries hold.
    pub tokens: usize,
}

/// `path`'s directory and file name.
fn split(path: &Path) -> Result<(&Path, &str), String> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(format!("{}: not a file in a directory", path.display())),
    }
}

/// A reader over a saved cache that names what it misses.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("cut short".to_owned());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn len(&mut self, what: &str) -> Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v)
            .ok()
            .filter(|&n| n <= self.0.len())
            .ok_or_else(|| format!("{what} of {v} is longer than the file"))
    }
}

impl PrefixCache {
    /// The file the cache of numbers identity `identity` is kept in, in `dir`.
    pub fn file_in(dir: &Path, identity: u64) -> PathBuf {
        dir.join(format!("prefix-{identity:016x}.orkkv"))
    }

    /// Write every entry, least recently used first, to `path` for `identity`: magic, identity,
    /// entry count, per entry its tokens and its session's KV image ([`Session::save_kv`]), then
    /// the XXH3-64 of all before it. Written atomically under the rule of a file in a directory ork owns
    /// (`ork_io::output::write_in_dir`: only inside the directory, never through a link, never
    /// over one of `inputs`, the model or its pack): a crash leaves the old file or none. Returns the
    /// bytes written.
    ///
    /// # Errors
    /// The output rule's refusal or an I/O error, naming the file.
    pub fn save(&self, path: &Path, identity: u64, inputs: &[&Path]) -> Result<usize, String> {
        let bytes = self.image(identity);
        PrefixCache::write(path, &bytes, inputs)?;
        Ok(bytes.len())
    }

    /// What [`PrefixCache::save`] writes, built in memory (at memcpy speed: the slow part of a
    /// save, the disk, can then run on another thread).
    pub fn image(&self, identity: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes + 64 * self.entries.len() + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&identity.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.tokens.len() as u64).to_le_bytes());
            out.extend(e.tokens.iter().flat_map(|t| t.to_le_bytes()));
            let image = e.session.save_kv();
            out.extend_from_slice(&(image.len() as u64).to_le_bytes());
            out.extend_from_slice(&image);
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Write an [`PrefixCache::image`] to `path` atomically under ork's output rule (never over
    /// one of `inputs`).
    ///
    /// # Errors
    /// The output rule's refusal or an I/O error, naming the file.
    pub fn write(path: &Path, image: &[u8], inputs: &[&Path]) -> Result<(), String> {
        let (dir, name) = split(path)?;
        ork_io::output::write_in_dir(dir, name, image, inputs).map_err(|e| e.to_string())
    }

    /// Whether [`PrefixCache::write`] may write `path` now (a warning at start, rather than at
    /// the first write).
    ///
    /// # Errors
    /// What the write would refuse, naming the file.
    pub fn check_writable(path: &Path, inputs: &[&Path]) -> Result<(), String> {
        let (dir, name) = split(path)?;
        ork_io::output::check_in_dir(dir, name, inputs).map_err(|e| e.to_string())
    }

    /// Put back the entries [`PrefixCache::save`] wrote to `path` for `identity`, each into a
    /// session from `fresh` (the server's own kind), oldest first, as if its sequence had just
    /// finished. The file is mapped, not read into memory, and only the newest entries whose
    /// KV images fit the budget are loaded (a restart with a smaller `--prefix-cache-mb` keeps
    /// what fits); those a later one extends are dropped as [`PrefixCache::insert`] drops them.
    /// No file is `Ok` with nothing loaded.
    ///
    /// # Errors
    /// The file names what is wrong, and nothing is loaded: not a regular file, not a saved
    /// prefix cache, another identity, a checksum that does not match, a file changed while
    /// read, or an entry the session refuses ([`Session::load_kv`]).
    pub fn load(
        &mut self,
        path: &Path,
        identity: u64,
        fresh: impl Fn() -> Option<Session>,
    ) -> Result<Loaded, String> {
        let named = |what: String| format!("{}: {what}", path.display());
        // Opened as every file ork reads (a regular file, without blocking), then mapped: the
        // file's pages are the page cache's, never the process's, whatever its size.
        let file = match ork_io::open_regular(path) {
            Ok(f) => f,
            Err(ork_io::OpenRegularError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded::default())
            }
            Err(ork_io::OpenRegularError::NotRegular(kind)) => {
                return Err(named(format!("{kind}, not a regular file")))
            }
            Err(ork_io::OpenRegularError::Io(e)) => return Err(named(e.to_string())),
            Err(e) => return Err(named(format!("{e:?}"))),
        };
        let map = ork_io::GuardedMap::new(file).map_err(|e| named(e.to_string()))?;
        let entries = parse(map.bytes(), identity).map_err(named)?;
        // The newest entries (last in the file) whose images fit the budget.
        let (mut fit, mut bytes) = (entries.len(), 0usize);
        while fit > 0 {
            let next = bytes.saturating_add(entries[fit - 1].1.len());
            if next > self.budget {
                break;
            }
            bytes = next;
            fit -= 1;
        }
        let mut sessions = Vec::with_capacity(entries.len() - fit);
        for (i, (tokens, image)) in entries.iter().enumerate().skip(fit) {
            let at = |what: String| named(format!("entry {i}: {what}"));
            let mut session = fresh().ok_or_else(|| at("no session to load into".to_owned()))?;
            session.load_kv(image).map_err(|e| at(e.to_string()))?;
            if session.position() > tokens.len() {
                return Err(at(format!(
                    "{} positions cached for {} tokens",
                    session.position(),
                    tokens.len()
                )));
            }
            sessions.push((tokens.clone(), session));
        }
        map.intact()
            .map_err(|e| named(format!("changed while read: {e}")))?;
        let loaded = entries.len();
        for (tokens, session) in sessions {
            self.insert(tokens, session);
        }
        Ok(Loaded {
            entries: loaded,
            kept: self.entries.len(),
            tokens: self.entries.iter().map(|e| e.tokens.len()).sum(),
        })
    }
}

/// One entry of a saved cache: its tokens and its session's KV image (borrowed from the file).
type SavedEntry<'a> = (Vec<u32>, &'a [u8]);

/// The entries of a saved cache for `identity` (oldest first), after its magic, identity,
/// checksum and every length are checked.
fn parse(bytes: &[u8], identity: u64) -> Result<Vec<SavedEntry<'_>>, String> {
    if bytes.len() < MAGIC.len() + 24 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a saved ork prefix cache".to_owned());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err("checksum mismatch (a damaged file)".to_owned());
    }
    let mut r = Bytes(&body[MAGIC.len()..]);
    let found = r.u64()?;
    if found != identity {
        return Err(format!(
            "made for numbers identity {found:016x}, this server computes {identity:016x}"
        ));
    }
    let count = r.len("the entry count")?;
    let mut entries = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let at = |what: String| format!("entry {i}: {what}");
        let n = r.len("a token count").map_err(at)?;
        let span = n.checked_mul(4).ok_or_else(|| at(format!("{n} tokens")))?;
        let tokens: Vec<u32> = r
            .take(span)
            .map_err(at)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let image_len = r.len("a KV image").map_err(at)?;
        entries.push((tokens, r.take(image_len).map_err(at)?));
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes after the last entry", r.0.len()));
    }
    Ok(entries)
}
