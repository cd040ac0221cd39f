//! The planned schedule of speculative decoding as an event stream: a resident draft model
//! proposes `k` tokens (k decode passes of one row), then the verifier — resident or streamed —
//! runs one pass of `k + 1` rows: one weight pass serves every row. Each draft is accepted with
//! probability `acceptance`, left to right, from a fixed seed; a round yields the accepted drafts
//! and one more token (the correction or the bonus). `k = 0` without a draft is plain decode built
//! the same way, the baseline. The replay turns the stream into time (see
//! `docs/board-model.md`).
//!
//! The pieces are [`crate::schedule()`]'s own passes, spliced: each pass's context, attention and
//! output rows set for its place in the run, its loads re-anchored to the matmuls before it, the
//! draft's weights keyed as [`Model::Draft`]'s (its ids and the verifier's both start at 0). The
//! verifier's passes come from one schedule through one simulated weight cache, so a streamed
//! verifier loads (and creates buffers for) what ork's cache would.
//! A verifier pass's first loads (those the prefetcher may issue before its first matmul) may
//! start when the round's draft passes start: the prefetcher knows the verifier's weight order.

use crate::events::{Event, HostKind, Model, ModelWeight};
use crate::schedule::{schedule, schedule_passes, ModelShape, Plan};
use crate::BoardError;

/// A speculative run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecPlan {
    /// The verifier's plan (resident or streamed, slots, budget); its `gen_tokens` is the
    /// number of tokens to generate, its `prompt_tokens` the prompt.
    pub verifier: Plan,
    /// Drafts per round (0: plain decode, no draft passes).
    pub k: usize,
    /// Probability that a draft is accepted (0..=1), independently per draft.
    pub acceptance: f64,
    /// Seed of the acceptance draw.
    pub seed: u64,
}

/// The stream and what the replay needs beside it.
#[derive(Clone, Debug)]
pub struct SpecSchedule {
    /// The events.
    pub events: Vec<Event>,
    /// Tokens generated (the prefill's first one included).
    pub generated: usize,
    /// Verifier passes after the prefill.
    pub rounds: usize,
    /// Per pass, the passes it stands for: give them to [`crate::Timeline::weigh_passes`] after
    /// the replay (all 1 up to [`crate::DECODE_PASSES_REPLAYED`] rounds).
    pub pass_weights: Vec<f64>,
}

/// The event stream of decoding with `verifier` checking `draft`'s proposals (`draft` is
/// resident; `None`: drafts that cost no device time, as prompt lookup's host-side n-gram
/// match, or plain decode with `k = 0`). Rounds beyond [`crate::DECODE_PASSES_REPLAYED`] passes
/// are sampled ([`SpecSchedule::pass_weights`]): a plan's memory and replay time do not grow
/// with its token count or its draft length.
pub fn spec_schedule(
    verifier: &ModelShape,
    draft: Option<&ModelShape>,
    plan: &SpecPlan,
) -> Result<SpecSchedule, BoardError> {
    if !(0.0..=1.0).contains(&plan.acceptance) {
        return Err(BoardError::Stream(format!(
            "acceptance {} is not in 0..=1",
            plan.acceptance
        )));
    }
    let v = plan.verifier;
    let prompt = v.prompt_tokens;
    let mut out = Vec::new();
    // The draft's weights, loaded once before the prompt (resident).
    let draft_pass = match draft {
        Some(d) => Some((d, draft_loads(d, &v, &mut out)?)),
        None => None,
    };
    let (contexts, generated) = rounds(plan);
    let rounds = contexts.len();
    let (contexts, round_weights) =
        sample_rounds(&contexts, plan.k * usize::from(draft.is_some()) + 1);
    let mut chunks = verifier_chunks(verifier, &v, plan.k, &contexts)?.into_iter();
    // The prompt: the verifier's prefill, then the draft's.
    let prefill = chunks.next().unwrap_or_default();
    splice(
        &mut out,
        prefill,
        verifier,
        0,
        prompt,
        1,
        Model::Target,
        None,
    );
    let mut pass_weights = vec![1.0];
    if let Some((d, _)) = &draft_pass {
        let evs = schedule(d, &one_pass(prompt, true, &v))?;
        let evs = evs
            .into_iter()
            .filter(|e| !matches!(e, Event::Load { .. }))
            .collect();
        splice(&mut out, evs, d, 0, prompt, 1, Model::Draft, None);
        pass_weights.push(1.0);
    }
    for ((context, verify), w) in contexts.into_iter().zip(chunks).zip(round_weights) {
        let round_start = matmuls(&out);
        if let Some((d, pass)) = &draft_pass {
            for i in 0..plan.k {
                let pass = pass.clone();
                splice(&mut out, pass, d, context + i, 1, 1, Model::Draft, None);
                pass_weights.push(w);
            }
        }
        let rows = plan.k + 1;
        splice(
            &mut out,
            verify,
            verifier,
            context,
            rows,
            rows,
            Model::Target,
            Some(round_start),
        );
        pass_weights.push(w);
    }
    Ok(SpecSchedule {
        events: out,
        generated: generated.min(v.gen_tokens.max(1)),
        rounds,
        pass_weights,
    })
}

/// `p` for one pass of `tokens` rows, resident or not.
fn one_pass(tokens: usize, resident: bool, p: &Plan) -> Plan {
    Plan {
        resident,
        prompt_tokens: tokens,
        gen_tokens: 1,
        ..*p
    }
}

/// The draft's loads (once, before the prompt, into `out`) and one decode pass of it.
fn draft_loads(d: &ModelShape, v: &Plan, out: &mut Vec<Event>) -> Result<Vec<Event>, BoardError> {
    let evs = schedule(d, &one_pass(1, true, v))?;
    let (loads, pass): (Vec<_>, Vec<_>) = evs
        .into_iter()
        .partition(|e| matches!(e, Event::Load { .. }));
    out.extend(loads.into_iter().map(|l| of_model(l, Model::Draft)));
    Ok(pass)
}

/// The rounds: each drafts `k`, the verifier accepts some and adds one token. Each round's
/// context, and the tokens generated.
fn rounds(plan: &SpecPlan) -> (Vec<usize>, usize) {
    let (prompt, gen) = (plan.verifier.prompt_tokens, plan.verifier.gen_tokens.max(1));
    let mut rng = crate::moe::Rng(plan.seed);
    let mut generated = 1usize;
    let mut contexts = Vec::new();
    while generated < gen {
        contexts.push(prompt + generated - 1);
        let mut accepted = 0;
        while accepted < plan.k && rng.unit() < plan.acceptance {
            accepted += 1;
        }
        generated += accepted + 1;
    }
    (contexts, generated)
}

/// The rounds replayed and the rounds each stands for, a round being `passes` passes (`k` drafts
/// and the verifier's): every round while they make at most [`crate::DECODE_PASSES_REPLAYED`]
/// passes; beyond, that many passes' worth of runs of consecutive rounds, each replayed as its
/// middle round (as [`crate::sampled_passes`] samples decode passes).
fn sample_rounds(contexts: &[usize], passes: usize) -> (Vec<usize>, Vec<f64>) {
    let n = contexts.len();
    let runs = n.min((crate::DECODE_PASSES_REPLAYED / passes.max(1)).max(1));
    (0..runs)
        .map(|j| {
            let (start, end) = (j * n / runs, (j + 1) * n / runs);
            (
                contexts[start + (end - start - 1) / 2],
                (end - start) as f64,
            )
        })
        .unzip()
}

/// The verifier's passes (its prefill, then one of `k + 1` rows per round at `contexts`)
/// through one weight cache, cut at each pass, each with its loads' anchors made relative to
/// its start.
fn verifier_chunks(
    verifier: &ModelShape,
    v: &Plan,
    k: usize,
    contexts: &[usize],
) -> Result<Vec<Vec<Event>>, BoardError> {
    let mut passes = vec![(v.prompt_tokens, 0)];
    passes.extend(contexts.iter().map(|&c| (k + 1, c)));
    let mut chunks: Vec<Vec<Event>> = Vec::new();
    let mut base = 0u64;
    let (mut seen, mut first_pass) = (0u64, true);
    for e in schedule_passes(verifier, v, &passes)? {
        match e {
            Event::Pass { .. } if !first_pass => {
                base = seen;
                chunks.push(vec![e]);
                continue;
            }
            Event::Pass { .. } => first_pass = false,
            Event::Matmul { .. } => seen += 1,
            _ => {}
        }
        let mut e = e;
        if let Event::Load { after, .. } = &mut e {
            *after = after.saturating_sub(base);
        }
        match chunks.last_mut() {
            Some(c) => c.push(e),
            None => chunks.push(vec![e]),
        }
    }
    Ok(chunks)
}

fn matmuls(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| matches!(e, Event::Matmul { .. }))
        .count() as u64
}

/// `e` with its weight (if any) keyed as `model`'s.
fn of_model(mut e: Event, model: Model) -> Event {
    if let Event::Load { weight, .. } | Event::Matmul { weight, .. } = &mut e {
        *weight = ModelWeight { model, ..*weight };
    }
    e
}

/// Append one pass of `shape` (`events`, as [`schedule()`] made it at context 0) at `context`
/// with `rows` rows, the output projection and sampling over `out_rows` rows, its weights keyed
/// as `model`'s. Loads are re-anchored after the matmuls already in `out`; loads anchored at
/// the pass's start may start at matmul `early` instead, if given.
#[allow(clippy::too_many_arguments)]
fn splice(
    out: &mut Vec<Event>,
    events: Vec<Event>,
    shape: &ModelShape,
    context: usize,
    rows: usize,
    out_rows: usize,
    model: Model,
    early: Option<u64>,
) {
    let before = matmuls(out);
    // Attention comes once per block, in block order.
    let mut block = 0;
    for mut e in events {
        match &mut e {
            Event::Pass { context: c, .. } => *c = context,
            Event::Host {
                kind: HostKind::Attention,
                ..
            } => {
                let window = shape.windows.get(block).copied().flatten();
                block += 1;
                e = HostKind::attention(
                    rows,
                    context,
                    window,
                    shape.n_head,
                    shape.n_head_kv,
                    shape.head_dim,
                    2,
                )
            }
            Event::Host {
                kind: HostKind::Sample,
                ..
            } => e = HostKind::sample(out_rows, shape.vocab),
            Event::Matmul { weight, m, .. } if weight.id == shape.output.id => *m = out_rows,
            Event::Load { after, .. } => {
                *after = match (*after, early) {
                    (0, Some(s)) => s,
                    (a, _) => a + before,
                };
            }
            _ => {}
        }
        out.push(of_model(e, model));
    }
}
