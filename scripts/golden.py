#!/usr/bin/env python3
"""Golden vectors for ork-gguf's block decoders and quantizers, made with llama.cpp's own Python
library (PyPI `gguf`, its `gguf.quants`), so the Rust code is checked against an independent
implementation rather than against itself.

How it was run (re-runnable; output is deterministic for a fixed `gguf` version and seed):

    python3 -m pip install gguf==0.19.0 numpy      # numpy 2.4 was used
    scripts/fetch-model.sh                           # the real model, for the hashes
    python3 scripts/golden.py

Writes into crates/ork-gguf/tests/golden/:

* `dequant_<TYPE>.bin` for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K…Q6_K: random
  blocks whose f16 scale fields are finite random halves (plus edge blocks: zero scales, negative
  scales/mins, the largest half, subnormal halves), and `gguf.quants.dequantize` of them.
  Layout (little-endian): b"ORKG", u32 format 1, u32 ggml type id, u32 n_blocks,
  u32 block_size (values), u32 type_size (bytes), n_blocks*type_size block bytes,
  n_blocks*block_size f32 values.
* `quantize_<TYPE>.bin` for F16, Q8_0, Q4_0, Q4_1: random f32 rows (plus edge blocks: all zero,
  constant, one spike, all negative) and `gguf.quants.quantize` of them. Layout: b"ORKQ",
  u32 format 1, u32 ggml type id, u32 n_values, u32 n_bytes, n_values f32, n_bytes bytes.
* `smollm2_sha256.txt`: for a few tensors of SmolLM2-135M-Instruct.Q4_1.gguf, one line
  `<name> <type> <n_elements> <sha256 of the dequantized little-endian f32 bytes>`.
"""
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/ork-gguf/tests/golden"
SEED = 20240601

# Byte offsets of the f16 scale fields (d, m/dmin) inside one block (ggml-common.h layouts).
SCALE_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
# Edge values for the scale fields of the first blocks: 0, -0, negative, largest half,
# smallest subnormal, a negative subnormal, one, minus one.
EDGE_HALVES = [0x0000, 0x8000, 0xBC00, 0x7BFF, 0x0001, 0x83FF, 0x3C00, 0xBC00]


def finite_halves(rng, n):
    """Random f16 bit patterns, all finite (exponent field never all ones)."""
    v = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    inf_nan = ((v >> 10) & 0x1F) == 0x1F
    v[inf_nan] &= ~np.uint32(0x4000)  # clear the top exponent bit
    return v.astype(np.uint16)


def dequant_golden(rng, qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16, T.BF16):
        n = 1024
        if qtype == T.F32:
            vals = (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)
            vals[:8] = [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4028235e38, -1.17549435e-38]
            raw = vals.view(np.uint8)
        else:
            bits = finite_halves(rng, n)
            # Specials: ±0, ±inf, subnormals, largest finite (same bit meaning for bf16 widths).
            if qtype == T.F16:
                bits[:8] = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7BFF, 0xFBFF]
            else:
                bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
                nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
                bits[nan] &= ~np.uint32(0x4000)
                bits = bits.astype(np.uint16)
                bits[:8] = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x807F, 0x7F7F, 0xFF7F]
            raw = bits.view(np.uint8)
        n_blocks = n
    else:
        n_blocks = 64 if block_size == 32 else 16
        raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        for off in SCALE_FIELDS[qtype]:
            halves = finite_halves(rng, n_blocks)
            halves[: len(EDGE_HALVES)] = EDGE_HALVES if off == SCALE_FIELDS[qtype][0] else EDGE_HALVES[::-1]
            raw[:, off : off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
        raw = raw.reshape(-1)
    out = gguf.quants.dequantize(raw.copy(), qtype).astype("<f4", copy=False).reshape(-1)
    assert out.size == n_blocks * block_size, (qtype, out.size)
    assert not np.isnan(out).any(), qtype
    head = b"ORKG" + struct.pack("<5I", 1, int(qtype), n_blocks, block_size, type_size)
    return head + raw.tobytes() + out.tobytes()


def quantize_golden(rng, qtype):
    n = 1024
    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
    x[0:32] = 0.0  # all zero: d = 0
    x[32:64] = np.float32(0.125)  # constant: max == min
    x[64:96] = 0.001
    x[64 + 7] = 3.5  # one spike
    x[96:128] = -np.abs(x[96:128]) - np.float32(0.01)  # all negative
    if qtype == T.F16:
        q = x.astype(np.float16).view(np.uint8)
    else:
        q = gguf.quants.quantize(x.reshape(1, -1), qtype).reshape(-1)
    head = b"ORKQ" + struct.pack("<4I", 1, int(qtype), n, q.size)
    return head + x.tobytes() + q.tobytes()


REAL_TENSORS = [
    "token_embd.weight",  # Q8_0
    "blk.0.attn_q.weight",  # Q4_1
    "blk.14.ffn_down.weight",  # Q4_1
    "blk.29.ffn_gate.weight",  # Q4_1
    "blk.0.attn_norm.weight",  # F32
    "output_norm.weight",  # F32
]


def model_path():
    path = os.environ.get("ORK_MODEL")
    if path:
        return Path(path)
    out = subprocess.run([str(ROOT / "scripts/fetch-model.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def real_hashes():
    reader = gguf.GGUFReader(model_path())
    by_name = {t.name: t for t in reader.tensors}
    lines = []
    for name in REAL_TENSORS:
        t = by_name[name]
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype("<f4", copy=False)
        assert values.size == int(t.n_elements), name
        digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
        lines.append(f"{name} {t.tensor_type.name} {int(t.n_elements)} {digest}\n")
    return "".join(lines)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        (OUT / f"dequant_{qtype.name}.bin").write_bytes(dequant_golden(rng, qtype))
    for qtype in [T.F16, T.Q8_0, T.Q4_0, T.Q4_1]:
        (OUT / f"quantize_{qtype.name}.bin").write_bytes(quantize_golden(rng, qtype))
    (OUT / "smollm2_sha256.txt").write_text(real_hashes())
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(list(OUT.iterdir()))} files, {total} bytes, into {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
