//! gemma3's bounded KV cache (docs/kv-cache.md, "Sliding-window layers"): the tiny model (window
//! 4, five local layers and one global) run far past its window gives, on every session path,
//! the logits of one batch over the whole sequence (a single pass drops nothing); its local
//! layers hold a bounded number of positions while the global one grows; and a prefix whose
//! window was dropped is refused by `fork`/`truncate`, never computed wrong.
use ork_exec::{
    generate, generate_speculative, BatchPart, CpuF32Linear, Draft, ExecError, GenerateOptions,
    KvType, Linear, Model, ModelDraft, Sampler, SamplerOptions, Session, SpeculativeOptions,
    StandardAcceptance,
};
use ork_gguf::GgufFile;
use std::sync::Arc;

/// Positions run: 40 windows of the tiny model, past its 64-token trained context (RoPE has no
/// limit; `Session::with_context` allows it).
const N: usize = 160;
const WINDOW: usize = 4;
/// Local layers of the tiny model.
const LOCAL: usize = 5;

struct Tiny {
    model: Arc<Model>,
    linear: Arc<dyn Linear>,
}

fn tiny() -> Tiny {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gemma3_tiny.gguf");
    let gguf = Arc::new(GgufFile::open(std::path::Path::new(path)).expect("tiny gemma3"));
    let model = Arc::new(Model::load(&gguf).expect("load gemma3"));
    let linear: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&gguf, model.matmul_weights()).expect("weights"));
    let g = model.config().gemma3.as_ref().expect("gemma3");
    assert_eq!(g.window, Some(WINDOW));
    assert_eq!(g.local.iter().filter(|&&l| l).count(), LOCAL);
    Tiny { model, linear }
}

impl Tiny {
    fn session(&self) -> Session {
        Session::with_context(Arc::clone(&self.model), Arc::clone(&self.linear), N + 8)
            .unwrap()
            .with_kv_type(KvType::F32)
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    /// KV bytes of one position in one layer.
    fn position_bytes(&self) -> usize {
        let c = self.model.config();
        c.n_head_kv * (c.head_dim_k + c.head_dim_v) * 4
    }
}

/// `n` tokens of a fixed pseudo-random sequence.
fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// The logits of every position of `tokens` from one batch: one pass, so every layer holds
/// every position while it runs (the unbounded cache's numbers).
fn reference(t: &Tiny, tokens: &[u32]) -> Vec<f32> {
    t.session().forward_all(tokens).unwrap()
}

/// The batch's rows and a pass's rows agree (1e-4, as the window test in gemma3.rs: a batch's
/// matmul may sum in another order than a row's). Reading one key too many or too few moves
/// them by far more (the tiny model without its window is 1.8 apart).
fn close(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}");
    let d = ours
        .iter()
        .zip(theirs)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(d < 1e-4, "{what}: {d}");
}

fn row(all: &[f32], at: usize, v: usize) -> &[f32] {
    &all[at * v..(at + 1) * v]
}

/// Decode `toks[range]` in `s` (which holds the positions before), each row against the batch's.
fn decodes_as(
    s: &mut Session,
    toks: &[u32],
    all: &[f32],
    range: std::ops::Range<usize>,
    what: &str,
) {
    let v = all.len() / toks.len();
    assert_eq!(s.position(), range.start, "{what}");
    for (at, &tok) in toks.iter().enumerate().take(range.end).skip(range.start) {
        let logits = s.decode(tok).unwrap();
        close(&logits, row(all, at, v), &format!("{what}: decode at {at}"));
    }
}

/// Decoding 160 tokens one by one gives the batch's logits at every position, while the local
/// layers hold at most window + 2·min(window, 64) − 2 positions and the global layer every one.
#[test]
fn a_bounded_cache_decodes_past_many_windows_as_one_batch() {
    let t = tiny();
    let v = t.vocab();
    let toks = tokens(N, v);
    let all = reference(&t, &toks);
    let mut s = t.session();
    let pb = t.position_bytes();
    let bound = WINDOW + 2 * WINDOW - 2;
    let mut dropped = false;
    for (i, &tok) in toks.iter().enumerate() {
        let logits = s.decode(tok).unwrap();
        close(&logits, row(&all, i, v), &format!("decode at {i}"));
        let len = i + 1;
        let local = (s.kv_bytes() - len * pb) / pb;
        assert!(
            local <= LOCAL * bound,
            "at {len}: local layers hold {local}"
        );
        assert!(local <= LOCAL * len);
        dropped |= local < LOCAL * len;
    }
    assert!(dropped, "the local layers never dropped a position");
    // The unbounded cache held 6 × 160 positions; this one the global layer's 160 and at most
    // 10 per local layer.
    assert!(s.kv_bytes() <= (N + LOCAL * bound) * pb);
    eprintln!(
        "after {N} tokens: {} bytes ({} unbounded); min_prefix {}",
        s.kv_bytes(),
        6 * N * pb,
        s.min_prefix()
    );
    assert!(s.min_prefix() > 0 && s.min_prefix() <= N - WINDOW);
}

/// Batches of every size (some longer than the window), and several sessions stepped together
/// (one decoding, one prefilling in chunks) give the whole batch's logits.
#[test]
fn batches_and_batched_steps_past_the_window_match_one_batch() {
    let t = tiny();
    let v = t.vocab();
    let toks = tokens(N, v);
    let all = reference(&t, &toks);
    let mut s = t.session();
    let (mut at, mut k) = (0, 0);
    while at < N {
        let n = [1, 3, 7, 2, 9, 1, 1, 5][k % 8].min(N - at);
        let rows = s.forward_all(&toks[at..at + n]).unwrap();
        close(&rows, &all[at * v..(at + n) * v], &format!("batch at {at}"));
        at += n;
        k += 1;
    }
    assert!(s.min_prefix() > 0);

    let (mut a, mut b) = (t.session(), t.session());
    let (mut pa, mut pb) = (0, 0);
    while pa < N || pb < N {
        let nb = 6.min(N - pb);
        let mut parts = Vec::new();
        if pa < N {
            parts.push(BatchPart {
                session: &mut a,
                tokens: &toks[pa..pa + 1],
                logits: ork_exec::Logits::Last,
                phase: ork_exec::Phase::Decode,
            });
        }
        if nb > 0 {
            parts.push(BatchPart {
                session: &mut b,
                tokens: &toks[pb..pb + nb],
                logits: ork_exec::Logits::Last,
                phase: ork_exec::Phase::Prefill,
            });
        }
        let out = Session::step(&mut parts).unwrap();
        let mut out = out.into_iter();
        if pa < N {
            let l = out.next().flatten().unwrap();
            close(&l, row(&all, pa, v), &format!("step, decode at {pa}"));
            pa += 1;
        }
        if nb > 0 {
            let l = out.next().flatten().unwrap();
            close(
                &l,
                row(&all, pb + nb - 1, v),
                &format!("step, chunk at {pb}"),
            );
            pb += nb;
        }
    }
    assert!(a.min_prefix() > 0 && b.min_prefix() > 0);
}

/// Speculative passes: a tree whose true branch is kept (`keep_branch`), and a chain of 7 rolled
/// back to 1..=7 positions (`truncate`, further back than the 4 positions kept beyond the window
/// at other times) — the logits of the kept positions are the batch's.
#[test]
fn tree_passes_and_rollbacks_past_the_window_match_one_batch() {
    let t = tiny();
    let v = t.vocab();
    let toks = tokens(N, v);
    let all = reference(&t, &toks);
    let wrong = |x: u32| (x + 1) % v as u32;
    let mut s = t.session();
    let mut k = 0;
    while s.position() + 8 <= N {
        let p = s.position();
        if k % 2 == 0 {
            // Node 0 = toks[p]; 1 = a wrong child; 2 = toks[p+1]; 3 = toks[p+2] under 2;
            // 4 = a wrong child of 2.
            let tree = [
                toks[p],
                wrong(toks[p + 1]),
                toks[p + 1],
                toks[p + 2],
                wrong(toks[p + 2]),
            ];
            let parents = [None, Some(0), Some(0), Some(2), Some(2)];
            let rows = s.forward_tree(&tree, &parents).unwrap();
            for (node, at) in [(0, p), (2, p + 1), (3, p + 2)] {
                close(
                    row(&rows, node, v),
                    row(&all, at, v),
                    &format!("tree node {node} at {p}"),
                );
            }
            let keep: &[usize] = [&[0][..], &[0, 2], &[0, 2, 3]][k / 2 % 3];
            s.keep_branch(p, keep).unwrap();
            assert_eq!(s.position(), p + keep.len());
        } else {
            let rows = s.forward_all(&toks[p..p + 7]).unwrap();
            close(&rows, &all[p * v..(p + 7) * v], &format!("chain at {p}"));
            let accepted = 1 + k / 2 % 7;
            s.truncate(p + accepted).unwrap();
        }
        k += 1;
    }
    assert!(s.min_prefix() > 0, "nothing was dropped");
    // The rest, decoded: still the batch's logits.
    let at = s.position();
    decodes_as(&mut s, &toks, &all, at..N, "after the passes");
}

/// After 100 tokens the local layers no longer hold the window of a short prefix: `fork` and
/// `truncate` to it are refused (the session unchanged), `keep_branch` before it too; from
/// `min_prefix()` on both work and continue with the batch's logits; a fork holds only the
/// window; 0 is always possible; a session shorter than the window forks anywhere.
#[test]
fn fork_and_truncate_keep_what_is_held_and_refuse_the_rest() {
    let t = tiny();
    let v = t.vocab();
    let toks = tokens(N, v);
    let all = reference(&t, &toks);
    let pb = t.position_bytes();
    let mut s = t.session();
    s.prefill(&toks[..100]).unwrap();
    // One pass drops nothing (it may be rolled back); the next drops what is no longer needed.
    assert_eq!(s.min_prefix(), 0);
    assert!(s.can_fork(1));
    s.decode(toks[100]).unwrap();
    let m = s.min_prefix();
    eprintln!("min_prefix after 101 positions: {m}");
    assert!(m > 0 && m <= 101 - WINDOW, "{m}");
    assert!(!s.can_fork(m - 1) && s.can_fork(m) && s.can_fork(0) && s.can_fork(500));
    let bytes = s.kv_bytes();
    match s.truncate(m - 1) {
        Err(ExecError::PrefixDropped { len, min, position }) => {
            assert_eq!((len, min, position), (m - 1, m, 101));
        }
        other => panic!("truncate below min_prefix: {other:?}"),
    }
    assert_eq!(
        (s.position(), s.kv_bytes()),
        (101, bytes),
        "a refused truncate changed it"
    );
    assert!(matches!(
        s.fork(m - 1),
        Err(ExecError::PrefixDropped { .. })
    ));
    assert!(matches!(s.fork(1), Err(ExecError::PrefixDropped { .. })));
    assert!(matches!(
        s.keep_branch(m - 1, &[0]),
        Err(ExecError::PrefixDropped { .. })
    ));
    assert_eq!(s.position(), 101);

    // A fork at min_prefix: the global layer's m positions and the window's 3 per local layer.
    let mut f = s.fork(m).unwrap();
    assert_eq!(f.position(), m);
    assert_eq!(f.kv_bytes(), (m + LOCAL * (WINDOW - 1)) * pb);
    assert_eq!(f.min_prefix(), m);
    decodes_as(&mut f, &toks, &all, m..m + 30, "fork at min_prefix");
    // Forked or truncated to any length from min_prefix: decoding goes on as the batch. (A
    // fork holds only its window: it cannot be cut back itself.)
    for len in [101, 100, m + 1, m] {
        let mut f = s.fork(len).unwrap();
        assert_eq!((f.position(), f.min_prefix()), (len, len));
        assert!(!f.can_fork(len - 1));
        let mut c = t.session();
        c.prefill(&toks[..100]).unwrap();
        c.decode(toks[100]).unwrap();
        assert_eq!(c.min_prefix(), m);
        c.truncate(len).unwrap();
        decodes_as(&mut f, &toks, &all, len..len + 10, &format!("fork({len})"));
        decodes_as(
            &mut c,
            &toks,
            &all,
            len..len + 10,
            &format!("truncate({len})"),
        );
    }
    // 0: always.
    let empty = s.fork(0).unwrap();
    assert_eq!(
        (empty.position(), empty.kv_bytes(), empty.min_prefix()),
        (0, 0, 0)
    );
    s.truncate(0).unwrap();
    assert_eq!((s.position(), s.kv_bytes(), s.min_prefix()), (0, 0, 0));
    close(
        &s.decode(toks[0]).unwrap(),
        row(&all, 0, v),
        "decode after truncate(0)",
    );

    // Shorter than the window: nothing is dropped, every prefix can be forked.
    let mut short = t.session();
    for &tok in &toks[..WINDOW - 1] {
        short.decode(tok).unwrap();
    }
    assert_eq!(short.min_prefix(), 0);
    assert!((0..WINDOW).all(|n| short.can_fork(n)));
    let mut f = short.fork(1).unwrap();
    close(&f.decode(toks[1]).unwrap(), row(&all, 1, v), "short fork");
}

/// A draft model whose session must be cut back further than its local layers keep (a
/// rejection at the first of 12 drafted tokens, 11 positions back) feeds the whole history again
/// and proposes what a fresh draft proposes; speculative decoding with that draft (the model's
/// own first two layers, both local) and 12 drafts a pass is plain greedy decoding.
#[test]
fn a_sliding_window_draft_cut_back_past_what_it_holds_starts_over() {
    let t = tiny();
    let v = t.vocab();
    let greedy = || Sampler::new(SamplerOptions::default()).unwrap();
    let draft_session = || {
        let model = Arc::new(t.model.truncated(2).unwrap());
        Session::with_context(model, Arc::clone(&t.linear), N + 8)
            .unwrap()
            .with_kv_type(KvType::F32)
    };
    let history = tokens(40, v);
    let mut draft = ModelDraft::new(draft_session(), greedy(), 0.0);
    let first = draft.propose(&history, 12).unwrap();
    assert_eq!(first.len(), 12);
    assert!(draft.session().min_prefix() > history.len());
    // The verifier rejects the first draft: the draft must go back to `history` + another token.
    let mut next = history.clone();
    next.push((first[0].token + 1) % v as u32);
    let again: Vec<u32> = draft
        .propose(&next, 12)
        .unwrap()
        .iter()
        .map(|p| p.token)
        .collect();
    let fresh: Vec<u32> = ModelDraft::new(draft_session(), greedy(), 0.0)
        .propose(&next, 12)
        .unwrap()
        .iter()
        .map(|p| p.token)
        .collect();
    assert_eq!(again, fresh);

    let prompt = tokens(7, v);
    let options = GenerateOptions {
        max_tokens: N - 10,
        stop_tokens: Vec::new(),
    };
    let plain = generate(&mut t.session(), &prompt, &options, &mut greedy(), |_| {
        Ok(())
    })
    .unwrap()
    .tokens;
    for tree_nodes in [None, Some(6)] {
        let mut draft = ModelDraft::new(draft_session(), greedy(), 0.0);
        let spec = SpeculativeOptions {
            draft_max: 12,
            adaptive: false,
            tree_nodes,
        };
        let got = generate_speculative(
            &mut t.session(),
            &mut draft,
            &prompt,
            &options,
            &spec,
            &mut greedy(),
            &mut StandardAcceptance,
            |_| Ok(()),
        )
        .unwrap();
        assert_eq!(got.generation.tokens, plain, "tree {tree_nodes:?}");
        eprintln!(
            "tree {tree_nodes:?}: {} drafted, {} accepted",
            got.stats.drafted, got.stats.accepted
        );
    }
}

/// A session's KV image (`Session::save_kv`, what `ork serve --prefix-cache-dir` keeps on disk)
/// loaded into a fresh session continues with the same logits bit for bit, f16 and f32, past
/// the window (the local layers have dropped positions); a short, foreign-typed or altered image
/// is an error naming it and leaves the session empty.
#[test]
fn a_saved_kv_image_continues_bit_for_bit_and_a_bad_one_is_refused() {
    let t = tiny();
    let seq = tokens(60, t.vocab());
    for kind in [KvType::F16, KvType::F32] {
        let mut a = t.session().with_kv_type(kind);
        for chunk in seq[..50].chunks(7) {
            a.prefill(chunk).unwrap();
        }
        assert!(a.min_prefix() > 0, "the local layers dropped positions");
        let image = a.save_kv();
        let mut b = t.session().with_kv_type(kind);
        b.load_kv(&image).unwrap();
        assert_eq!(b.position(), 50);
        assert_eq!(b.min_prefix(), a.min_prefix());
        assert_eq!(b.save_kv(), image, "{kind:?}: the image round-trips");
        for &tok in &seq[50..] {
            assert_eq!(a.decode(tok).unwrap(), b.decode(tok).unwrap(), "{kind:?}");
        }
        let other = match kind {
            KvType::F16 => KvType::F32,
            KvType::F32 => KvType::F16,
        };
        let mut bad = Vec::new();
        // Cut short, another cache type, one layer fewer, one byte too many.
        bad.push((image[..image.len() - 3].to_vec(), "cut short"));
        let mut fewer = image.clone();
        fewer[9..17].copy_from_slice(&5u64.to_le_bytes());
        bad.push((fewer, "5 layers"));
        let mut longer = image.clone();
        longer.push(0);
        bad.push((longer, "1 bytes after"));
        for (img, what) in bad {
            let mut s = t.session().with_kv_type(kind);
            match s.load_kv(&img) {
                Err(e @ ExecError::KvImage(_)) => {
                    assert!(e.to_string().contains(what), "{kind:?}: {e} lacks {what}")
                }
                r => panic!("{kind:?} {what}: {:?}", r.map(|_| ())),
            }
            assert_eq!(s.position(), 0, "{what}: the session is unchanged");
        }
        let mut s = t.session().with_kv_type(other);
        let e = s.load_kv(&image).unwrap_err();
        assert!(e.to_string().contains("cache"), "{e}");
    }
}
