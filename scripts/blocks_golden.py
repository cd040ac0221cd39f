#!/usr/bin/env python3
"""Goldens for ork-kernels' block kernels (crates/ork-kernels/tests/data/blocks_golden.txt).

References no one here wrote:
  * `q8_0` / `q8_1` lines: ggml-cpu's own `quantize_row_q8_0` / `quantize_row_q8_1`, called in
    llama-cpp-python 0.3.36's libggml-cpu.so (the x86 build llama.cpp runs here), on vectors
    that include exact halves (where ggml's x86 round-half-even differs from `roundf`).
  * `deq` lines: gguf-py's `gguf.quants.dequantize` of random blocks of each 32-weight type
    (the block layouts and decoded values).
  * `dot` lines: ggml-cpu's `vec_dot` of each type (through `ggml_get_type_traits_cpu`) on a
    random weight row and an activation row quantized by ggml's own `from_float` of the
    type's `vec_dot_type`.

Line formats (hex, little-endian bytes; floats as their u32 bit patterns):
  q8_0 <x bits ...> | <block bytes>
  deq <TYPE> <block bytes> | <f32 bits ...>
  dot <TYPE> <k> <weight row bytes> | <x bits ...> | <ggml result bits>
Run: python3 scripts/blocks_golden.py > crates/ork-kernels/tests/data/blocks_golden.txt
"""
import ctypes
import os
import struct

import numpy as np
import llama_cpp
from gguf import quants, GGMLQuantizationType as T

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so")
ggml = ctypes.CDLL(LIB)
ggml.ggml_cpu_init()
QFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def bits(x):
    return " ".join("%08x" % v for v in np.asarray(x, dtype=np.float32).view(np.uint32))


def ggml_quantize(name, x, block_bytes):
    fn = getattr(ggml, "quantize_row_" + name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = (ctypes.c_uint8 * (len(x) // 32 * block_bytes))()
    fn(x.ctypes.data, out, len(x))
    return bytes(out)


class TraitsCpu(ctypes.Structure):
    # ggml-cpu.h: struct ggml_type_traits_cpu { from_float; vec_dot; vec_dot_type; nrows; }
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


ggml.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCpu)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int)
ACT_BYTES = {8: 34, 9: 36}  # GGML_TYPE_Q8_0, GGML_TYPE_Q8_1


def ggml_dot(ty, wrow, x):
    tr = ggml.ggml_get_type_traits_cpu(int(ty)).contents
    k = len(x)
    act = (ctypes.c_uint8 * (k // 32 * ACT_BYTES[tr.vec_dot_type]))()
    xs = np.ascontiguousarray(x, dtype=np.float32)
    quantize = ggml.ggml_get_type_traits_cpu(tr.vec_dot_type).contents.from_float
    QFN(quantize)(xs.ctypes.data, ctypes.addressof(act), k)
    w = (ctypes.c_uint8 * len(wrow)).from_buffer_copy(wrow)
    s = ctypes.c_float()
    VEC_DOT(tr.vec_dot)(k, ctypes.byref(s), 0, ctypes.addressof(w), 0, ctypes.addressof(act), 0, 1)
    return s.value


def random_blocks(rng, ty, n):
    size = {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24, T.Q8_0: 34, T.IQ4_NL: 18}[ty]
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    scales = 2 if ty in (T.Q4_1, T.Q5_1) else 1
    f = rng.normal(0, 0.02, size=(n, scales)).astype(np.float16).view(np.uint8)
    b[:, : 2 * scales] = f.reshape(n, 2 * scales)
    return b


def main():
    rng = np.random.default_rng(37)
    vectors = [rng.normal(0, s, 64).astype(np.float32) for s in (1.0, 1e-3, 300.0)]
    halves = np.arange(-63.5, 64.0, 1.0, dtype=np.float32)[:64]  # amax 63.5 → id 2, x·id odd
    halves[0] = 127.0  # amax 127 → id 1, so x·id = the halves themselves
    vectors.append(halves)
    vectors.append(np.zeros(32, dtype=np.float32))
    for x in vectors:
        print("q8_0", bits(x), "|", ggml_quantize("q8_0", x, 34).hex())
        print("q8_1", bits(x), "|", ggml_quantize("q8_1", x, 36).hex())
    types = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL]
    for ty in types:
        for blk in random_blocks(rng, ty, 3):
            deq = quants.dequantize(blk.reshape(1, -1), ty).reshape(-1)
            print("deq", ty.name, blk.tobytes().hex(), "|", bits(deq))
    for ty in types:
        for k in (32, 288, 576):
            wrow = random_blocks(rng, ty, k // 32).tobytes()
            x = rng.normal(0, 1, k).astype(np.float32)
            print("dot", ty.name, k, wrow.hex(), "|", bits(x), "|", bits([ggml_dot(ty, wrow, x)]))


if __name__ == "__main__":
    main()
