//! Speculative decoding: a cheap draft proposes the next tokens and the model (the *verifier*)
//! checks them all in one batched forward pass, so a verifier whose weights stream through a
//! small device budget copies its weights once for several tokens (`docs/speculative.md`).
//!
//! Each verifier pass takes the last accepted token and up to `k` drafted ones as one batch
//! (M = k + 1) and gets the logits of every position ([`Session::forward_all`]). Drafts are
//! judged left to right by an [`Acceptance`] rule; the accepted prefix stays in the verifier's KV
//! cache and the rest is rolled back ([`Session::truncate`]); the first rejected position, or the
//! position after the last draft when all are accepted, gives one more token from the verifier
//! itself. A position's logits do not depend on the batch it was computed in (per-token
//! activation scales, per-row attention and norms, exact integer accumulation), so with greedy
//! sampling the output is token for token the verifier's plain greedy output; with temperature,
//! [`StandardAcceptance`] (accept with min(1, p/q), else resample from max(0, p − q)) makes the
//! output distribution the verifier's.
use crate::generate::{GenerateOptions, Generation, StopReason};
use crate::sample::{Distribution, Sampler};
use crate::session::Session;
use crate::tokenizer::Tokenizer;
use crate::ExecError;
use std::time::{Duration, Instant};

/// A drafted token and the distribution the draft drew it from (a point mass for a draft that
/// picks deterministically, such as greedy drafting or prompt lookup).
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    /// The drafted token.
    pub token: u32,
    /// The draft's distribution `q` at this position.
    pub q: Distribution,
}

/// A source of draft tokens.
pub trait Draft: Send {
    /// Propose up to `max` tokens to follow `history` (the prompt and every token accepted so
    /// far, the last one included). Fewer (or none) when the draft has no confident guess.
    ///
    /// # Errors
    /// A draft model's forward pass failing.
    fn propose(&mut self, history: &[u32], max: usize) -> Result<Vec<Proposal>, ExecError>;

    /// Propose a tree of at most `max_nodes` tokens, no branch longer than `max_depth`, to follow
    /// `history` (tree verification, `docs/speculative.md`). Nodes come parents first; siblings
    /// are in the draft's order of preference (the first child is the one judged against the
    /// verifier, the others are taken when the verifier's own token is one of them). By default
    /// the chain of [`Draft::propose`].
    ///
    /// # Errors
    /// As [`Draft::propose`].
    fn propose_tree(
        &mut self,
        history: &[u32],
        max_nodes: usize,
        max_depth: usize,
    ) -> Result<Vec<TreeProposal>, ExecError> {
        Ok(chain_tree(self.propose(history, max_depth.min(max_nodes))?))
    }
}

/// A node of a drafted tree ([`Draft::propose_tree`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeProposal {
    /// The drafted token.
    pub token: u32,
    /// Its parent among the tree's nodes (`None`: it follows the history directly).
    pub parent: Option<usize>,
    /// The draft's distribution at this position (a point mass for a deterministic draft).
    pub q: Distribution,
}

/// Prompt lookup drafting (llama.cpp's lookup decoding, without a model): an n-gram cache of
/// every token the draft has seen — the prompt and the generated text, kept across generations
/// (llama.cpp's context and dynamic caches in one table) — maps each n-gram (n = `ngram_min` to
/// `ngram_max`) to the tokens that followed it, with their counts. The draft looks up the
/// history's last n tokens, longest n first, and drafts the token that most often followed them
/// (the most recent one on a tie); the drafted token joins the tokens looked up for the next one.
/// [`Draft::propose`] drafts that one chain; [`Draft::propose_tree`] also drafts the other
/// followers, shorter n-grams' followers included, as branches, best estimated branch first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupDraft {
    /// Shortest n-gram matched.
    pub ngram_min: usize,
    /// Longest n-gram matched.
    pub ngram_max: usize,
    cache: NgramCache,
}

impl Default for LookupDraft {
    /// n-grams of 1 to 4 tokens, as llama.cpp's `lookup` example.
    fn default() -> Self {
        LookupDraft::new(1, 4)
    }
}

/// What followed one n-gram: (token, count, most recent position) per follower.
type Followers = Vec<(u32, u32, u64)>;

/// The n-gram table of [`LookupDraft`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NgramCache {
    table: std::collections::HashMap<Vec<u32>, Followers>,
    /// The sequence being read (its n-grams are in the table).
    seen: Vec<u32>,
    /// Tokens read over the cache's life (the recency of a follower).
    clock: u64,
}

/// Share of a branch estimate that a longer n-gram's followers take; the rest backs off to
/// shorter n-grams.
const NGRAM_BACKOFF: f64 = 0.75;

impl LookupDraft {
    /// A lookup draft matching n-grams of `ngram_min..=ngram_max` tokens.
    pub fn new(ngram_min: usize, ngram_max: usize) -> LookupDraft {
        LookupDraft {
            ngram_min: ngram_min.max(1),
            ngram_max,
            cache: NgramCache::default(),
        }
    }

    /// Read `history` into the cache: the tokens after what it has seen when `history` extends
    /// it, else all of `history` as a new sequence (the counts of earlier ones stay).
    fn read(&mut self, history: &[u32]) {
        let c = &mut self.cache;
        let from = if history.starts_with(&c.seen) {
            c.seen.len()
        } else {
            c.seen.clear();
            0
        };
        for &t in &history[from..] {
            c.seen.push(t);
            c.clock += 1;
            let len = c.seen.len();
            for n in self.ngram_min..=self.ngram_max {
                if n >= len {
                    break;
                }
                let key = c.seen[len - 1 - n..len - 1].to_vec();
                let f = c.table.entry(key).or_default();
                match f.iter_mut().find(|e| e.0 == t) {
                    Some(e) => {
                        e.1 += 1;
                        e.2 = c.clock;
                    }
                    None => f.push((t, 1, c.clock)),
                }
            }
        }
    }

    /// The followers of the longest n-gram ending `tokens` that has any, best first.
    fn followers(&self, tokens: &[u32]) -> Option<Followers> {
        let len = tokens.len();
        (self.ngram_min..=self.ngram_max).rev().find_map(|n| {
            let key = tokens.get(len.checked_sub(n)?..)?;
            let mut f = self.cache.table.get(key)?.clone();
            f.sort_by_key(|e| std::cmp::Reverse((e.1, e.2)));
            Some(f)
        })
    }

    /// Candidate tokens after `tokens` with an estimated probability: each n-gram's followers
    /// (longest n first) share [`NGRAM_BACKOFF`] of what is left in proportion to their counts.
    fn candidates(&self, tokens: &[u32]) -> Vec<(u32, f64)> {
        let len = tokens.len();
        let mut out: Vec<(u32, f64)> = Vec::new();
        let mut mass = 1.0;
        for n in (self.ngram_min..=self.ngram_max).rev() {
            let Some(key) = len.checked_sub(n).and_then(|a| tokens.get(a..)) else {
                continue;
            };
            let Some(f) = self.cache.table.get(key) else {
                continue;
            };
            let mut f = f.clone();
            f.sort_by_key(|e| std::cmp::Reverse((e.1, e.2)));
            let total: u32 = f.iter().map(|e| e.1).sum();
            for (t, count, _) in f {
                if !out.iter().any(|o| o.0 == t) {
                    out.push((
                        t,
                        mass * NGRAM_BACKOFF * f64::from(count) / f64::from(total),
                    ));
                }
            }
            mass *= 1.0 - NGRAM_BACKOFF;
        }
        out
    }
}

impl Draft for LookupDraft {
    fn propose(&mut self, history: &[u32], max: usize) -> Result<Vec<Proposal>, ExecError> {
        self.read(history);
        let mut buf = history.to_vec();
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let Some(t) = self.followers(&buf).and_then(|f| f.first().map(|e| e.0)) else {
                break;
            };
            out.push(Proposal {
                token: t,
                q: Distribution::point(t),
            });
            buf.push(t);
        }
        Ok(out)
    }

    /// Best-first: the tree grows by the candidate whose branch has the highest estimated
    /// probability (the product of [`LookupDraft`]'s per-token estimates along it), so the chain
    /// of [`Draft::propose`] comes first and the budget then goes to the likeliest alternatives.
    fn propose_tree(
        &mut self,
        history: &[u32],
        max_nodes: usize,
        max_depth: usize,
    ) -> Result<Vec<TreeProposal>, ExecError> {
        self.read(history);
        let mut nodes: Vec<TreeProposal> = Vec::new();
        // Per node: its branch's tokens after the history, its estimate.
        let mut paths: Vec<(Vec<u32>, f64)> = Vec::new();
        // Frontier: (estimate, parent, token, preference among its siblings).
        let mut frontier: Vec<(f64, Option<usize>, u32, usize)> = Vec::new();
        let expand = |frontier: &mut Vec<(f64, Option<usize>, u32, usize)>,
                      parent: Option<usize>,
                      path: &[u32],
                      estimate: f64| {
            let mut ctx = history.to_vec();
            ctx.extend_from_slice(path);
            for (rank, (t, p)) in self.candidates(&ctx).into_iter().enumerate() {
                frontier.push((estimate * p, parent, t, rank));
            }
        };
        if max_depth > 0 {
            expand(&mut frontier, None, &[], 1.0);
        }
        while nodes.len() < max_nodes {
            // The best candidate; on equal estimates the earlier-ranked sibling.
            let Some(best) = (0..frontier.len()).max_by(|&a, &b| {
                let (x, y) = (&frontier[a], &frontier[b]);
                x.0.total_cmp(&y.0).then(y.3.cmp(&x.3))
            }) else {
                break;
            };
            let (estimate, parent, token, _) = frontier.swap_remove(best);
            let mut path = parent.map_or_else(Vec::new, |p| paths[p].0.clone());
            path.push(token);
            nodes.push(TreeProposal {
                token,
                parent,
                q: Distribution::point(token),
            });
            if path.len() < max_depth {
                expand(&mut frontier, Some(nodes.len() - 1), &path, estimate);
            }
            paths.push((path, estimate));
        }
        // Nodes are in the order they were chosen: parents before children, and a parent's
        // children in order of preference (their estimates share the parent's factor).
        Ok(nodes)
    }
}

/// A draft that is a model: a smaller model sharing the vocabulary (`--draft MODEL.gguf`) or the
/// verifier's own first layers (`--draft self`), in a [`Session`] of its own. Its KV cache is kept
/// in step with the verifier's: before drafting it is truncated to the longest prefix it shares
/// with the accepted history, and only the tokens after that prefix are fed.
pub struct ModelDraft {
    session: Session,
    cached: Vec<u32>,
    sampler: Sampler,
    p_min: f32,
}

impl ModelDraft {
    /// Draft with `session`, drawing tokens with `sampler` (greedy for greedy verification; the
    /// verifier's temperature, top-k and top-p otherwise, with a seed of its own), and stop
    /// drafting at a position where the draft's most likely token has a probability below
    /// `p_min` (softmax of the raw logits; 0 never stops).
    pub fn new(session: Session, sampler: Sampler, p_min: f32) -> ModelDraft {
        ModelDraft {
            session,
            cached: Vec::new(),
            sampler,
            p_min,
        }
    }

    /// The draft's session.
    pub fn session(&self) -> &Session {
        &self.session
    }
}

/// Probability of the most likely token under softmax(logits).
fn top_probability(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    if !max.is_finite() {
        return 0.0;
    }
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    1.0 / sum
}

impl Draft for ModelDraft {
    fn propose(&mut self, history: &[u32], max: usize) -> Result<Vec<Proposal>, ExecError> {
        // Feeding the history takes history.len() positions, each draft but the last one more.
        let room = (self.session.context() + 1).saturating_sub(history.len());
        let max = max.min(room);
        if max == 0 || history.is_empty() {
            return Ok(Vec::new());
        }
        let mut common = self
            .cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count();
        // The logits after the whole history are needed: feed at least its last token.
        if common == history.len() {
            common -= 1;
        }
        // A draft with sliding-window layers may no longer hold a prefix that far back (more
        // rejected tokens than it keeps, docs/kv-cache.md): then the whole history is fed again.
        if !self.session.can_fork(common) {
            common = 0;
        }
        self.session.truncate(common)?;
        self.cached.truncate(common);
        let mut logits = self.session.prefill(&history[common..])?;
        self.cached.extend_from_slice(&history[common..]);
        let vocab = self.session.model().config().vocab_size;
        let mut out = Vec::with_capacity(max);
        for j in 0..max {
            if self.p_min > 0.0 && top_probability(&logits) < f64::from(self.p_min) {
                break;
            }
            let q = self.sampler.distribution(&logits)?;
            let token = if self.sampler.options().temperature == 0.0 {
                q.top()
            } else {
                self.sampler.draw(&q)
            };
            if token as usize >= vocab {
                break;
            }
            out.push(Proposal { token, q });
            if j + 1 < max {
                logits = self.session.decode(token)?;
                self.cached.push(token);
            }
        }
        Ok(out)
    }
}

/// Largest difference in vocabulary size between a draft model and the verifier (llama.cpp's
/// `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`).
pub const DRAFT_VOCAB_MAX_SIZE_DIFFERENCE: usize = 128;

/// First token id whose text must match (llama.cpp's `SPEC_VOCAB_CHECK_START_TOKEN_ID`: some
/// model families differ only in the first special tokens).
const DRAFT_VOCAB_CHECK_START: usize = 5;

/// Check that a draft model's vocabulary is the verifier's, as llama.cpp does before speculative
/// decoding: sizes within [`DRAFT_VOCAB_MAX_SIZE_DIFFERENCE`], the same BOS and EOS tokens and
/// BOS policy, and the same text for every token id both have from id 5 on.
///
/// # Errors
/// [`ExecError::DraftVocabMismatch`] naming `draft_file` and the first difference.
pub fn check_draft_vocabulary(
    verifier: &Tokenizer,
    draft: &Tokenizer,
    draft_file: &str,
) -> Result<(), ExecError> {
    let mismatch = |what: String| ExecError::DraftVocabMismatch {
        draft: draft_file.to_owned(),
        what,
    };
    let (nv, nd) = (verifier.vocab_size(), draft.vocab_size());
    if nv.abs_diff(nd) > DRAFT_VOCAB_MAX_SIZE_DIFFERENCE {
        return Err(mismatch(format!(
            "{nd} tokens against the model's {nv} (at most {DRAFT_VOCAB_MAX_SIZE_DIFFERENCE} apart)"
        )));
    }
    if verifier.bos() != draft.bos() || verifier.add_bos() != draft.add_bos() {
        return Err(mismatch(format!(
            "BOS token {:?} (added: {}) against the model's {:?} (added: {})",
            draft.bos(),
            draft.add_bos(),
            verifier.bos(),
            verifier.add_bos()
        )));
    }
    if verifier.eos() != draft.eos() {
        return Err(mismatch(format!(
            "EOS token {:?} against the model's {:?}",
            draft.eos(),
            verifier.eos()
        )));
    }
    for id in DRAFT_VOCAB_CHECK_START..nv.min(nd) {
        let id = id as u32;
        if verifier.token_bytes(id, true) != draft.token_bytes(id, true) {
            return Err(mismatch(format!(
                "token {id} is {:?} in the draft and {:?} in the model",
                draft
                    .token_bytes(id, true)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default(),
                verifier
                    .token_bytes(id, true)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// How a drafted token is judged against the verifier's distribution at its position.
pub trait Acceptance: Send {
    /// Judge `token`, drafted from `q`, where the verifier's distribution is `p`: `None` accepts
    /// it; `Some(t)` rejects it and emits `t` instead (which ends the verifier pass). Random
    /// draws come from `sampler` (the verifier's stream).
    fn judge(
        &mut self,
        p: &Distribution,
        q: &Distribution,
        token: u32,
        sampler: &mut Sampler,
    ) -> Option<u32>;
}

/// The rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023; llama.cpp's
/// `speculative` example): accept with probability min(1, p(x)/q(x)); on rejection draw from
/// max(0, p − q) normalized. The emitted token is then distributed as `p`. With greedy `p` and
/// `q` (point masses) it accepts exactly when the draft is the verifier's argmax and emits the
/// argmax otherwise, drawing nothing at random.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandardAcceptance;

impl Acceptance for StandardAcceptance {
    fn judge(
        &mut self,
        p: &Distribution,
        q: &Distribution,
        token: u32,
        sampler: &mut Sampler,
    ) -> Option<u32> {
        let (pd, qd) = (p.prob(token), q.prob(token));
        if qd > 0.0 && pd >= qd {
            return None;
        }
        if qd > 0.0 && pd > 0.0 && sampler.uniform() < pd / qd {
            return None;
        }
        // Rejected: the residual max(0, p − q), normalized (p itself if nothing is left, which
        // only rounding can cause).
        let q_of = dense(q);
        let residual: Vec<(u32, f64)> = p
            .entries()
            .iter()
            .map(|&(id, pv)| {
                let qv = q_of.get(id as usize).copied().unwrap_or(0.0);
                (id, (pv - qv).max(0.0))
            })
            .collect();
        match Distribution::from_weights(residual) {
            Some(r) if r.entries().len() == 1 => Some(r.top()),
            Some(r) => Some(sampler.draw(&r)),
            None => Some(sampler.draw(p)),
        }
    }
}

/// `q` as a dense vector indexed by token id.
fn dense(q: &Distribution) -> Vec<f64> {
    let len = q
        .entries()
        .iter()
        .map(|e| e.0 as usize + 1)
        .max()
        .unwrap_or(0);
    let mut v = vec![0.0; len];
    for &(id, p) in q.entries() {
        v[id as usize] = p;
    }
    v
}

/// How many tokens to draft per verifier pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculativeOptions {
    /// Most drafted tokens per pass (`--draft-max`, at least 1): the verifier batch is at most
    /// `draft_max + 1` positions.
    pub draft_max: usize,
    /// Adapt the draft length: halve it (down to one more than the accepted count) after a
    /// rejection, double it (up to `draft_max`) when every draft was accepted. Off: always
    /// `draft_max`.
    pub adaptive: bool,
    /// Tree verification (`--draft-tree N`): each pass verifies a tree of up to `N` drafted
    /// tokens ([`Draft::propose_tree`], branches at most the current draft length deep) instead
    /// of one chain. `None`: a chain.
    pub tree_nodes: Option<usize>,
}

impl SpeculativeOptions {
    /// Check the options.
    ///
    /// # Errors
    /// [`ExecError::InvalidDraft`] for `draft_max == 0`.
    pub fn check(&self) -> Result<(), ExecError> {
        if self.draft_max == 0 {
            return Err(ExecError::InvalidDraft {
                what: "--draft-max 0: draft at least one token per pass (or run without --draft)"
                    .to_owned(),
            });
        }
        if self.tree_nodes == Some(0) {
            return Err(ExecError::InvalidDraft {
                what: "--draft-tree 0: a tree of at least one token per pass (or no --draft-tree)"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// Counters of a speculative generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpeculativeStats {
    /// Draft tokens sent to the verifier.
    pub drafted: usize,
    /// Draft tokens the verifier accepted.
    pub accepted: usize,
    /// Verifier forward passes (batches) run after the prompt.
    pub passes: usize,
    /// Time spent drafting.
    pub draft_time: Duration,
    /// Time spent in verifier passes.
    pub verify_time: Duration,
}

impl SpeculativeStats {
    /// `accepted / drafted` (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// The result of [`generate_speculative`].
#[derive(Clone, Debug)]
pub struct SpeculativeGeneration {
    /// Tokens and timings, as [`crate::generate`] reports them; `decode_steps` counts the
    /// generated tokens and `decode_time` every verifier pass and all drafting (the last prompt
    /// token is evaluated in the first pass, not in the prefill).
    pub generation: Generation,
    /// Draft and verifier counters.
    pub stats: SpeculativeStats,
}

impl SpeculativeGeneration {
    /// Generated tokens per verifier pass.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.stats.passes == 0 {
            0.0
        } else {
            self.generation.tokens.len() as f64 / self.stats.passes as f64
        }
    }
}

/// Generate like [`crate::generate`], verifying `draft`'s proposals in batches (see the module
/// documentation). `sampler` is the verifier's; `acceptance` judges each draft
/// ([`StandardAcceptance`]).
///
/// # Errors
/// As [`crate::generate`]; [`ExecError::InvalidDraft`] for `draft_max == 0`.
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative(
    session: &mut Session,
    draft: &mut dyn Draft,
    prompt: &[u32],
    options: &GenerateOptions,
    speculative: &SpeculativeOptions,
    sampler: &mut Sampler,
    acceptance: &mut dyn Acceptance,
    mut on_token: impl FnMut(u32) -> Result<(), ExecError>,
) -> Result<SpeculativeGeneration, ExecError> {
    speculative.check()?;
    let Some((&first_last, head)) = prompt.split_last() else {
        return Err(ExecError::EmptyPrompt);
    };
    let needed = session.position() + prompt.len() + options.max_tokens;
    if needed > session.context() {
        return Err(ExecError::ContextOverflow {
            needed,
            context: session.context(),
        });
    }
    let vocab = session.model().config().vocab_size;
    let t0 = Instant::now();
    // All but the last prompt token; the last one opens the first verifier batch.
    if !head.is_empty() {
        session.prefill(head)?;
    }
    let prefill_time = t0.elapsed();

    let mut stats = SpeculativeStats::default();
    let mut history = prompt.to_vec();
    let mut last = first_last;
    let mut tokens = Vec::new();
    let mut k = speculative.draft_max;
    let stop = loop {
        let remaining = options.max_tokens - tokens.len();
        if remaining == 0 {
            break StopReason::MaxTokens;
        }
        // A pass emits the accepted drafts and one more token.
        let want = k.min(remaining - 1);
        let td = Instant::now();
        let drafts = propose(draft, &history, want, speculative.tree_nodes)?;
        stats.draft_time += td.elapsed();
        let (tree, depth) = prune_tree(&drafts, vocab, want);
        let n_tree = tree.len();
        let (batch, parents) = verifier_batch(last, &tree);
        let base = session.position();
        let tv = Instant::now();
        let (logits, chain) = verify(session, &batch, &parents)?;
        stats.verify_time += tv.elapsed();
        stats.passes += 1;
        stats.drafted += n_tree;

        let (path, next) = walk(
            &batch,
            &parents,
            &logits,
            vocab,
            (&drafts, &tree),
            sampler,
            acceptance,
        )?;
        let accepted = path.len() - 1;
        stats.accepted += accepted;
        // The verifier's cache keeps `last` and the accepted branch.
        if chain {
            session.truncate(base + 1 + accepted)?;
        } else {
            session.keep_branch(base, &path)?;
        }
        if speculative.adaptive && n_tree > 0 {
            k = next_k(
                k,
                accepted,
                depth.iter().copied().max().unwrap_or(0),
                speculative.draft_max,
            );
        }
        let emitted = path[1..].iter().map(|&j| batch[j]).chain([next]);
        let out = (&mut tokens, &mut history, &mut on_token);
        if let Some(stop) = emit(session, base, emitted, options, out)? {
            break stop;
        }
        last = next;
    };
    let decode_time = t0.elapsed() - prefill_time;
    Ok(SpeculativeGeneration {
        generation: Generation {
            decode_steps: tokens.len(),
            tokens,
            stop,
            prompt_tokens: prompt.len(),
            prefill_time,
            decode_time,
        },
        stats,
    })
}

/// Judge a chain of drafts verified elsewhere (the server's batched step verifies them as one
/// part of a [`Session::step`]): `logits` are the verifier's for every row of
/// `[last, drafts…]` (`(drafts.len() + 1) × vocab`, as [`Session::forward_all`] or a batch part
/// with [`crate::Logits::All`] gives them). The drafts are judged left to right by `acceptance`,
/// as [`generate_speculative`] judges a chain. Returns how many were accepted and the token the
/// pass emits after them; the cache is then to keep `last` and the accepted drafts
/// ([`Session::truncate`] to the position before the pass + 1 + accepted).
///
/// # Errors
/// [`ExecError::InvalidDraft`] for a drafted token outside the vocabulary or logits of another
/// length; the sampler's errors.
pub fn judge_chain(
    last: u32,
    drafts: &[Proposal],
    (logits, vocab): (&[f32], usize),
    sampler: &mut Sampler,
    acceptance: &mut dyn Acceptance,
) -> Result<(usize, u32), ExecError> {
    let tree = chain_tree(drafts.to_vec());
    let (kept, _) = prune_tree(&tree, vocab, drafts.len());
    if kept.len() != drafts.len() || logits.len() != (drafts.len() + 1) * vocab {
        return Err(ExecError::InvalidDraft {
            what: format!(
                "{} drafts ({} in the vocabulary of {vocab}) against {} logits",
                drafts.len(),
                kept.len(),
                logits.len()
            ),
        });
    }
    let (batch, parents) = verifier_batch(last, &kept);
    let (path, next) = walk(
        &batch,
        &parents,
        logits,
        vocab,
        (&tree, &kept),
        sampler,
        acceptance,
    )?;
    Ok((path.len() - 1, next))
}

/// The verifier's batch: `last` (node 0), then the kept drafts (node j + 1), and each row's
/// parent row.
fn verifier_batch(last: u32, tree: &[KeptNode]) -> (Vec<u32>, Vec<Option<usize>>) {
    let batch = std::iter::once(last)
        .chain(tree.iter().map(|t| t.0))
        .collect();
    let parents = std::iter::once(None)
        .chain(tree.iter().map(|t| Some(t.1.unwrap_or(0))))
        .collect();
    (batch, parents)
}

/// Run the verifier over `batch`: one forward pass over a chain, a tree pass otherwise.
/// Returns the logits of every row and whether the batch was a chain.
fn verify(
    session: &mut Session,
    batch: &[u32],
    parents: &[Option<usize>],
) -> Result<(Vec<f32>, bool), ExecError> {
    let chain = parents
        .iter()
        .enumerate()
        .all(|(i, p)| *p == i.checked_sub(1));
    let logits = if chain {
        session.forward_all(batch)?
    } else {
        session.forward_tree(batch, parents)?
    };
    Ok((logits, chain))
}

/// The pass's tokens and history so far, and the callback each emitted token goes to.
type Emitted<'a, F> = (&'a mut Vec<u32>, &'a mut Vec<u32>, &'a mut F);

/// Emit a pass's tokens (the accepted drafts, then the verifier's own) after the cache position
/// `base`; the generation stops at a stop token or at `max_tokens`, its cache then cut as plain
/// generation leaves it.
fn emit<F: FnMut(u32) -> Result<(), ExecError>>(
    session: &mut Session,
    base: usize,
    emitted: impl Iterator<Item = u32>,
    options: &GenerateOptions,
    (tokens, history, on_token): Emitted<'_, F>,
) -> Result<Option<StopReason>, ExecError> {
    for (e, t) in emitted.enumerate() {
        if options.stop_tokens.contains(&t) {
            // As plain generation: every emitted token is in the cache.
            session.truncate(base + 1 + e)?;
            return Ok(Some(StopReason::EndOfGeneration(t)));
        }
        tokens.push(t);
        history.push(t);
        on_token(t)?;
        if tokens.len() == options.max_tokens {
            // As plain generation: the last emitted token is not in the cache.
            session.truncate(base + 1 + e)?;
            return Ok(Some(StopReason::MaxTokens));
        }
    }
    Ok(None)
}

/// A chain of proposals as a tree: each node the previous one's child.
fn chain_tree(chain: Vec<Proposal>) -> Vec<TreeProposal> {
    chain
        .into_iter()
        .enumerate()
        .map(|(i, p)| TreeProposal {
            token: p.token,
            parent: i.checked_sub(1),
            q: p.q,
        })
        .collect()
}

/// `want` proposals from `draft` after `history`: a chain (each node the previous one's child),
/// or with `tree_nodes` a tree of at most that many nodes.
fn propose(
    draft: &mut dyn Draft,
    history: &[u32],
    want: usize,
    tree_nodes: Option<usize>,
) -> Result<Vec<TreeProposal>, ExecError> {
    Ok(match (want, tree_nodes) {
        (0, _) => Vec::new(),
        (_, None) => chain_tree(draft.propose(history, want)?),
        (_, Some(n)) => draft.propose_tree(history, n, want)?,
    })
}

/// A kept draft node: its token, its parent among the kept nodes (1-based: 0 is the batch's
/// first row), and its index among the proposals.
type KeptNode = (u32, Option<usize>, usize);

/// Keep a well-formed tree: a node whose token is out of range (the vocabulary has `vocab`),
/// or whose parent was dropped, or that is deeper than `want`, goes (with its subtree). Returns
/// the kept nodes and their depths.
fn prune_tree(drafts: &[TreeProposal], vocab: usize, want: usize) -> (Vec<KeptNode>, Vec<usize>) {
    let mut kept: Vec<Option<usize>> = Vec::with_capacity(drafts.len());
    let mut depth: Vec<usize> = Vec::with_capacity(drafts.len());
    let mut tree = Vec::with_capacity(drafts.len());
    for (i, d) in drafts.iter().enumerate() {
        let parent = match d.parent {
            None => Some(None),
            Some(p) if p < i => kept[p].map(Some),
            Some(_) => None,
        };
        let slot = parent.and_then(|parent| {
            let dp = parent.map_or(1, |p: usize| depth[p] + 1);
            ((d.token as usize) < vocab && dp <= want).then(|| {
                depth.push(dp);
                tree.push((d.token, parent.map(|p| p + 1), i));
                tree.len() - 1
            })
        });
        kept.push(slot);
    }
    (tree, depth)
}

/// Walk the verified batch from the root: the first child is judged; a rejection whose token is
/// another child moves to that child (its subtree is verified too), else it ends the pass.
/// Returns the accepted path (batch rows, the root first) and the token the pass emits after it.
fn walk(
    batch: &[u32],
    parents: &[Option<usize>],
    logits: &[f32],
    vocab: usize,
    (drafts, tree): (&[TreeProposal], &[KeptNode]),
    sampler: &mut Sampler,
    acceptance: &mut dyn Acceptance,
) -> Result<(Vec<usize>, u32), ExecError> {
    let mut path = vec![0usize];
    let next = loop {
        let at = *path.last().unwrap_or(&0);
        let children: Vec<usize> = (1..batch.len())
            .filter(|&j| parents[j] == Some(at))
            .collect();
        let row = &logits[at * vocab..][..vocab];
        let Some(&first) = children.first() else {
            break sampler.sample(row)?;
        };
        let p = sampler.distribution(row)?;
        let d = &drafts[tree[first - 1].2];
        match acceptance.judge(&p, &d.q, d.token, sampler) {
            None => path.push(first),
            Some(t) => match children[1..].iter().find(|&&c| batch[c] == t) {
                Some(&c) => path.push(c),
                None => break t,
            },
        }
    };
    Ok((path, next))
}

/// The adaptive draft length after a pass that accepted `accepted` of drafts `max_depth` deep:
/// doubled when every level was accepted, else halved (at least one more than accepted), at most
/// `draft_max`.
fn next_k(k: usize, accepted: usize, max_depth: usize, draft_max: usize) -> usize {
    if accepted == max_depth {
        (k * 2).min(draft_max)
    } else {
        (k / 2).max(accepted + 1).min(draft_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposed(h: &[u32], max: usize) -> Vec<u32> {
        LookupDraft::default()
            .propose(h, max)
            .unwrap()
            .into_iter()
            .map(|p| p.token)
            .collect()
    }

    #[test]
    fn lookup_drafts_the_most_frequent_follower_of_the_longest_match() {
        // "5 6" was followed by 7 twice and by 9 once (most recently): 7; then "6 7" → 8.
        assert_eq!(
            proposed(&[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 2, 5, 6], 2),
            [7, 8]
        );
        // A tie goes to the most recent follower.
        assert_eq!(proposed(&[1, 5, 6, 9, 2, 5, 6, 7, 3, 5, 6], 1), [7]);
        // A longer match beats a more frequent shorter one.
        assert_eq!(proposed(&[4, 5, 6, 1, 6, 2, 6, 2, 4, 5, 6], 1), [1]);
        // Nothing to match: nothing proposed.
        assert!(proposed(&[1, 2, 3], 4).is_empty());
        assert!(proposed(&[1, 2, 1], 0).is_empty());
        // Drafted tokens are looked up too: a cycle continues.
        assert_eq!(proposed(&[1, 2, 1], 4), [2, 1, 2, 1]);
    }

    #[test]
    fn lookup_reads_generated_tokens_and_keeps_earlier_sequences() {
        let mut d = LookupDraft::default();
        let first =
            |d: &mut LookupDraft, h: &[u32]| d.propose(h, 1).unwrap().first().map(|p| p.token);
        assert_eq!(first(&mut d, &[1, 2, 3]), None);
        // The history grows by generated tokens: "3" was followed by 4 since.
        assert_eq!(first(&mut d, &[1, 2, 3, 4, 3]), Some(4));
        // Another sequence: what the first one taught is still there ("2" → 3).
        assert_eq!(first(&mut d, &[9, 2]), Some(3));
    }

    #[test]
    fn lookup_tree_puts_the_chain_first_and_alternatives_as_siblings() {
        // "7" was followed by 8 twice and by 9 once; "8" by 1, "9" by 2.
        let h = [7, 8, 1, 7, 9, 2, 7, 8, 1, 5, 7];
        let mut d = LookupDraft::default();
        let chain: Vec<u32> = d.propose(&h, 2).unwrap().iter().map(|p| p.token).collect();
        assert_eq!(chain, [8, 1]);
        let tree = d.propose_tree(&h, 4, 2).unwrap();
        let nodes: Vec<(u32, Option<usize>)> = tree.iter().map(|n| (n.token, n.parent)).collect();
        // The chain 8 → 1 first (estimates 0.5, 0.5·0.75), then the branch 9 (0.25) and its
        // follower 2; every parent before its children.
        assert_eq!(nodes[0], (8, None));
        assert!(nodes.contains(&(1, Some(0))));
        assert!(nodes.contains(&(9, None)));
        assert!(nodes
            .iter()
            .enumerate()
            .all(|(i, n)| n.1.is_none_or(|p| p < i)));
        // Depth and node budgets hold.
        assert!(d
            .propose_tree(&h, 3, 1)
            .unwrap()
            .iter()
            .all(|n| n.parent.is_none()));
        assert_eq!(d.propose_tree(&h, 2, 4).unwrap().len(), 2);
    }

    #[test]
    fn standard_rule_is_greedy_for_point_masses() {
        let mut s = Sampler::greedy();
        let p = Distribution::point(3);
        let mut rule = StandardAcceptance;
        assert_eq!(rule.judge(&p, &Distribution::point(3), 3, &mut s), None);
        assert_eq!(rule.judge(&p, &Distribution::point(5), 5, &mut s), Some(3));
    }

    #[test]
    fn a_chain_is_judged_by_argmax_for_greedy() {
        // Vocabulary 4; rows: after `last` argmax 2, after 2 argmax 3, after 3 argmax 0.
        let rows = [[0., 0., 1., 0.], [0., 0., 0., 1.], [1., 0., 0., 0.]].concat();
        let drafts: Vec<Proposal> = [2u32, 1]
            .iter()
            .map(|&t| Proposal {
                token: t,
                q: Distribution::point(t),
            })
            .collect();
        let mut s = Sampler::greedy();
        let judged = judge_chain(0, &drafts, (&rows, 4), &mut s, &mut StandardAcceptance);
        // 2 accepted, 1 rejected: the verifier's own 3 follows.
        assert_eq!(judged.unwrap(), (1, 3));
        let all = [
            drafts[0].clone(),
            Proposal {
                token: 3,
                q: Distribution::point(3),
            },
        ];
        let judged = judge_chain(0, &all, (&rows, 4), &mut s, &mut StandardAcceptance);
        assert_eq!(judged.unwrap(), (2, 0));
        let bad = judge_chain(0, &all, (&rows[..8], 4), &mut s, &mut StandardAcceptance);
        assert!(matches!(bad, Err(ExecError::InvalidDraft { .. })));
    }

    #[test]
    fn zero_draft_max_is_an_error() {
        let o = SpeculativeOptions {
            draft_max: 0,
            adaptive: true,
            tree_nodes: None,
        };
        assert!(matches!(o.check(), Err(ExecError::InvalidDraft { .. })));
        let o = SpeculativeOptions {
            draft_max: 4,
            adaptive: true,
            tree_nodes: Some(0),
        };
        assert!(matches!(o.check(), Err(ExecError::InvalidDraft { .. })));
    }
}
