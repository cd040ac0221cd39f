//! Engines per phase: a request's prefill on one engine (the NPU at int8, or the CPU at the
//! file's bits) and its decode on the same, the other, or both at once (the row split,
//! [`crate::split`]), one KV cache in host memory. Each pairing that uses the CPU is weighed on
//! two core sets (the big cores, and every core: ork's pool, chunks taken as workers finish),
//! and the split with the NPU holding the whole pack (its prefill on the NPU) or only the dense
//! weights (its prefill on the CPU; a MoE's experts never on the NPU), and a prefill split by
//! rows ([`crate::split::split_prefill`]) before the NPU, the CPU or a split. Every pairing is
//! projected, and the fastest chosen by one stated rule ([`RULE`]). Every figure is a
//! projection (`docs/board-model.md`).

use serde::Serialize;

/// An engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// The NPU, int8 weights from the pack (the board clock's replay).
    Npu,
    /// The CPU, the GGUF's blocks at their own bits ([`crate::cpu`]).
    Cpu,
    /// Each dense matmul's rows shared by the NPU (int8) and the CPU (the file's bits) at once,
    /// each weight at its own share: decode ([`crate::split::split_shares`]) or prefill
    /// ([`crate::split::split_prefill`]).
    Split,
}

/// The cores the CPU engine runs on in a pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cores {
    /// The big cores (the RK3588's four A76s): llama.cpp's `taskset 4-7 -t 4`, ork's default.
    Big,
    /// Every core, big and little, in ork's pool (chunks of rows taken as workers finish:
    /// [`crate::cpu::Pool::Chunks`]).
    All,
}

/// What the NPU's buffers hold in a pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NpuHolds {
    /// Every weight's int8 (the pack), resident or streamed as the plan places it.
    Pack,
    /// Only the dense (non-expert) weights' int8, resident: what a row-split decode reads on
    /// the NPU (a MoE's experts stay on the CPU); every weight of a dense model.
    Dense,
}

/// One engine's projected phases for the request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Phases {
    /// Time to first token (the prompt's prefill), seconds.
    pub ttft_s: f64,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
}

/// What the CPU engine projects on one core set: alone (the whole RAM its own), beside the
/// NPU's buffers (the page cache less them), and the row split's decode.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct CpuInputs {
    /// The CPU alone (`None`: the board's CPU is not modelled).
    pub alone: Option<Phases>,
    /// The CPU while the NPU's buffers hold the pack as planned.
    pub beside_npu: Option<Phases>,
    /// The row split's decode tokens per second, the NPU holding the whole pack resident
    /// ([`crate::split::split_decode`]; `None`: no NPU, or its pack streams).
    pub split_decode_tok_s: Option<f64>,
    /// The CPU while the NPU's buffers hold only the dense weights (`None`: they cannot be
    /// resident, or no NPU).
    pub beside_dense: Option<Phases>,
    /// The row split's decode tokens per second, the NPU holding only the dense weights
    /// resident (`None` likewise).
    pub dense_split_decode_tok_s: Option<f64>,
    /// The row split's prefill TTFT ([`crate::split::split_prefill`]), the NPU holding the
    /// whole pack resident (`None` as for `split_decode_tok_s`): split/npu's prefill.
    pub split_prefill_ttft_s: Option<f64>,
    /// The row split's prefill TTFT, the NPU holding only the dense weights resident (`None`
    /// as for `dense_split_decode_tok_s`): split/cpu's and split/split's prefill.
    pub dense_split_prefill_ttft_s: Option<f64>,
}

/// What each engine projects: the NPU, and the CPU on its big cores and on every core.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct EngineInputs {
    /// The NPU (`None`: the board has none, or the plan cannot run).
    pub npu: Option<Phases>,
    /// The CPU on its big cores.
    pub big: CpuInputs,
    /// The CPU on every core (`None`: the board has no little cores).
    pub all: Option<CpuInputs>,
}

/// One pairing as projected.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Pairing {
    /// The prefill's engine.
    pub prefill: Engine,
    /// The decode's engine.
    pub decode: Engine,
    /// The CPU's cores (`None`: no phase on the CPU).
    pub cores: Option<Cores>,
    /// What the NPU's buffers hold (`None`: no phase on the NPU).
    pub npu_holds: Option<NpuHolds>,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
    /// The rule's figure: TTFT plus the decode of the other generated tokens, seconds.
    pub total_s: f64,
}

/// The chosen engines, the CPU's cores and what the NPU holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Engines {
    /// The prefill's engine.
    pub prefill: Engine,
    /// The decode's engine.
    pub decode: Engine,
    /// The CPU's cores (`None`: no phase on the CPU).
    pub cores: Option<Cores>,
    /// What the NPU's buffers hold (`None`: no phase on the NPU).
    pub npu_holds: Option<NpuHolds>,
}

impl Pairing {
    /// Its engines, cores and NPU holdings.
    pub fn engines(&self) -> Engines {
        Engines {
            prefill: self.prefill,
            decode: self.decode,
            cores: self.cores,
            npu_holds: self.npu_holds,
        }
    }
}

/// The choice and everything considered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// The pairing with the least [`Pairing::total_s`].
    pub engines: Engines,
    /// Every pairing considered, in [`RULE`]'s order.
    pub alternatives: Vec<Pairing>,
    /// The rule.
    pub rule: &'static str,
}

impl Choice {
    /// The chosen pairing as projected.
    pub fn chosen(&self) -> Option<&Pairing> {
        self.alternatives
            .iter()
            .find(|p| p.engines() == self.engines)
    }
}

/// How the pairing is chosen.
pub const RULE: &str = "least TTFT + (generated tokens - 1) / decode tok/s, the request's own \
                        prompt and generated counts; ties to the earlier of npu/npu, then on the \
                        big cores and then on every core (ork's pool): npu/cpu, cpu/cpu, \
                        cpu/npu, npu/split (the NPU holding the whole pack), cpu/split (the NPU \
                        holding only the dense weights: a MoE's experts stay on the CPU), \
                        split/npu (the whole pack), split/cpu, split/split (the dense weights) \
                        (split: each dense matmul's rows of that phase shared by the NPU and \
                        the CPU, each weight at the share the clock projects best for it)";

/// Every pairing `inputs` allows, and the fastest for a request that generates `gen` tokens
/// (the first from the prefill); `None` when neither engine is projected.
pub fn choose(inputs: &EngineInputs, gen: usize) -> Option<Choice> {
    let steps = gen.saturating_sub(1) as f64;
    let pair = |(prefill, decode), cores, npu_holds, ttft: Option<Phases>, rate: Option<f64>| {
        let (ttft_s, decode_tok_s) = (ttft?.ttft_s, rate?);
        Some(Pairing {
            prefill,
            decode,
            cores,
            npu_holds,
            ttft_s,
            decode_tok_s,
            total_s: ttft_s + steps / decode_tok_s,
        })
    };
    let npu = inputs.npu;
    let rate = |p: Option<Phases>| p.map(|p| p.decode_tok_s);
    // A split prefill's TTFT as phases (its decode is the other engine's).
    let sp = |t: Option<f64>| {
        t.map(|ttft_s| Phases {
            ttft_s,
            decode_tok_s: f64::NAN,
        })
    };
    let (pack, dense) = (Some(NpuHolds::Pack), Some(NpuHolds::Dense));
    use Engine::{Cpu, Npu, Split};
    let mut all = vec![pair((Npu, Npu), None, pack, npu, rate(npu))];
    let sets = [(Cores::Big, Some(inputs.big)), (Cores::All, inputs.all)];
    for (cores, c) in sets.into_iter().filter_map(|(k, c)| Some((Some(k), c?))) {
        // A split decodes beside the NPU's buffers; its prefill is the NPU's (which needs the
        // whole pack) or the CPU's beside the dense weights alone.
        all.extend([
            pair((Npu, Cpu), cores, pack, npu, rate(c.beside_npu)),
            pair((Cpu, Cpu), cores, None, c.alone, rate(c.alone)),
            pair((Cpu, Npu), cores, pack, c.beside_npu, rate(npu)),
            pair((Npu, Split), cores, pack, npu, c.split_decode_tok_s),
            pair(
                (Cpu, Split),
                cores,
                dense,
                c.beside_dense,
                c.dense_split_decode_tok_s,
            ),
            // A split prefill: the NPU decodes from the whole pack after it; the CPU or a split
            // decode needs only the dense weights on the NPU.
            pair(
                (Split, Npu),
                cores,
                pack,
                sp(c.split_prefill_ttft_s),
                rate(npu),
            ),
            pair(
                (Split, Cpu),
                cores,
                dense,
                sp(c.dense_split_prefill_ttft_s),
                rate(c.beside_dense),
            ),
            pair(
                (Split, Split),
                cores,
                dense,
                sp(c.dense_split_prefill_ttft_s),
                c.dense_split_decode_tok_s,
            ),
        ]);
    }
    let alternatives: Vec<Pairing> = all
        .into_iter()
        .flatten()
        .filter(|p| p.total_s.is_finite())
        .collect();
    let best = alternatives.iter().fold(None::<&Pairing>, |b, p| match b {
        Some(b) if b.total_s <= p.total_s => Some(b),
        _ => Some(p),
    })?;
    Some(Choice {
        engines: best.engines(),
        alternatives,
        rule: RULE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(ttft_s: f64, decode_tok_s: f64) -> Option<Phases> {
        Some(Phases {
            ttft_s,
            decode_tok_s,
        })
    }

    /// The CPU's inputs on one core set: TTFT `tc`, decode `dc` alone, `beside` beside the
    /// pack's buffers, the splits as gains over that (`None`: not weighed).
    fn cpu(tc: f64, dc: f64, beside: f64, split: Option<f64>, dense: Option<f64>) -> CpuInputs {
        // The split prefill: as fast as the NPU's pack split beside it, a gain with the dense
        // weights alone (`None` where its decode split is not weighed).
        CpuInputs {
            split_prefill_ttft_s: split.map(|_| tc),
            dense_split_prefill_ttft_s: dense.map(|g| tc / g),
            alone: phases(tc, dc),
            beside_npu: phases(tc, beside),
            split_decode_tok_s: split.map(|g| g * beside),
            // Beside the dense weights alone the CPU has at least the cache it has beside the
            // pack.
            beside_dense: dense.map(|_| Phases {
                ttft_s: tc,
                decode_tok_s: dc,
            }),
            dense_split_decode_tok_s: dense.map(|g| g * dc),
        }
    }

    /// Over a grid of projections: the chosen pairing never takes longer than any other
    /// considered, so never longer than either engine alone (on either core set); it never
    /// decodes slower than both engines alone, and — where the CPU beside the NPU's buffers
    /// decodes as fast as alone — decodes as fast as the fastest engine alone on any core set.
    #[test]
    fn the_choice_never_decodes_slower_than_both_engines_alone() {
        let grid = [0.05, 0.4, 3.0];
        let rates = [5.0, 16.0, 28.0];
        // Every core against the big cores: not weighed, faster (TTFT and decode), slower.
        let every = [None, Some((1.0 / 1.2, 1.15)), Some((1.1, 0.9))];
        let mut n = 0;
        let mut cases = Vec::new();
        for tn in grid {
            for dn in rates {
                for tc in grid {
                    for dc in rates {
                        cases.push((tn, dn, tc, dc));
                    }
                }
            }
        }
        for (tn, dn, tc, dc) in cases {
            for starve in [1.0, 0.8, 0.3] {
                // The splits: none, no faster than the CPU (every share 0), a gain over it.
                for split in [None, Some(1.0), Some(1.4)] {
                    for dense in [None, Some(1.0), Some(1.3)] {
                        for all in every {
                            let big = cpu(tc, dc, dc * starve, split, dense);
                            let inputs = EngineInputs {
                                npu: phases(tn, dn),
                                big,
                                all: all.map(|(t, r)| {
                                    cpu(tc * t, dc * r, dc * r * starve, split, dense)
                                }),
                            };
                            check(&inputs, (dn, dc, starve), all);
                            n += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(n, 81 * 3 * 3 * 3 * 3);
    }

    fn check(inputs: &EngineInputs, (dn, dc, starve): (f64, f64, f64), all: Option<(f64, f64)>) {
        let c = choose(inputs, 64).unwrap();
        let per_set = |ci: &CpuInputs| {
            3 + 2 * usize::from(ci.split_decode_tok_s.is_some())
                + 3 * usize::from(ci.dense_split_decode_tok_s.is_some())
        };
        assert_eq!(
            c.alternatives.len(),
            1 + per_set(&inputs.big) + inputs.all.as_ref().map_or(0, per_set)
        );
        let chosen = c.chosen().unwrap();
        let alone: Vec<&Pairing> = c
            .alternatives
            .iter()
            .filter(|p| p.prefill == p.decode && p.prefill != Engine::Split)
            .collect();
        assert_eq!(alone.len(), 2 + usize::from(all.is_some()));
        assert!(alone.iter().all(|a| chosen.total_s <= a.total_s), "{c:?}");
        assert!(
            c.alternatives.iter().all(|a| chosen.total_s <= a.total_s),
            "{c:?}"
        );
        // Ties go to the earlier: a split no faster than the CPU beside the buffers is never
        // chosen over it, every core no faster than the big cores never over them.
        if inputs.big.split_decode_tok_s == inputs.big.beside_npu.map(|p| p.decode_tok_s) {
            assert!(
                !(chosen.decode == Engine::Split && chosen.prefill == Engine::Npu),
                "{c:?}"
            );
        }
        if all.is_some_and(|(t, r)| t >= 1.0 && r <= 1.0) {
            assert_eq!(chosen.cores.unwrap_or(Cores::Big), Cores::Big, "{c:?}");
        }
        // What each pairing says it holds.
        for p in &c.alternatives {
            let on_cpu = p.prefill != Engine::Npu || p.decode != Engine::Npu;
            let on_npu = p.prefill != Engine::Cpu || p.decode != Engine::Cpu;
            assert_eq!(p.cores.is_some(), on_cpu, "{p:?}");
            assert_eq!(p.npu_holds.is_some(), on_npu, "{p:?}");
            let dense_only = (p.prefill == Engine::Cpu && p.decode == Engine::Split)
                || (p.prefill == Engine::Split && p.decode != Engine::Npu);
            assert_eq!(p.npu_holds == Some(NpuHolds::Dense), dense_only, "{p:?}");
        }
        assert!(chosen.decode_tok_s >= dn.min(dc), "{c:?}");
        // A split prefill beside the dense weights alone may trade decode for TTFT where the
        // NPU cannot decode after it (its pack not resident): not this bound, only the least
        // total above.
        if starve == 1.0 && chosen.prefill != Engine::Split {
            let fastest_cpu = dc * all.map_or(1.0, |(_, r)| r.max(1.0));
            assert!(
                chosen.decode_tok_s >= dn.max(fastest_cpu) * (1.0 - 1e-12),
                "{c:?}"
            );
        }
    }

    /// The moonshot's case: the NPU's pack streams (no whole-pack split, a slow NPU decode);
    /// the split with only the dense weights on the NPU and the CPU's share on every core is
    /// the fastest, and chosen.
    #[test]
    fn a_dense_only_split_on_every_core_is_chosen_where_it_is_fastest() {
        let npu = phases(39.0, 0.7);
        let big = CpuInputs {
            alone: phases(16.9, 10.1),
            beside_npu: phases(16.9, 7.6),
            split_decode_tok_s: None,
            beside_dense: phases(16.9, 10.0),
            dense_split_decode_tok_s: Some(11.0),
            split_prefill_ttft_s: None,
            dense_split_prefill_ttft_s: None,
        };
        let all = CpuInputs {
            alone: phases(12.4, 11.7),
            beside_npu: phases(12.4, 8.8),
            split_decode_tok_s: None,
            beside_dense: phases(12.4, 11.6),
            dense_split_decode_tok_s: Some(12.9),
            split_prefill_ttft_s: None,
            dense_split_prefill_ttft_s: None,
        };
        let c = choose(
            &EngineInputs {
                npu,
                big,
                all: Some(all),
            },
            128,
        )
        .unwrap();
        assert_eq!(
            c.engines,
            Engines {
                prefill: Engine::Cpu,
                decode: Engine::Split,
                cores: Some(Cores::All),
                npu_holds: Some(NpuHolds::Dense),
            }
        );
        assert_eq!(c.alternatives.len(), 1 + 4 + 4);
        assert_eq!(c.chosen().unwrap().decode_tok_s, 12.9);
    }
}
