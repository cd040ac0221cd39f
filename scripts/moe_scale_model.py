#!/usr/bin/env python3
"""A synthetic Qwen3-30B-A3B-shaped MoE GGUF for the scale benchmark only (never the tests).

Usage:  python3 scripts/moe_scale_model.py OUT.gguf [--layers 8] [--seed 0]

Shape of Qwen3-30B-A3B per block: hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
FFN width 768, top-8, q/k norms (`qwen3moe`); every matmul weight random Q4_0 (the router F32),
norms near 1. The tokenizer (and so the vocabulary, 49152) is SmolLM2's, read from ORK_MODEL or
.cache/SmolLM2-135M-Instruct.Q4_1.gguf, so `ork run` can tokenize a prompt. The weights mean
nothing: the model measures conversion RSS, streaming traffic and speed, not text. At 8 layers
the file is ~2.9 GB (~340 MiB of experts per layer).
"""
import argparse
import os

import numpy as np
import gguf

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, USED, FF_EXP = 128, 8, 768
Q4_0 = gguf.GGMLQuantizationType.Q4_0


def q4_0(rng, rows: int, cols: int, scale: float) -> np.ndarray:
    """Random Q4_0 bytes for `rows` rows of `cols` values: per block of 32 an f16 scale near
    `scale / 8` and 16 bytes of random nibbles."""
    blocks = rows * cols // 32
    d = (scale / 8 * (0.5 + rng.random(blocks))).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    qs = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return np.concatenate([d, qs], axis=1).reshape(rows, cols // 32 * 18)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.environ.get("ORK_MODEL") or os.path.join(here, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = gguf.GGUFReader(src)
    rng = np.random.default_rng(a.seed)

    arch = "qwen3moe"
    w = gguf.GGUFWriter(a.out, arch)
    w.add_block_count(a.layers)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok.fields["tokenizer.ggml.pre"].contents())
    tokens = tok.fields["tokenizer.ggml.tokens"].contents()
    w.add_token_list(tokens)
    w.add_token_types(tok.fields["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(tok.fields["tokenizer.ggml.merges"].contents())
    w.add_bos_token_id(tok.fields["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(tok.fields["tokenizer.ggml.eos_token_id"].contents())
    w.add_add_bos_token(False)
    vocab = len(tokens)

    def quant(name, k, n, scale):
        w.add_tensor(name, q4_0(rng, n, k, scale), raw_dtype=Q4_0)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    quant("token_embd.weight", HIDDEN, vocab, 1.0)
    for l in range(a.layers):
        p = f"blk.{l}."
        norm(p + "attn_norm.weight", HIDDEN)
        quant(p + "attn_q.weight", HIDDEN, HEADS * HEAD_DIM, 1 / np.sqrt(HIDDEN))
        quant(p + "attn_k.weight", HIDDEN, KV_HEADS * HEAD_DIM, 1 / np.sqrt(HIDDEN))
        quant(p + "attn_v.weight", HIDDEN, KV_HEADS * HEAD_DIM, 1 / np.sqrt(HIDDEN))
        norm(p + "attn_q_norm.weight", HEAD_DIM)
        norm(p + "attn_k_norm.weight", HEAD_DIM)
        quant(p + "attn_output.weight", HEADS * HEAD_DIM, HIDDEN, 1 / np.sqrt(HEADS * HEAD_DIM))
        norm(p + "ffn_norm.weight", HIDDEN)
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((EXPERTS, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32))
        for name, k, n in [("ffn_gate_exps", HIDDEN, FF_EXP), ("ffn_up_exps", HIDDEN, FF_EXP),
                           ("ffn_down_exps", FF_EXP, HIDDEN)]:
            data = q4_0(rng, EXPERTS * n, k, 1 / np.sqrt(k)).reshape(EXPERTS, n, k // 32 * 18)
            w.add_tensor(p + name + ".weight", data, raw_dtype=Q4_0)
    norm("output_norm.weight", HIDDEN)
    quant("output.weight", HIDDEN, vocab, 1 / np.sqrt(HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
