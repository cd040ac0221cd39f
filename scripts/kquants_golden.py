#!/usr/bin/env python3
"""Reference bytes and values for ork-kernels' k-quant kernels, computed by ggml itself
(llama.cpp as built into llama-cpp-python 0.3.36, through its shared libraries and ctypes).

Usage:  python3 scripts/kquants_golden.py > crates/ork-kernels/tests/golden/kquants.json

Records, in one flat JSON object of hex strings (little-endian f32 / raw block bytes):
  x        768 f32 activations: a normal block with outliers, an all-zero block, and a block
           whose largest magnitude is ~1e-40 (ggml's iscale is then infinite);
  q8k      ggml's CPU quantizer for Q8_K on x (`ggml_get_type_traits_cpu(Q8_K)->from_float`,
           the function llama.cpp's matmuls call; the destination is zeroed first because ggml
           leaves an all-zero block's bsums unwritten);
  T_w      three random super-blocks of type T (f16 scales in [2^-12, 2^-4]);
  T_deq    ggml's `dequantize_row_T` of them (768 f32);
  T_dot    ggml's CPU `vec_dot` of T_w with q8k (1 f32), for T in Q2_K … Q6_K and IQ4_XS.
"""
import ctypes
import json

import numpy as np

from ggml_cpu import K_TYPES, Q8_K, base, ptr, quantize_q8k, traits, vec_dot

QK_K = 256
NB = 3
K = NB * QK_K
# The byte offsets of each type's f16 scales (d, dmin).
SCALES = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
          "IQ4_XS": [0]}


def main():
    rng = np.random.default_rng(20261206)
    x = np.zeros(K, dtype=np.float32)
    x[:QK_K] = rng.standard_normal(QK_K).astype(np.float32)
    x[7], x[100] = 9.5, -11.25
    x[2 * QK_K:] = (rng.standard_normal(QK_K) * 1e-40).astype(np.float32)
    q8k = np.zeros(NB * 292, dtype=np.uint8)
    quantize_q8k(x, q8k)
    out = {"x": x.tobytes().hex(), "q8k": q8k.tobytes().hex()}
    for name, (tid, size) in K_TYPES.items():
        t, scales = traits(tid), SCALES[name]
        assert t.vec_dot_type == Q8_K, name
        w = rng.integers(0, 256, NB * size, dtype=np.uint8)
        for b in range(NB):
            for off in scales:
                e = rng.integers(-12, -3)
                h = np.float16(rng.uniform(1.0, 2.0) * 2.0 ** e)
                w[b * size + off:b * size + off + 2] = np.frombuffer(h.tobytes(), np.uint8)
        deq = np.zeros(K, dtype=np.float32)
        sym = "iq4_xs" if name == "IQ4_XS" else name[:2].lower() + "_K"
        fn = getattr(base, "dequantize_row_" + sym)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn(ptr(w), ptr(deq), K)
        s = np.zeros(1, dtype=np.float32)
        vec_dot(tid)(K, ptr(s), 0, ptr(w), 0, ptr(q8k), 0, 1)
        out[name + "_w"] = w.tobytes().hex()
        out[name + "_deq"] = deq.tobytes().hex()
        out[name + "_dot"] = s.tobytes().hex()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
