//! Continuous batching: one thread owns every running sequence and steps them together.
//!
//! Between two steps the scheduler retires finished and abandoned sequences and admits queued
//! requests into the free slots (at most `max_seqs`); each step then runs one forward pass for
//! all of them ([`Session::step`]): a decode token for every sequence past its prompt, plus at
//! most one chunk of one prompt still being prefilled, so a new request delays the others by one
//! chunk at most. Each sequence samples from its own logits with its own [`Sampler`].
//!
//! With speculation on ([`SchedulerConfig::draft_max`]), a greedy sequence past its prompt
//! drafts its next tokens by prompt lookup ([`LookupDraft`], no draft model) and, when it has
//! drafts, its part of the step is a verification instead of a decode token: its last token and
//! the drafts in one pass on the prefill engine ([`Phase::Prefill`]) with the logits of every
//! position. The drafts are judged as `ork run --draft` judges them ([`judge_chain`]: greedy,
//! the accepted prefix is what argmax confirms), the accepted ones and the verifier's next token
//! are emitted one by one as sampled tokens are (stops, stop sequences, `max_tokens`), and the
//! cache is cut back past the rejected drafts ([`Session::truncate`]). Sequences without drafts
//! decode in the same step.
use crate::metrics::Metrics;
use crate::prefix::PrefixCache;
pub use crate::saver::Persist;
use crate::saver::Saver;
use crossbeam_channel::{Receiver, TryRecvError};
use ork_exec::{
    judge_chain, BatchPart, Draft, Logits, LookupDraft, Phase, Proposal, Sampler, SamplerOptions,
    Session, StandardAcceptance, TextStream, Tokenizer,
};
use ork_runtime::Engine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Why a sequence stopped, as OpenAI's `finish_reason` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// `max_tokens` were generated.
    Length,
}

impl Finish {
    /// OpenAI's string.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the scheduler tells a request's handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// More text (never empty).
    Text(String),
    /// The log probability of a generated token (sent before the token's text, which may be
    /// held back), when the request asked for them.
    Logprob(TokenLogprob),
    /// The end: why, and the token counts.
    Done {
        /// Why it stopped.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Prompt tokens whose keys and values came from a cached prefix (not run again).
        cached_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The engine failed or the server stopped before the end.
    Failed(String),
}

/// A generated token's log probability and its most likely alternatives, from the logits the
/// sampler saw (log-softmax at temperature 1, before top-p: the model's distribution).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's bytes (special tokens as their text).
    pub bytes: Vec<u8>,
    /// Its natural log probability.
    pub logprob: f32,
    /// The most likely tokens, best first: bytes and log probability.
    pub top: Vec<(Vec<u8>, f32)>,
}

impl TokenLogprob {
    /// `token`'s entry from `logits`, with `top` alternatives (the scores of a whole vocabulary).
    pub fn new(logits: &[f32], token: u32, top: usize, tokenizer: &Tokenizer) -> TokenLogprob {
        let max = logits
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .map(|&x| (f64::from(x) - f64::from(max)).exp())
            .sum();
        let lse = f64::from(max) + sum.ln();
        let lp = |x: f32| (f64::from(x) - lse) as f32;
        let bytes = |t: u32| tokenizer.token_bytes(t, true).unwrap_or_default().to_vec();
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        let top = top.min(ids.len());
        let by_score = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if top > 0 && top < ids.len() {
            ids.select_nth_unstable_by(top - 1, by_score);
        }
        ids.truncate(top);
        ids.sort_by(by_score);
        TokenLogprob {
            bytes: bytes(token),
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&x| lp(x)),
            top: ids
                .into_iter()
                .map(|t| (bytes(t), lp(logits[t as usize])))
                .collect(),
        }
    }
}

/// A request ready to run: a tokenized prompt that fits the context with its `max_tokens`.
pub struct Job {
    /// Prompt tokens (non-empty).
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens (prompt + this fits the context).
    pub max_tokens: usize,
    /// Sampling.
    pub sampler: SamplerOptions,
    /// Stop sequences (non-empty).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Send each generated token's log probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// Control tokens whose text the reply shows (a tool-call format's markers, such as
    /// Llama 3's `<|python_tag|>`); other control tokens render as nothing.
    pub shown: Vec<u32>,
    /// Tokens generated in place of the sampled ones, first to last (the test hook of
    /// `Server::start_scripted`; empty in service).
    pub forced: Vec<u32>,
    /// Where the events go; a closed channel (the client went away) retires the sequence.
    pub events: UnboundedSender<Event>,
}

/// The scheduler's settings.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequence slots.
    pub max_seqs: usize,
    /// Context of each sequence.
    pub context: usize,
    /// Prompt tokens per step at most.
    pub prefill_chunk: usize,
    /// Bytes of finished sequences' KV caches kept for prefix reuse (0: none).
    pub prefix_cache_bytes: usize,
    /// Where the prefix cache is read from at start and written to at the end (`None`: it
    /// lives only as long as the process).
    pub persist: Option<Persist>,
    /// Speculation: greedy requests without log probabilities verify up to this many
    /// prompt-lookup drafts per step on the prefill engine (`None`: no speculation).
    pub draft_max: Option<usize>,
}

/// One running sequence.
struct Slot<'t> {
    job: Job,
    session: Session,
    sampler: Sampler,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// Prompt tokens that came with a cached prefix.
    cached: usize,
    /// Generated tokens (the last one is the next step's input).
    generated: Vec<u32>,
    text: TextStream<'t>,
    /// Text generated so far, and how many bytes of it were sent.
    out: String,
    sent: usize,
    started: Instant,
    first_token: bool,
    /// Its prompt-lookup draft, when it speculates.
    draft: Option<LookupDraft>,
}

impl Slot<'_> {
    fn prefilling(&self) -> bool {
        self.fed < self.job.prompt.len()
    }

    /// Prompt-lookup drafts to verify this step, at most `draft_max`: none when the sequence
    /// does not speculate, has forced tokens left, or has room for one more token only (a pass
    /// emits the accepted drafts and one token more).
    fn drafts(&mut self, draft_max: usize) -> Vec<Proposal> {
        if self.draft.is_none() || self.job.forced.len() > self.generated.len() {
            return Vec::new();
        }
        let room = self
            .session
            .context()
            .saturating_sub(self.session.position() + 1);
        let want = draft_max
            .min(self.job.max_tokens.saturating_sub(self.generated.len() + 1))
            .min(room);
        if want == 0 {
            return Vec::new();
        }
        let history = self.tokens();
        let vocab = self.session.model().config().vocab_size;
        let Some(draft) = self.draft.as_mut() else {
            return Vec::new();
        };
        // Prompt lookup cannot fail; its tokens come from the history (in the vocabulary).
        let mut drafts = draft.propose(&history, want).unwrap_or_default();
        let valid = drafts
            .iter()
            .take_while(|p| (p.token as usize) < vocab)
            .count();
        drafts.truncate(valid);
        drafts
    }

    /// The tokens this sequence ran (its cache holds the first `session.position()`).
    fn tokens(&self) -> Vec<u32> {
        let mut t = Vec::with_capacity(self.job.prompt.len() + self.generated.len());
        t.extend_from_slice(&self.job.prompt);
        t.extend_from_slice(&self.generated);
        t
    }

    /// Send `out[sent..upto]` if non-empty; false if the client is gone.
    fn send_upto(&mut self, upto: usize) -> bool {
        if upto > self.sent {
            let piece = self.out[self.sent..upto].to_owned();
            self.sent = upto;
            return self.job.events.send(Event::Text(piece)).is_ok();
        }
        true
    }

    /// Send the rest of the text (with the bytes the text stream holds back unless
    /// `cut`, the text having been cut at a stop sequence) and the end.
    fn finish(&mut self, finish: Finish, cut: bool, metrics: &Metrics) {
        let tail = self.text.finish();
        if !cut {
            self.out.push_str(&tail);
        }
        let end = self.out.len();
        self.send_upto(end);
        let done = Event::Done {
            finish,
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.cached,
            completion_tokens: self.generated.len(),
        };
        // Counted before sending, so a client that has its answer finds it in /metrics.
        metrics.completed.fetch_add(1, Ordering::Relaxed);
        if self.job.events.send(done).is_err() {
            metrics.completed.fetch_sub(1, Ordering::Relaxed);
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bytes at the end of `text` that could be the start of a stop sequence (held back).
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for k in (1..s.len()).rev() {
            if k <= hold {
                break;
            }
            if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                hold = k;
                break;
            }
        }
    }
    hold
}

/// Run the scheduler until the queue is closed and every sequence is done; once `abort` is set,
/// every running and queued request ends with [`Event::Failed`] (the end of a bounded drain).
/// `prefixes` is the prefix cache it starts with ([`crate::saver::load_prefixes`]); with
/// `config.persist` it is written while the server runs and after the last request
/// ([`Saver`]; a file that cannot be written is a warning on stderr, never a failure).
pub fn run(
    engine: Arc<Engine>,
    config: SchedulerConfig,
    queue: Receiver<Job>,
    metrics: Arc<Metrics>,
    abort: Arc<AtomicBool>,
    mut prefixes: PrefixCache,
) {
    let mut saver = config.persist.as_ref().map(|p| Saver::new(p, &prefixes));
    serve(
        &engine,
        &config,
        &queue,
        &metrics,
        &abort,
        &mut prefixes,
        saver.as_mut(),
    );
    if let Some(saver) = saver {
        saver.finish(&prefixes);
    }
}

/// The scheduler's loop (see [`run`]).
fn serve(
    engine: &Engine,
    config: &SchedulerConfig,
    queue: &Receiver<Job>,
    metrics: &Metrics,
    abort: &AtomicBool,
    prefixes: &mut PrefixCache,
    mut saver: Option<&mut Saver<'_>>,
) {
    let tokenizer: Arc<Tokenizer> = Arc::clone(engine.tokenizer());
    let mut slots: Vec<Slot<'_>> = Vec::with_capacity(config.max_seqs);
    let mut closed = false;
    loop {
        // Retire sequences whose client went away: their slot is free for this step.
        let keep: Vec<bool> = slots
            .iter()
            .map(|s| {
                let gone = s.job.events.is_closed();
                if gone {
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                !gone
            })
            .collect();
        retire(&mut slots, &keep, prefixes, metrics);
        metrics.active.store(slots.len() as u64, Ordering::Relaxed);
        if abort.load(Ordering::Relaxed) {
            fail_all(&mut slots, queue, metrics);
            return;
        }
        // Admit queued requests into free slots.
        while !closed && slots.len() < config.max_seqs {
            let job = match next_job(queue, slots.is_empty()) {
                Next::Job(job) => job,
                Next::None => break,
                Next::Closed => {
                    closed = true;
                    break;
                }
            };
            if let Some(slot) = start_slot(engine, config, job, prefixes, metrics, &tokenizer) {
                slots.push(slot);
            }
        }
        metrics
            .queue_depth
            .store(queue.len() as u64, Ordering::Relaxed);
        metrics.active.store(slots.len() as u64, Ordering::Relaxed);
        if slots.is_empty() {
            if closed {
                return;
            }
            if let Some(saver) = saver.as_deref_mut() {
                saver.tick(prefixes);
            }
            continue;
        }
        step(&mut slots, config, &tokenizer, metrics, prefixes);
        if let Some(saver) = saver.as_deref_mut() {
            saver.tick(prefixes);
        }
    }
}

/// The server aborts: every running and queued request fails, and nothing more is accepted
/// (it drains first).
fn fail_all(slots: &mut Vec<Slot<'_>>, queue: &Receiver<Job>, metrics: &Metrics) {
    for s in slots.drain(..) {
        let _ = s
            .job
            .events
            .send(Event::Failed("the server is shutting down".to_owned()));
        metrics.failed.fetch_add(1, Ordering::Relaxed);
    }
    while let Ok(job) = queue.try_recv() {
        let _ = job
            .events
            .send(Event::Failed("the server is shutting down".to_owned()));
        metrics.failed.fetch_add(1, Ordering::Relaxed);
    }
    metrics.active.store(0, Ordering::Relaxed);
    metrics.queue_depth.store(0, Ordering::Relaxed);
}

/// What the queue gave.
enum Next {
    Job(Job),
    /// Nothing now.
    None,
    /// Every sender is gone.
    Closed,
}

/// The next queued job: waiting up to 50 ms when no sequence runs (`idle`), else not at all.
fn next_job(queue: &Receiver<Job>, idle: bool) -> Next {
    if idle {
        match queue.recv_timeout(Duration::from_millis(50)) {
            Ok(job) => Next::Job(job),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Next::None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Next::Closed,
        }
    } else {
        match queue.try_recv() {
            Ok(job) => Next::Job(job),
            Err(TryRecvError::Empty) => Next::None,
            Err(TryRecvError::Disconnected) => Next::Closed,
        }
    }
}

/// A slot for `job`: a session (the longest cached prefix of its prompt when there is one, so
/// only the rest is prefilled) and its sampler. `None` when the client went away or the session
/// or sampler cannot be made (the job is told why).
fn start_slot<'t>(
    engine: &Engine,
    config: &SchedulerConfig,
    job: Job,
    prefixes: &mut PrefixCache,
    metrics: &Metrics,
    tokenizer: &'t Tokenizer,
) -> Option<Slot<'t>> {
    if job.events.is_closed() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let fresh = match engine.session_with_context(config.context) {
        Ok(s) => s,
        Err(e) => {
            let _ = job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    let sampler = match Sampler::new(job.sampler.clone()) {
        Ok(s) => s,
        Err(e) => {
            let _ = job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    // Greedy requests without log probabilities speculate (the verifier's logits are the
    // prefill engine's, and a sampled request's random stream would be drawn differently).
    let draft = config
        .draft_max
        .filter(|_| job.sampler.temperature == 0.0 && job.logprobs.is_none())
        .map(|_| LookupDraft::default());
    let (session, cached) = match prefixes.take(&job.prompt, &fresh) {
        Some((session, len)) => (session, len),
        None => (fresh, 0),
    };
    metrics
        .prefix_cache_bytes
        .store(prefixes.bytes() as u64, Ordering::Relaxed);
    metrics
        .cached_tokens
        .fetch_add(cached as u64, Ordering::Relaxed);
    Some(Slot {
        job,
        session,
        sampler,
        fed: cached,
        cached,
        generated: Vec::new(),
        text: TextStream::new(tokenizer, false),
        out: String::new(),
        sent: 0,
        started: Instant::now(),
        first_token: false,
        draft,
    })
}

/// Remove the slots `keep` says no to; their sessions become reusable prefixes.
fn retire(slots: &mut Vec<Slot<'_>>, keep: &[bool], prefixes: &mut PrefixCache, metrics: &Metrics) {
    if keep.iter().all(|&k| k) {
        return;
    }
    for (s, &k) in std::mem::take(slots).into_iter().zip(keep) {
        if k {
            slots.push(s);
        } else {
            let tokens = s.tokens();
            prefixes.insert(tokens, s.session);
        }
    }
    metrics
        .prefix_cache_bytes
        .store(prefixes.bytes() as u64, Ordering::Relaxed);
}

/// One slot's share of a step.
struct Input {
    tokens: Vec<u32>,
    logits: Logits,
    phase: Phase,
    /// The drafts it verifies (`tokens` is then the last token and these); empty for a prompt
    /// chunk or a plain decode step.
    drafts: Vec<Proposal>,
}

/// One batched step over `slots`, then sampling, stop checks and retirement.
fn step(
    slots: &mut Vec<Slot<'_>>,
    config: &SchedulerConfig,
    tokenizer: &Tokenizer,
    metrics: &Metrics,
    prefixes: &mut PrefixCache,
) {
    let inputs = step_inputs(slots, config);
    let t0 = Instant::now();
    let result = {
        let mut parts: Vec<BatchPart<'_, '_>> = slots
            .iter_mut()
            .zip(&inputs)
            .filter_map(|(s, input)| {
                input.as_ref().map(|i| BatchPart {
                    session: &mut s.session,
                    tokens: &i.tokens,
                    logits: i.logits,
                    phase: i.phase,
                })
            })
            .collect();
        Session::step(&mut parts)
    };
    let elapsed = t0.elapsed();
    let logits = match result {
        Ok(l) => l,
        Err(e) => {
            // The engine failed: every sequence of the step ends with the error.
            let msg = format!("the engine failed: {e}");
            for (s, input) in slots.iter().zip(&inputs) {
                if input.is_some() {
                    let _ = s.job.events.send(Event::Failed(msg.clone()));
                    metrics.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut i = 0;
            slots.retain(|_| {
                i += 1;
                inputs[i - 1].is_none()
            });
            return;
        }
    };
    let mut logits = logits.into_iter();
    let mut decoded = 0u64;
    let mut keep = Vec::with_capacity(slots.len());
    for (s, input) in slots.iter_mut().zip(&inputs) {
        let Some(input) = input else {
            keep.push(true);
            continue;
        };
        let l = logits.next().flatten();
        if s.prefilling() {
            s.fed += input.tokens.len();
            metrics
                .prompt_tokens
                .fetch_add(input.tokens.len() as u64, Ordering::Relaxed);
        } else if input.drafts.is_empty() {
            decoded += 1;
        }
        let Some(l) = l else {
            keep.push(true);
            continue;
        };
        if input.drafts.is_empty() {
            keep.push(sample_one(s, &l, tokenizer, metrics));
        } else {
            let (alive, emitted) = accept_drafts(s, &input.drafts, &l, tokenizer, metrics);
            decoded += emitted;
            keep.push(alive);
        }
    }
    metrics.record_step(decoded, elapsed);
    retire(slots, &keep, prefixes, metrics);
    metrics.active.store(slots.len() as u64, Ordering::Relaxed);
}

/// The step's inputs: every decoding sequence's last token (and its drafts, verified on the
/// prefill engine, when it has some), and one chunk of the first prefilling one; each says its
/// phase, which picks its engine when prefill and decode run on different ones
/// (`ork_exec::Session::step`).
fn step_inputs(slots: &mut [Slot<'_>], config: &SchedulerConfig) -> Vec<Option<Input>> {
    let mut inputs = Vec::with_capacity(slots.len());
    let mut prefill_left = config.prefill_chunk;
    for s in slots.iter_mut() {
        if s.prefilling() {
            if prefill_left == 0 {
                inputs.push(None);
                continue;
            }
            let end = (s.fed + prefill_left).min(s.job.prompt.len());
            prefill_left -= end - s.fed;
            inputs.push(Some(Input {
                tokens: s.job.prompt[s.fed..end].to_vec(),
                logits: if end == s.job.prompt.len() {
                    Logits::Last
                } else {
                    Logits::None
                },
                phase: Phase::Prefill,
                drafts: Vec::new(),
            }));
            continue;
        }
        let last = *s.generated.last().expect("a decoding sequence has a token");
        let drafts = config.draft_max.map_or_else(Vec::new, |k| s.drafts(k));
        inputs.push(Some(if drafts.is_empty() {
            Input {
                tokens: vec![last],
                logits: Logits::Last,
                phase: Phase::Decode,
                drafts,
            }
        } else {
            Input {
                tokens: std::iter::once(last)
                    .chain(drafts.iter().map(|p| p.token))
                    .collect(),
                logits: Logits::All,
                phase: Phase::Prefill,
                drafts,
            }
        }));
    }
    inputs
}

/// Judge the drafts `s` verified from `logits` (every row's: its last token's, then each
/// draft's), emit the accepted drafts and the verifier's next token as sampled tokens are
/// emitted, and roll the cache back past the rejected drafts. Returns whether `s` goes on, and
/// how many tokens it emitted.
fn accept_drafts(
    s: &mut Slot<'_>,
    drafts: &[Proposal],
    logits: &[f32],
    tokenizer: &Tokenizer,
    metrics: &Metrics,
) -> (bool, u64) {
    let vocab = s.session.model().config().vocab_size;
    let last = *s.generated.last().expect("a decoding sequence has a token");
    // The cache before the pass, which appended the last token and the drafts.
    let base = s.session.position() - (drafts.len() + 1);
    let judged = judge_chain(
        last,
        drafts,
        (logits, vocab),
        &mut s.sampler,
        &mut StandardAcceptance,
    );
    let (accepted, next) = match judged {
        Ok(j) => j,
        Err(e) => {
            let _ = s.job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            return (false, 0);
        }
    };
    metrics.record_verification(drafts.len() as u64, accepted as u64);
    let mut alive = true;
    let mut emitted = 0;
    for (j, t) in drafts[..accepted]
        .iter()
        .map(|p| p.token)
        .chain([next])
        .enumerate()
    {
        emitted += 1;
        if !emit(s, t, &logits[j * vocab..][..vocab], tokenizer, metrics) {
            alive = false;
            break;
        }
    }
    // The cache keeps the last token and the accepted drafts, but no token the sequence did not
    // take (it stopped inside the drafts); cutting back into the last pass always works.
    let keep = (base + 1 + accepted).min(s.job.prompt.len() + s.generated.len());
    if let Err(e) = s.session.truncate(keep) {
        if alive {
            let _ = s.job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
        return (false, emitted);
    }
    (alive, emitted)
}

/// Sample the next token of `s` from `logits` and emit it; false when `s` is finished.
fn sample_one(s: &mut Slot<'_>, logits: &[f32], tokenizer: &Tokenizer, metrics: &Metrics) -> bool {
    let sampled = match s.job.forced.get(s.generated.len()) {
        Some(&t) => Ok(t),
        None => s.sampler.sample(logits),
    };
    match sampled {
        Ok(token) => emit(s, token, logits, tokenizer, metrics),
        Err(e) => {
            let _ = s.job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// `token` is the next token of `s` (`logits` the scores it was chosen from): check for the end
/// of generation, send its log probability and text, check stop sequences and `max_tokens`;
/// false when `s` is finished.
fn emit(
    s: &mut Slot<'_>,
    token: u32,
    logits: &[f32],
    tokenizer: &Tokenizer,
    metrics: &Metrics,
) -> bool {
    if !s.first_token {
        s.first_token = true;
        metrics.record_ttft(s.started.elapsed());
    }
    if tokenizer.is_end_of_generation(token) && !s.job.ignore_eos {
        s.finish(Finish::Stop, false, metrics);
        return false;
    }
    if let Some(top) = s.job.logprobs {
        let lp = TokenLogprob::new(logits, token, top, tokenizer);
        if s.job.events.send(Event::Logprob(lp)).is_err() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    s.generated.push(token);
    metrics.completion_tokens.fetch_add(1, Ordering::Relaxed);
    let piece = match s.text.push(token) {
        Ok(mut p) => {
            if s.job.shown.contains(&token) {
                let shown = tokenizer.token_bytes(token, true).unwrap_or_default();
                p.push_str(&String::from_utf8_lossy(shown));
            }
            p
        }
        Err(e) => {
            let _ = s.job.events.send(Event::Failed(e.to_string()));
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    };
    let from = s.out.len();
    s.out.push_str(&piece);
    if !s.job.stop.is_empty() {
        // A stop sequence may begin in text already held back.
        let longest = s.job.stop.iter().map(String::len).max().unwrap_or(0);
        let mut search = from.saturating_sub(longest);
        while !s.out.is_char_boundary(search) {
            search -= 1;
        }
        let hit = s
            .job
            .stop
            .iter()
            .filter_map(|stop| s.out[search..].find(stop.as_str()).map(|p| search + p))
            .min();
        if let Some(at) = hit {
            s.out.truncate(at);
            s.finish(Finish::Stop, true, metrics);
            return false;
        }
    }
    if s.generated.len() >= s.job.max_tokens {
        s.finish(Finish::Length, false, metrics);
        return false;
    }
    let safe = s.out.len() - held_back(&s.out, &s.job.stop);
    if !s.send_upto(safe) {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn only_a_possible_stop_prefix_is_held_back() {
        let stops = vec!["\n\n".to_owned(), "END".to_owned()];
        assert_eq!(held_back("hello", &stops), 0);
        assert_eq!(held_back("hello\n", &stops), 1);
        assert_eq!(held_back("hello EN", &stops), 2);
        assert_eq!(held_back("hello E", &stops), 1);
        assert_eq!(held_back("héé", &["éx".to_owned()]), 2);
        assert_eq!(held_back("hé", &["xé".to_owned()]), 0);
    }
}
