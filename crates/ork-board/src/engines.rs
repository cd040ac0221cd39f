//! Engines per phase: a request's prefill on one engine (the NPU at int8, or the CPU at the
//! file's bits) and its decode on the same or the other, one KV cache in host memory. Every
//! pairing is projected, and the fastest chosen by one stated rule ([`RULE`]). Every figure is
//! a projection (`docs/board-model.md`).

use serde::Serialize;

/// An engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// The NPU, int8 weights from the pack (the board clock's replay).
    Npu,
    /// The CPU, the GGUF's blocks at their own bits ([`crate::cpu`]).
    Cpu,
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
    /// The pairing [`RULE`] picks.
    pub engines: Engines,
    /// Every pairing considered, in the order npu/npu, npu/cpu, cpu/cpu, cpu/npu.
    pub alternatives: Vec<Pairing>,
    /// The rule.
    pub rule: &'static str,
}

/// How the pairing is chosen.
pub const RULE: &str = "among the pairings whose decode tok/s is at least each engine's alone \
                        (npu/npu, cpu/cpu), the least TTFT + (generated tokens - 1) / decode \
                        tok/s, the request's own prompt and generated counts; ties to the \
                        earlier of npu/npu, npu/cpu, cpu/cpu, cpu/npu";

/// Every pairing `inputs` allows, and the fastest for a request that generates `gen` tokens
/// (the first from the prefill); `None` when neither engine is projected.
pub fn choose(inputs: &EngineInputs, gen: usize) -> Option<Choice> {
    let steps = gen.saturating_sub(1) as f64;
    let pair = |prefill, decode, p: Option<Phases>, d: Option<Phases>| {
        let (p, d) = (p?, d?);
        Some(Pairing {
            prefill,
            decode,
            ttft_s: p.ttft_s,
            decode_tok_s: d.decode_tok_s,
            total_s: p.ttft_s + steps / d.decode_tok_s,
        })
    };
    let (npu, cpu, beside) = (inputs.npu, inputs.cpu, inputs.cpu_beside_npu);
    let alternatives: Vec<Pairing> = [
        pair(Engine::Npu, Engine::Npu, npu, npu),
        pair(Engine::Npu, Engine::Cpu, npu, beside),
        pair(Engine::Cpu, Engine::Cpu, cpu, cpu),
        pair(Engine::Cpu, Engine::Npu, beside, npu),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.total_s.is_finite())
    .collect();
    // A pairing never decodes slower than an engine alone: the NPU's faster prefill may not buy
    // a decode the CPU beside its buffers (less page cache) runs slower than the CPU alone.
    let alone = alternatives
        .iter()
        .filter(|p| p.prefill == p.decode)
        .map(|p| p.decode_tok_s)
        .fold(0.0, f64::max);
    let best = alternatives
        .iter()
        .filter(|p| p.decode_tok_s >= alone)
        .fold(None::<&Pairing>, |b, p| match b {
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

    fn phases(ttft_s: f64, decode_tok_s: f64) -> Option<Phases> {
        Some(Phases {
            ttft_s,
            decode_tok_s,
        })
    }

    /// The chosen pairing's decode is never below either engine's alone, even where the NPU's
    /// prefill would make a slower-decoding pairing finish first (the CPU beside the NPU's
    /// buffers at 9 tok/s, alone at 10); among those that decode as fast, the least total time.
    #[test]
    fn the_choice_never_decodes_slower_than_an_engine_alone() {
        let inputs = EngineInputs {
            npu: phases(0.1, 5.0),
            cpu: phases(3.0, 10.0),
            cpu_beside_npu: phases(3.0, 9.0),
        };
        let c = choose(&inputs, 8).unwrap();
        assert_eq!(c.alternatives.len(), 4);
        // npu/cpu finishes first (0.1 + 7/9 < 3 + 7/10) but decodes slower than cpu/cpu.
        let npu_cpu = c.alternatives[1];
        assert!(npu_cpu.total_s < c.alternatives[2].total_s);
        assert_eq!(
            c.engines,
            Engines {
                prefill: Engine::Cpu,
                decode: Engine::Cpu
            }
        );
        // Where the CPU beside the NPU decodes as fast as alone, the NPU's prefill wins.
        let inputs = EngineInputs {
            cpu_beside_npu: phases(3.0, 10.0),
            ..inputs
        };
        let c = choose(&inputs, 8).unwrap();
        assert_eq!(
            c.engines,
            Engines {
                prefill: Engine::Npu,
                decode: Engine::Cpu
            }
        );
        // Only the NPU: its pairing.
        let c = choose(
            &EngineInputs {
                npu: phases(0.1, 5.0),
                ..EngineInputs::default()
            },
            8,
        )
        .unwrap();
        assert_eq!(c.engines.decode, Engine::Npu);
        assert!(choose(&EngineInputs::default(), 8).is_none());
    }
}
