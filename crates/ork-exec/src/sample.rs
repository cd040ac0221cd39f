//! Choosing the next token from logits.
//!
//! The chain follows llama.cpp's default sampler order (`common/sampling.cpp`): top-k, then
//! top-p on the untempered distribution, then temperature, then a draw. Temperature 0 is greedy.
use crate::ops::argmax;
use crate::ExecError;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// Sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerOptions {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; `1` disables.
    pub top_p: f32,
    /// Seed of the random stream (same seed, same logits → same tokens).
    pub seed: u64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// A seeded token sampler.
pub struct Sampler {
    options: SamplerOptions,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// Validate the options and seed the random stream.
    pub fn new(options: SamplerOptions) -> Result<Sampler, ExecError> {
        if !(options.temperature.is_finite() && options.temperature >= 0.0) {
            return Err(ExecError::InvalidSampling {
                param: "temperature",
                what: format!("{} is not a finite number ≥ 0", options.temperature),
            });
        }
        if !(options.top_p > 0.0 && options.top_p <= 1.0) {
            return Err(ExecError::InvalidSampling {
                param: "top_p",
                what: format!("{} is not in (0, 1]", options.top_p),
            });
        }
        let rng = ChaCha8Rng::seed_from_u64(options.seed);
        Ok(Sampler { options, rng })
    }

    /// Greedy decoding.
    pub fn greedy() -> Sampler {
        Sampler {
            options: SamplerOptions::default(),
            rng: ChaCha8Rng::seed_from_u64(0),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &SamplerOptions {
        &self.options
    }

    /// Pick a token from `logits`. Errors if no logit is a number.
    ///
    /// The same as drawing ([`Sampler::draw`]) from [`Sampler::distribution`], without the
    /// distribution being built for greedy decoding.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, ExecError> {
        if self.options.temperature == 0.0 {
            return argmax(logits).map(|i| i as u32).ok_or_else(no_finite);
        }
        let dist = self.distribution(logits)?;
        Ok(self.draw(&dist))
    }

    /// The distribution [`Sampler::sample`] draws from: top-k, top-p, temperature applied to
    /// `logits` (greedy: all mass on the argmax). Errors if no logit is a number.
    pub fn distribution(&self, logits: &[f32]) -> Result<Distribution, ExecError> {
        if self.options.temperature == 0.0 {
            let best = argmax(logits).ok_or_else(no_finite)?;
            return Ok(Distribution {
                entries: vec![(best as u32, 1.0)],
            });
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if cand.is_empty() {
            return Err(no_finite());
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.options.top_k > 0 {
            cand.truncate(self.options.top_k);
        }
        if self.options.top_p < 1.0 {
            let probs = softmax(cand.iter().map(|c| c.1), 1.0);
            let mut cum = 0.0f64;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= f64::from(self.options.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep);
        }
        let probs = softmax(cand.iter().map(|c| c.1), self.options.temperature);
        Ok(Distribution {
            entries: cand.iter().map(|c| c.0).zip(probs).collect(),
        })
    }

    /// Draw a token from `dist` with this sampler's random stream.
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        let u = self.uniform();
        let mut cum = 0.0;
        for &(id, p) in &dist.entries {
            cum += p;
            if u < cum {
                return id;
            }
        }
        // Rounding left the sum a hair below u: the last candidate.
        dist.entries.last().map_or(0, |e| e.0)
    }

    /// Uniform in [0, 1) from the top 53 bits of the random stream.
    pub fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn no_finite() -> ExecError {
    ExecError::InvalidSampling {
        param: "logits",
        what: "no logit is a number".to_owned(),
    }
}

/// A probability distribution over token ids: the candidates a [`Sampler`] keeps, most likely
/// first, with probabilities summing to 1 (ids not listed have probability 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    entries: Vec<(u32, f64)>,
}

impl Distribution {
    /// All mass on `token`.
    pub fn point(token: u32) -> Distribution {
        Distribution {
            entries: vec![(token, 1.0)],
        }
    }

    /// From `(id, weight)` pairs with weights ≥ 0, normalized to sum 1; `None` when the weights
    /// do not sum to a positive finite number or an id repeats.
    pub fn from_weights(mut entries: Vec<(u32, f64)>) -> Option<Distribution> {
        entries.retain(|e| e.1 > 0.0);
        let sum: f64 = entries.iter().map(|e| e.1).sum();
        if !(sum.is_finite() && sum > 0.0) || entries.iter().any(|e| !e.1.is_finite()) {
            return None;
        }
        let mut ids: Vec<u32> = entries.iter().map(|e| e.0).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != entries.len() {
            return None;
        }
        entries.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for e in &mut entries {
            e.1 /= sum;
        }
        Some(Distribution { entries })
    }

    /// The probability of `token`.
    pub fn prob(&self, token: u32) -> f64 {
        self.entries
            .iter()
            .find(|e| e.0 == token)
            .map_or(0.0, |e| e.1)
    }

    /// `(id, probability)`, most likely first.
    pub fn entries(&self) -> &[(u32, f64)] {
        &self.entries
    }

    /// The most likely token.
    pub fn top(&self) -> u32 {
        self.entries[0].0
    }
}

/// Softmax of `logits / temperature` in f64.
fn softmax(logits: impl Iterator<Item = f32> + Clone, temperature: f32) -> Vec<f64> {
    let t = f64::from(temperature);
    let max = logits
        .clone()
        .fold(f64::NEG_INFINITY, |m, l| m.max(f64::from(l)));
    let e: Vec<f64> = logits.map(|l| ((f64::from(l) - max) / t).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::greedy();
        assert_eq!(s.sample(&[0.1, 2.0, -1.0]).unwrap(), 1);
        assert!(matches!(
            s.sample(&[]),
            Err(ExecError::InvalidSampling { .. })
        ));
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.7).sin()).collect();
        let opts = SamplerOptions {
            temperature: 1.5,
            top_k: 5,
            top_p: 1.0,
            seed: 42,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(opts.clone()).unwrap();
            (0..200).map(|_| s.sample(&logits).unwrap()).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(opts).unwrap();
            (0..200).map(|_| s.sample(&logits).unwrap()).collect()
        };
        assert_eq!(a, b);
        let mut order: Vec<u32> = (0..50).collect();
        order.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        let top5 = &order[..5];
        assert!(a.iter().all(|t| top5.contains(t)));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 1, "temperature sampling explores");
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let mut s = Sampler::new(SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1e-6,
            seed: 7,
        })
        .unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 3.0, 2.9]).unwrap(), 1);
        }
    }

    #[test]
    fn invalid_options_are_errors() {
        for (t, p) in [(-1.0, 1.0), (f32::NAN, 1.0), (1.0, 0.0), (1.0, 1.5)] {
            let r = Sampler::new(SamplerOptions {
                temperature: t,
                top_p: p,
                ..SamplerOptions::default()
            });
            assert!(matches!(r, Err(ExecError::InvalidSampling { .. })));
        }
    }
}
