//! Engines per phase: a request's prefill on one engine (the NPU at int8, or the CPU at the
//! file's bits) and its decode on the same, the other, or both at once (the row split,
//! [`crate::split`]), one KV cache in host memory. Every pairing is projected, and the fastest
//! chosen by one stated rule ([`RULE`]). Every figure is a projection (`docs/board-model.md`).

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

/// One engine's projected phases for the request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Phases {
    /// Time to first token (the prompt's prefill), seconds.
    pub ttft_s: f64,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
}

/// What each engine projects: alone (the whole RAM its own), and the CPU beside the NPU (the
/// page cache less the NPU's device buffers), for pairings that hold both.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct EngineInputs {
    /// The NPU (`None`: the board has none, or the plan cannot run).
    pub npu: Option<Phases>,
    /// The CPU alone (`None`: the board's CPU is not modelled).
    pub cpu: Option<Phases>,
    /// The CPU while the NPU's buffers hold RAM.
    pub cpu_beside_npu: Option<Phases>,
    /// The row split's decode tokens per second, the NPU's weights resident
    /// ([`crate::split::split_decode`]; `None`: no NPU, or its weights stream).
    pub split_decode_tok_s: Option<f64>,
    /// The row split's prefill TTFT, the NPU's weights resident
    /// ([`crate::split::split_prefill`]; `None`: no NPU, or its weights stream).
    pub split_prefill_ttft_s: Option<f64>,
}

/// One pairing as projected.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Pairing {
    /// The prefill's engine.
    pub prefill: Engine,
    /// The decode's engine.
    pub decode: Engine,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
    /// The rule's figure: TTFT plus the decode of the other generated tokens, seconds.
    pub total_s: f64,
}

/// The chosen engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Engines {
    /// The prefill's engine.
    pub prefill: Engine,
    /// The decode's engine.
    pub decode: Engine,
}

/// The choice and everything considered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// The pairing with the least [`Pairing::total_s`].
    pub engines: Engines,
    /// Every pairing considered, in the order npu/npu, npu/cpu, cpu/cpu, cpu/npu, npu/split,
    /// cpu/split, split/npu, split/cpu, split/split.
    pub alternatives: Vec<Pairing>,
    /// The rule.
    pub rule: &'static str,
}

impl Choice {
    /// The chosen pairing as projected.
    pub fn chosen(&self) -> Option<&Pairing> {
        self.alternatives
            .iter()
            .find(|p| p.prefill == self.engines.prefill && p.decode == self.engines.decode)
    }
}

/// How the pairing is chosen.
pub const RULE: &str = "least TTFT + (generated tokens - 1) / decode tok/s, the request's own \
                        prompt and generated counts; ties to the earlier of npu/npu, npu/cpu, \
                        cpu/cpu, cpu/npu, npu/split, cpu/split, split/npu, split/cpu, \
                        split/split (split: each dense matmul's rows of that phase shared by \
                        the NPU and the CPU, each weight at the share the clock projects best \
                        for it)";

/// Every pairing `inputs` allows, and the fastest for a request that generates `gen` tokens
/// (the first from the prefill); `None` when neither engine is projected.
pub fn choose(inputs: &EngineInputs, gen: usize) -> Option<Choice> {
    let steps = gen.saturating_sub(1) as f64;
    let pair = |prefill, decode, ttft: Option<Phases>, rate: Option<f64>| {
        let (ttft_s, decode_tok_s) = (ttft?.ttft_s, rate?);
        Some(Pairing {
            prefill,
            decode,
            ttft_s,
            decode_tok_s,
            total_s: ttft_s + steps / decode_tok_s,
        })
    };
    let (npu, cpu, beside) = (inputs.npu, inputs.cpu, inputs.cpu_beside_npu);
    let rate = |p: Option<Phases>| p.map(|p| p.decode_tok_s);
    // The split decodes beside the NPU's buffers; its prefill is either engine's (the CPU's
    // beside those buffers too).
    let split = inputs.split_decode_tok_s;
    // The split prefill holds the NPU's weights beside the GGUF's pages, as the split decode.
    let split_prefill = inputs.split_prefill_ttft_s.map(|ttft_s| Phases {
        ttft_s,
        decode_tok_s: f64::NAN,
    });
    let alternatives: Vec<Pairing> = [
        pair(Engine::Npu, Engine::Npu, npu, rate(npu)),
        pair(Engine::Npu, Engine::Cpu, npu, rate(beside)),
        pair(Engine::Cpu, Engine::Cpu, cpu, rate(cpu)),
        pair(Engine::Cpu, Engine::Npu, beside, rate(npu)),
        pair(Engine::Npu, Engine::Split, npu, split),
        pair(Engine::Cpu, Engine::Split, beside, split),
        pair(Engine::Split, Engine::Npu, split_prefill, rate(npu)),
        pair(Engine::Split, Engine::Cpu, split_prefill, rate(beside)),
        pair(Engine::Split, Engine::Split, split_prefill, split),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.total_s.is_finite())
    .collect();
    let best = alternatives.iter().fold(None::<&Pairing>, |b, p| match b {
        Some(b) if b.total_s <= p.total_s => Some(b),
        _ => Some(p),
    })?;
    Some(Choice {
        engines: Engines {
            prefill: best.prefill,
            decode: best.decode,
        },
        alternatives,
        rule: RULE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over a grid of projections: the chosen pairing never takes longer than either engine
    /// alone, never decodes slower than both, and — where the CPU beside the NPU's buffers
    /// decodes as fast as alone — decodes as fast as the faster engine alone.
    #[test]
    fn the_choice_never_decodes_slower_than_both_engines_alone() {
        let grid = [0.05, 0.4, 3.0];
        let rates = [5.0, 16.0, 28.0];
        let mut cases = Vec::new();
        for tn in grid {
            for dn in rates {
                for tc in grid {
                    for dc in rates {
                        for starve in [1.0, 0.8, 0.3] {
                            // The split: none, the CPU beside the buffers (every share 0), a
                            // gain over it.
                            for split in [None, Some(1.0), Some(1.4)] {
                                // The split prefill: none, as fast as the faster engine, faster.
                                for sp in [None, Some(1.0), Some(0.8)] {
                                    cases.push((tn, dn, tc, dc, dc * starve, split, sp));
                                }
                            }
                        }
                    }
                }
            }
        }
        for (tn, dn, tc, dc, beside, split, sp) in cases {
            let phases = |ttft_s, decode_tok_s| {
                Some(Phases {
                    ttft_s,
                    decode_tok_s,
                })
            };
            let inputs = EngineInputs {
                npu: phases(tn, dn),
                cpu: phases(tc, dc),
                cpu_beside_npu: phases(tc, beside),
                split_decode_tok_s: split.map(|g: f64| g * beside),
                split_prefill_ttft_s: sp.map(|g: f64| g * tn.min(tc)),
            };
            let c = choose(&inputs, 64).unwrap();
            let n_split = usize::from(split.is_some());
            let n_prefill = usize::from(sp.is_some()) * (2 + n_split);
            assert_eq!(c.alternatives.len(), 4 + 2 * n_split + n_prefill);
            let chosen = c.chosen().unwrap();
            let alone: Vec<&Pairing> = c
                .alternatives
                .iter()
                .filter(|p| p.prefill == p.decode && p.prefill != Engine::Split)
                .collect();
            assert_eq!(alone.len(), 2);
            assert!(alone.iter().all(|a| chosen.total_s <= a.total_s), "{c:?}");
            assert!(
                c.alternatives.iter().all(|a| chosen.total_s <= a.total_s),
                "{c:?}"
            );
            if split == Some(1.0) {
                // A split no faster than the CPU beside the buffers: ties go to cpu decode.
                assert_ne!(chosen.decode, Engine::Split, "{c:?}");
            }
            if sp == Some(1.0) {
                // A split prefill no faster than the faster engine: ties go to one engine.
                assert_ne!(chosen.prefill, Engine::Split, "{c:?}");
            }
            if sp == Some(0.8) && beside == dc {
                // A faster split prefill, every decode beside it as fast as after the others.
                assert_eq!(chosen.prefill, Engine::Split, "{c:?}");
            }
            assert!(chosen.decode_tok_s >= dn.min(dc), "{c:?}");
            if beside == dc {
                assert!(chosen.decode_tok_s >= dn.max(dc), "{c:?}");
            }
        }
    }
}
