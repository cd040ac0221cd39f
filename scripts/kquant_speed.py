#!/usr/bin/env python3
"""Single-thread speed of ork's k-quant block kernels against ggml's own CPU `vec_dot`
(llama.cpp as built into llama-cpp-python 0.3.36, through ctypes), measured in the same run.

Usage:  python3 scripts/kquant_speed.py [ROWS K REPS]   (default 2048 2048 30)

For each of Q2_K … Q6_K: ggml's `vec_dot` (the `type_traits_cpu` entry llama.cpp's matmul
calls for one weight row and one activation row) over ROWS·K weights, as one call on a row of
ROWS·K values against the Q8_K activation row repeated ROWS times (the same work as ROWS dot
products of length K, without Python per call); then ork's `kquant_speed` example (best ISA,
M = 1: ROWS weight rows × one activation row, and M = 16). Prints seconds and ork's speed-up
(ggml time / ork time; per activation row for M = 16). This compares kernels, not llama.cpp's
whole matmul (which may repack Q4_K weights for its AVX2 gemv/gemm, `ggml-cpu/repack.cpp`).
"""
import os
import subprocess
import sys
import time

import numpy as np

from ggml_cpu import K_TYPES, ptr, quantize_q8k, vec_dot


def ggml_time(tid, size, rows, k, reps):
    rng = np.random.default_rng(1)
    n = rows * k
    w = rng.integers(0, 256, n // 256 * size, dtype=np.uint8)
    # sane f16 scales: overwrite every non-finite f16 slot
    h = w.view(np.float16)
    h[~np.isfinite(h)] = np.float16(0.0015)
    x = (rng.random(k, dtype=np.float32) * 2 - 1).astype(np.float32)
    a1 = np.zeros(k // 256 * 292, dtype=np.uint8)
    quantize_q8k(x, a1)
    a = np.tile(a1, rows)
    dot = vec_dot(tid)
    s = np.zeros(1, dtype=np.float32)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dot(n, ptr(s), 0, ptr(w), 0, ptr(a), 0, 1)
        best = min(best, time.perf_counter() - t)
    return best


def ork_time(exe, name, rows, k, m, reps):
    out = subprocess.run([exe, name, str(rows), str(k), str(m), str(reps)], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    return [(l.split()[0], float(l.split()[1])) for l in out if l.strip()][-1]


def main():
    rows, k, reps = (int(v) for v in (sys.argv[1:4] if len(sys.argv) > 3 else (2048, 2048, 30)))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "ork-kernels", "--example",
                    "kquant_speed"], check=True, cwd=root)
    exe = os.path.join(root, "target", "release", "examples", "kquant_speed")
    print(f"{rows} rows x K={k}, one thread; seconds are the best of {reps}")
    for name, (tid, size) in K_TYPES.items():
        g = ggml_time(tid, size, rows, k, reps)
        isa, o1 = ork_time(exe, name, rows, k, 1, reps)
        _, o16 = ork_time(exe, name, rows, k, 16, max(3, reps // 8))
        print(f"{name}: ggml vec_dot {g:.6f}s  ork {isa} M=1 {o1:.6f}s ({g / o1:.2f}x)  "
              f"M=16 {o16 / 16:.6f}s per row ({g / (o16 / 16):.2f}x)")


if __name__ == "__main__":
    main()
