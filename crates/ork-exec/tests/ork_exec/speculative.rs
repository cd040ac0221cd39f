//! Speculative decoding on tiny random-weight models: greedy output identical to plain greedy
//! decoding for every draft kind and draft length, and the sampled output distributed as plain
//! sampling (a chi-square test that a wrong acceptance rule fails).
use super::fixtures::{build, TinySpec};
use ork_exec::{
    generate, generate_speculative, Acceptance, CpuF32Linear, Distribution, Draft, ExecError,
    GenerateOptions, Linear, LookupDraft, Model, ModelDraft, Sampler, SamplerOptions, Session,
    SpeculativeOptions, StandardAcceptance, TreeProposal,
};
use std::sync::Arc;

struct Tiny {
    model: Arc<Model>,
    linear: Arc<dyn Linear>,
}

fn tiny(seed: u64, n_layer: usize) -> Tiny {
    let mut spec = TinySpec::new("llama");
    spec.seed = seed;
    spec.n_layer = n_layer;
    spec.context = 96;
    let g = build(&spec);
    let model = Arc::new(Model::load(&g).unwrap());
    let linear: Arc<dyn Linear> =
        Arc::new(CpuF32Linear::from_gguf(&g, model.matmul_weights()).unwrap());
    Tiny { model, linear }
}

impl Tiny {
    fn session(&self) -> Session {
        Session::new(Arc::clone(&self.model), Arc::clone(&self.linear))
    }
}

fn options(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
    }
}

fn plain(t: &Tiny, prompt: &[u32], n: usize, sampler: &mut Sampler) -> Vec<u32> {
    generate(&mut t.session(), prompt, &options(n), sampler, |_| Ok(()))
        .unwrap()
        .tokens
}

#[allow(clippy::too_many_arguments)]
fn speculative(
    t: &Tiny,
    draft: &mut dyn Draft,
    prompt: &[u32],
    n: usize,
    k: usize,
    adaptive: bool,
    tree_nodes: Option<usize>,
    sampler: &mut Sampler,
    rule: &mut dyn Acceptance,
) -> ork_exec::SpeculativeGeneration {
    let spec = SpeculativeOptions {
        draft_max: k,
        adaptive,
        tree_nodes,
    };
    generate_speculative(
        &mut t.session(),
        draft,
        prompt,
        &options(n),
        &spec,
        sampler,
        rule,
        |_| Ok(()),
    )
    .unwrap()
}

const PROMPTS: [&[u32]; 3] = [&[3, 17, 5], &[1, 2, 3, 1, 2, 3, 1, 2], &[9]];

#[test]
fn greedy_speculative_output_is_plain_greedy_for_every_draft_and_k() {
    let verifier = tiny(11, 3);
    let other = tiny(12, 1);
    for prompt in PROMPTS {
        let want = plain(&verifier, prompt, 40, &mut Sampler::greedy());
        for k in [1, 3, 8] {
            for (adaptive, tree) in [
                (false, None),
                (true, None),
                (true, Some(9)),
                (false, Some(4)),
            ] {
                let drafts: Vec<(&str, Box<dyn Draft>)> = vec![
                    ("lookup", Box::new(LookupDraft::default())),
                    (
                        "other model",
                        Box::new(ModelDraft::new(other.session(), Sampler::greedy(), 0.0)),
                    ),
                    (
                        "self, 1 layer",
                        Box::new(ModelDraft::new(
                            Session::new(
                                Arc::new(verifier.model.truncated(1).unwrap()),
                                Arc::clone(&verifier.linear),
                            ),
                            Sampler::greedy(),
                            0.0,
                        )),
                    ),
                    (
                        "verifier itself",
                        Box::new(ModelDraft::new(verifier.session(), Sampler::greedy(), 0.0)),
                    ),
                ];
                for (name, mut d) in drafts {
                    let got = speculative(
                        &verifier,
                        d.as_mut(),
                        prompt,
                        40,
                        k,
                        adaptive,
                        tree,
                        &mut Sampler::greedy(),
                        &mut StandardAcceptance,
                    );
                    assert_eq!(
                        got.generation.tokens, want,
                        "{name}, k {k}, adaptive {adaptive}, tree {tree:?}, prompt {prompt:?}"
                    );
                    if name == "verifier itself" {
                        // Its own drafts are always right: every pass but the last is full.
                        assert_eq!(got.stats.accepted, got.stats.drafted, "{name}");
                        if tree.is_none() {
                            assert!(got.stats.passes <= 40usize.div_ceil(k + 1) + 1);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn speculative_generation_stops_at_a_stop_token_like_plain_generation() {
    let verifier = tiny(11, 3);
    let prompt = PROMPTS[0];
    let free = plain(&verifier, prompt, 30, &mut Sampler::greedy());
    let stop = free[12];
    let opts = GenerateOptions {
        max_tokens: 30,
        stop_tokens: vec![stop],
    };
    let want = generate(
        &mut verifier.session(),
        prompt,
        &opts,
        &mut Sampler::greedy(),
        |_| Ok(()),
    )
    .unwrap();
    let mut d = ModelDraft::new(verifier.session(), Sampler::greedy(), 0.0);
    let got = generate_speculative(
        &mut verifier.session(),
        &mut d,
        prompt,
        &opts,
        &SpeculativeOptions {
            draft_max: 5,
            adaptive: false,
            tree_nodes: None,
        },
        &mut Sampler::greedy(),
        &mut StandardAcceptance,
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(got.generation.tokens, want.tokens);
    assert_eq!(got.generation.stop, want.stop);
}

#[test]
fn zero_draft_max_and_empty_prompt_are_errors() {
    let verifier = tiny(11, 1);
    let mut d = LookupDraft::default();
    for (prompt, k) in [(&[1u32, 2][..], 0), (&[][..], 4)] {
        let r = generate_speculative(
            &mut verifier.session(),
            &mut d,
            prompt,
            &options(4),
            &SpeculativeOptions {
                draft_max: k,
                adaptive: true,
                tree_nodes: None,
            },
            &mut Sampler::greedy(),
            &mut StandardAcceptance,
            |_| Ok(()),
        );
        match (k, r) {
            (0, Err(ExecError::InvalidDraft { .. })) => {}
            (_, Err(ExecError::EmptyPrompt)) => {}
            (k, other) => panic!("k {k}: unexpected {:?}", other.map(|g| g.generation.tokens)),
        }
    }
    assert!(matches!(
        verifier.model.truncated(0),
        Err(ExecError::InvalidDraft { .. })
    ));
    assert!(matches!(
        verifier.model.truncated(2),
        Err(ExecError::InvalidDraft { .. })
    ));
}

/// Accepts every draft: the output follows the draft's distribution, not the verifier's.
struct AcceptAll;
impl Acceptance for AcceptAll {
    fn judge(
        &mut self,
        _: &Distribution,
        _: &Distribution,
        _: u32,
        _: &mut Sampler,
    ) -> Option<u32> {
        None
    }
}

/// The standard test, but a rejection resamples from p instead of max(0, p − q): tokens the
/// draft favours come out too often.
struct ResampleFromP;
impl Acceptance for ResampleFromP {
    fn judge(
        &mut self,
        p: &Distribution,
        q: &Distribution,
        token: u32,
        sampler: &mut Sampler,
    ) -> Option<u32> {
        let (pd, qd) = (p.prob(token), q.prob(token));
        if pd >= qd || sampler.uniform() < pd / qd {
            None
        } else {
            Some(sampler.draw(p))
        }
    }
}

/// Pearson's chi-square of `counts` against probabilities `expected`, bins with an expected count
/// below 5 pooled into one; returns (statistic, degrees of freedom).
fn chi_square(counts: &[u64], expected: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &p) in counts.iter().zip(expected) {
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += o as f64;
            pool_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            bins += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e;
        bins += 1;
    }
    (stat, bins - 1)
}

/// The chi-square quantile at 1 − 0.001 (Wilson–Hilferty).
fn critical(df: usize) -> f64 {
    let d = df as f64;
    let z = 3.090_232; // standard normal quantile at 0.999
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

#[test]
fn speculative_sampling_has_the_verifiers_distribution_and_a_wrong_rule_is_caught() {
    let verifier = tiny(21, 2);
    let draft_model = tiny(22, 1);
    let vocab = verifier.model.config().vocab_size;
    let prompt = [3u32, 17, 5];
    let opts = |seed| SamplerOptions {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed,
    };
    // Exact distributions of the first two generated tokens under plain sampling.
    let s = Sampler::new(opts(0)).unwrap();
    let mut sess = verifier.session();
    let p1 = s.distribution(&sess.prefill(&prompt).unwrap()).unwrap();
    let mut p2 = vec![0.0; vocab];
    for &(t1, pt1) in p1.entries() {
        let mut s2 = verifier.session();
        let mut ctx = prompt.to_vec();
        ctx.push(t1);
        let d = s.distribution(&s2.prefill(&ctx).unwrap()).unwrap();
        for &(t2, pt2) in d.entries() {
            p2[t2 as usize] += pt1 * pt2;
        }
    }
    let p1: Vec<f64> = (0..vocab as u32).map(|t| p1.prob(t)).collect();

    const RUNS: u64 = 6000;
    let run = |rule: &mut dyn Acceptance| {
        let (mut c1, mut c2) = (vec![0u64; vocab], vec![0u64; vocab]);
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..RUNS {
            let mut d = ModelDraft::new(
                draft_model.session(),
                Sampler::new(opts(seed ^ 0x00d1_2af7)).unwrap(),
                0.0,
            );
            let mut sampler = Sampler::new(opts(seed)).unwrap();
            let g = speculative(
                &verifier,
                &mut d,
                &prompt,
                2,
                3,
                false,
                None,
                &mut sampler,
                rule,
            );
            c1[g.generation.tokens[0] as usize] += 1;
            c2[g.generation.tokens[1] as usize] += 1;
            drafted += g.stats.drafted;
            accepted += g.stats.accepted;
        }
        (c1, c2, drafted, accepted)
    };

    let (c1, c2, drafted, accepted) = run(&mut StandardAcceptance);
    // Both branches of the rule ran many times.
    assert!(
        accepted > 500 && drafted - accepted > 500,
        "accepted {accepted} of {drafted}"
    );
    for (what, c, p) in [("first token", &c1, &p1), ("second token", &c2, &p2)] {
        let (stat, df) = chi_square(c, p);
        assert!(
            stat < critical(df),
            "standard rule, {what}: chi-square {stat:.1} ≥ {:.1} (df {df})",
            critical(df)
        );
    }
    // Plain sampling passes the same test (the harness is not biased against the verifier).
    let mut c = vec![0u64; vocab];
    for seed in 0..RUNS {
        let t = plain(
            &verifier,
            &prompt,
            1,
            &mut Sampler::new(opts(seed)).unwrap(),
        );
        c[t[0] as usize] += 1;
    }
    let (stat, df) = chi_square(&c, &p1);
    assert!(stat < critical(df), "plain sampling: {stat:.1}");

    for (name, rule) in [
        ("accept all", &mut AcceptAll as &mut dyn Acceptance),
        ("resample from p", &mut ResampleFromP),
    ] {
        let (c1, _, _, _) = run(rule);
        let (stat, df) = chi_square(&c1, &p1);
        assert!(
            stat > critical(df),
            "{name}: chi-square {stat:.1} did not exceed {:.1} (df {df}): the test cannot tell a wrong rule",
            critical(df)
        );
    }
}

/// Always drafts the same tree after any history: `tokens` with their `parents`.
struct FixedTree {
    nodes: Vec<(u32, Option<usize>)>,
}
impl Draft for FixedTree {
    fn propose(&mut self, _: &[u32], _: usize) -> Result<Vec<ork_exec::Proposal>, ExecError> {
        Ok(Vec::new())
    }
    fn propose_tree(
        &mut self,
        _: &[u32],
        max_nodes: usize,
        _: usize,
    ) -> Result<Vec<TreeProposal>, ExecError> {
        Ok(self
            .nodes
            .iter()
            .take(max_nodes)
            .map(|&(token, parent)| TreeProposal {
                token,
                parent,
                q: Distribution::point(token),
            })
            .collect())
    }
}

#[test]
fn a_tree_pass_gives_each_nodes_branch_logits_bit_for_bit_and_keeps_one_branch() {
    let t = tiny(31, 2);
    let vocab = t.model.config().vocab_size;
    let prompt = [3u32, 17, 5, 9];
    // Root 20 with children 21 (child 23, grandchild 24) and 22 (child 25), and 26 after 22.
    let tokens = [20u32, 21, 22, 23, 25, 24, 26];
    let parents = [None, Some(0), Some(0), Some(1), Some(2), Some(3), Some(2)];
    let mut tree = t.session();
    tree.prefill(&prompt).unwrap();
    let rows = tree.forward_tree(&tokens, &parents).unwrap();
    assert_eq!(tree.position(), prompt.len() + tokens.len());
    let branch = |i: usize| {
        let mut b = vec![i];
        while let Some(p) = parents[*b.last().unwrap()] {
            b.push(p);
        }
        b.reverse();
        b
    };
    for i in 0..tokens.len() {
        let mut one = t.session();
        one.prefill(&prompt).unwrap();
        let mut logits = Vec::new();
        for &j in &branch(i) {
            logits = one.decode(tokens[j]).unwrap();
        }
        let got = &rows[i * vocab..][..vocab];
        assert!(
            logits
                .iter()
                .zip(got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "node {i}"
        );
    }
    // Keep the branch 20 → 22 → 25, then decode on: as if only that branch had been run.
    tree.keep_branch(prompt.len(), &[0, 2, 4]).unwrap();
    assert_eq!(tree.position(), prompt.len() + 3);
    let mut plain_s = t.session();
    plain_s.prefill(&prompt).unwrap();
    plain_s.prefill(&[20, 22, 25]).unwrap();
    let (a, b) = (tree.decode(7).unwrap(), plain_s.decode(7).unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    // Not a tree, not a branch in the cache: typed errors, the cache unchanged.
    let at = tree.position();
    // A node its own parent, a parent after its child, two parents for three tokens.
    for (toks, bad) in [
        (&[1u32, 2][..], &[None, Some(1)][..]),
        (&[1, 2, 3][..], &[None, Some(2), None][..]),
        (&[1, 2, 3][..], &[None, Some(0)][..]),
    ] {
        assert!(matches!(
            tree.forward_tree(toks, bad),
            Err(ExecError::InvalidTree { .. })
        ));
        assert_eq!(tree.position(), at);
    }
    for bad in [&[2usize, 1][..], &[0, 5][..]] {
        assert!(matches!(
            tree.keep_branch(at - 2, bad),
            Err(ExecError::InvalidTree { .. })
        ));
        assert_eq!(tree.position(), at);
    }
}

#[test]
fn tree_verification_with_sampling_has_the_verifiers_distribution() {
    let verifier = tiny(21, 2);
    let vocab = verifier.model.config().vocab_size;
    let prompt = [3u32, 17, 5];
    let opts = |seed| SamplerOptions {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed,
    };
    let s = Sampler::new(opts(0)).unwrap();
    let p1 = s
        .distribution(&verifier.session().prefill(&prompt).unwrap())
        .unwrap();
    // A tree whose root children are the verifier's three likeliest first tokens (so both the
    // first child and its siblings are taken often), each with one child.
    let mut likely: Vec<(u32, f64)> = p1.entries().to_vec();
    likely.sort_by(|a, b| b.1.total_cmp(&a.1));
    let (a, b, c) = (likely[0].0, likely[1].0, likely[2].0);
    let nodes = vec![
        (a, None),
        (b, None),
        (c, None),
        (a, Some(0)),
        (b, Some(1)),
        (c, Some(2)),
    ];
    let mut p2 = vec![0.0; vocab];
    for &(t1, pt1) in p1.entries() {
        let mut ctx = prompt.to_vec();
        ctx.push(t1);
        let d = s
            .distribution(&verifier.session().prefill(&ctx).unwrap())
            .unwrap();
        for &(t2, pt2) in d.entries() {
            p2[t2 as usize] += pt1 * pt2;
        }
    }
    let p1: Vec<f64> = (0..vocab as u32).map(|t| p1.prob(t)).collect();
    const RUNS: u64 = 6000;
    let (mut c1, mut c2) = (vec![0u64; vocab], vec![0u64; vocab]);
    let mut sibling_taken = 0;
    for seed in 0..RUNS {
        let mut d = FixedTree {
            nodes: nodes.clone(),
        };
        let g = speculative(
            &verifier,
            &mut d,
            &prompt,
            2,
            3,
            false,
            Some(6),
            &mut Sampler::new(opts(seed)).unwrap(),
            &mut StandardAcceptance,
        );
        let t = &g.generation.tokens;
        c1[t[0] as usize] += 1;
        c2[t[1] as usize] += 1;
        sibling_taken += usize::from(t[0] == b || t[0] == c);
    }
    assert!(sibling_taken > 500, "siblings taken {sibling_taken} times");
    for (what, c, p) in [("first token", &c1, &p1), ("second token", &c2, &p2)] {
        let (stat, df) = chi_square(c, p);
        assert!(
            stat < critical(df),
            "tree, {what}: chi-square {stat:.1} ≥ {:.1} (df {df})",
            critical(df)
        );
    }
}
