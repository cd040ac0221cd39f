//! A naive reference forward pass, written independently of ork-exec: reads metadata and
//! tensors straight from the GGUF, recomputes every position from scratch (no KV cache, no
//! batching), accumulates in f64, one token at a time.
use ork_gguf::GgufFile;
use std::collections::HashMap;

pub struct Reference {
    arch: String,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    eps: f64,
    base: f64,
    /// Experts used per token (MoE fixtures).
    n_used: usize,
    t: HashMap<String, Vec<f32>>,
}

fn meta_u(g: &GgufFile, k: &str) -> Option<usize> {
    g.metadata(k).and_then(|v| v.as_u64()).map(|v| v as usize)
}

impl Reference {
    pub fn new(g: &GgufFile) -> Reference {
        let arch = g
            .metadata("general.architecture")
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned();
        let k = |s: &str| format!("{arch}.{s}");
        let n_embd = meta_u(g, &k("embedding_length")).unwrap();
        let n_head = meta_u(g, &k("attention.head_count")).unwrap();
        let head_dim = meta_u(g, &k("attention.key_length")).unwrap_or(n_embd / n_head);
        let t = g
            .tensors()
            .iter()
            .map(|info| (info.name.clone(), g.dequantize_tensor(info).unwrap()))
            .collect();
        Reference {
            n_layer: meta_u(g, &k("block_count")).unwrap(),
            n_head,
            n_head_kv: meta_u(g, &k("attention.head_count_kv")).unwrap(),
            head_dim,
            eps: f64::from(
                g.metadata(&k("attention.layer_norm_rms_epsilon"))
                    .unwrap()
                    .as_f32()
                    .unwrap(),
            ),
            base: f64::from(g.metadata(&k("rope.freq_base")).unwrap().as_f32().unwrap()),
            n_used: meta_u(g, &k("expert_used_count")).unwrap_or(0),
            arch,
            t,
        }
    }

    fn w(&self, name: &str) -> &[f32] {
        &self.t[name]
    }

    /// y = W x for W stored as rows of len(x).
    fn matvec(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.w(name);
        let k = x.len();
        assert_eq!(w.len() % k, 0, "{name}");
        w.chunks(k)
            .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum())
            .collect()
    }

    /// SwiGLU FFN with weights given as row-major slices.
    fn ffn(&self, gate: &[f32], up: &[f32], down: &[f32], h: &[f64]) -> Vec<f64> {
        let mv = |w: &[f32], x: &[f64]| -> Vec<f64> {
            w.chunks(x.len())
                .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum())
                .collect()
        };
        let (g, u) = (mv(gate, h), mv(up, h));
        let act: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        mv(down, &act)
    }

    /// Mixture of Experts: softmax over the router's logits, top `n_used` (renormalized except
    /// for qwen2moe), each chosen expert's FFN weighted; qwen2moe adds the sigmoid-gated shared
    /// expert.
    fn moe(&self, l: usize, h: &[f64]) -> Vec<f64> {
        let p = |s: &str| format!("blk.{l}.{s}");
        let logits = self.matvec(&p("ffn_gate_inp.weight"), h);
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let probs: Vec<f64> = e.iter().map(|v| v / z).collect();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap());
        let chosen = &order[..self.n_used];
        let sum: f64 = chosen.iter().map(|&x| probs[x]).sum();
        let n_expert = probs.len();
        let slice = |name: &str, x: usize| {
            let w = self.w(&p(name));
            let per = w.len() / n_expert;
            &w[x * per..(x + 1) * per]
        };
        let mut out = vec![0.0; h.len()];
        for &x in chosen {
            let w = if self.arch == "qwen2moe" {
                probs[x]
            } else {
                probs[x] / sum
            };
            let y = self.ffn(
                slice("ffn_gate_exps.weight", x),
                slice("ffn_up_exps.weight", x),
                slice("ffn_down_exps.weight", x),
                h,
            );
            for (o, v) in out.iter_mut().zip(y) {
                *o += w * v;
            }
        }
        if self.t.contains_key(&p("ffn_gate_inp_shexp.weight")) {
            let y = self.ffn(
                self.w(&p("ffn_gate_shexp.weight")),
                self.w(&p("ffn_up_shexp.weight")),
                self.w(&p("ffn_down_shexp.weight")),
                h,
            );
            let g: f64 = self
                .w(&p("ffn_gate_inp_shexp.weight"))
                .iter()
                .zip(h)
                .map(|(&a, &b)| f64::from(a) * b)
                .sum();
            let g = 1.0 / (1.0 + (-g).exp());
            for (o, v) in out.iter_mut().zip(y) {
                *o += g * v;
            }
        }
        out
    }

    fn rmsnorm(&self, x: &[f64], name: &str) -> Vec<f64> {
        let w = self.w(name);
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + self.eps).sqrt();
        x.iter()
            .zip(w)
            .map(|(v, &g)| v * s * f64::from(g))
            .collect()
    }

    fn rope(&self, head: &mut [f64], pos: usize) {
        let d = head.len();
        for i in 0..d / 2 {
            let theta = pos as f64 * self.base.powf(-2.0 * i as f64 / d as f64);
            let (a, b) = if self.arch == "llama" {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + d / 2)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * theta.cos() - x1 * theta.sin();
            head[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }

    /// Logits of the last token of `tokens`, computed from scratch.
    pub fn last_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let emb = self.w("token_embd.weight");
        let d = self.t["output_norm.weight"].len();
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                emb[t as usize * d..][..d]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect()
            })
            .collect();
        let hd = self.head_dim;
        let group = self.n_head / self.n_head_kv;
        for l in 0..self.n_layer {
            let p = |s: &str| format!("blk.{l}.{s}");
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let h = self.rmsnorm(x, &p("attn_norm.weight"));
                let mut q = self.matvec(&p("attn_q.weight"), &h);
                let mut k = self.matvec(&p("attn_k.weight"), &h);
                let mut v = self.matvec(&p("attn_v.weight"), &h);
                if self.arch == "qwen2" || self.arch == "qwen2moe" {
                    for (y, name) in [
                        (&mut q, "attn_q.bias"),
                        (&mut k, "attn_k.bias"),
                        (&mut v, "attn_v.bias"),
                    ] {
                        for (a, &b) in y.iter_mut().zip(self.w(&p(name))) {
                            *a += f64::from(b);
                        }
                    }
                }
                for (y, norm) in [
                    (&mut q, "attn_q_norm.weight"),
                    (&mut k, "attn_k_norm.weight"),
                ] {
                    for head in y.chunks_mut(hd) {
                        if self.arch == "qwen3" || self.arch == "qwen3moe" {
                            let n = self.rmsnorm(head, &p(norm));
                            head.copy_from_slice(&n);
                        }
                        self.rope(head, pos);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for i in 0..xs.len() {
                let mut attn = vec![0.0f64; self.n_head * hd];
                for h in 0..self.n_head {
                    let g = h / group;
                    let q = &qs[i][h * hd..][..hd];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &ks[j][g * hd..][..hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, w) in e.iter().enumerate() {
                        for c in 0..hd {
                            attn[h * hd + c] += w / z * vs[j][g * hd + c];
                        }
                    }
                }
                let o = self.matvec(&p("attn_output.weight"), &attn);
                for (a, b) in xs[i].iter_mut().zip(o) {
                    *a += b;
                }
                let h = self.rmsnorm(&xs[i], &p("ffn_norm.weight"));
                let down = if self.t.contains_key(&p("ffn_gate_inp.weight")) {
                    self.moe(l, &h)
                } else {
                    self.ffn(
                        self.w(&p("ffn_gate.weight")),
                        self.w(&p("ffn_up.weight")),
                        self.w(&p("ffn_down.weight")),
                        &h,
                    )
                };
                for (a, b) in xs[i].iter_mut().zip(down) {
                    *a += b;
                }
            }
        }
        let last = self.rmsnorm(xs.last().unwrap(), "output_norm.weight");
        let out = if self.t.contains_key("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        self.matvec(out, &last)
            .into_iter()
            .map(|v| v as f32)
            .collect()
    }

    /// Logits of every position (each recomputed from scratch).
    pub fn all_logits(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        (1..=tokens.len())
            .map(|n| self.last_logits(&tokens[..n]))
            .collect()
    }
}
