#!/usr/bin/env python3
"""Requantized copies of the real test model, made by llama.cpp's own quantizer.

Usage:  python3 scripts/requantize.py [SOURCE.gguf] [OUT_DIR]

From SmolLM2-135M-Instruct Q4_1 ($ORK_MODEL, or .cache/ at the repository root) it writes
`SmolLM2-135M-Instruct.<TYPE>.gguf` for each type of TYPES into OUT_DIR (default: `.cache/` at
the repository root, gitignored), with `llama_model_quantize` of llama-cpp-python 0.3.36 on its default parameters
(`allow_requantize` set, since the source is already quantized: llama.cpp dequantizes each tensor
and quantizes it again; `pure` set for the one copy named `_pure`; tensors the mix keeps at another type, such as the tied embedding of the
k-quant mixes, are chosen by llama.cpp, not here).

Idempotent and atomic: each output is written under a temporary name in OUT_DIR and renamed into
place, then its sha256 goes into `<output>.sha256`. A later run skips an output whose bytes still
hash to the recorded value, and remakes it otherwise (a missing, truncated or edited file). The
quantizer is deterministic for a given source and llama.cpp version (checked: two runs give the
same sha256, see docs/cpu.md "Correctness against llama.cpp").

Prints one line per output on stdout: `TYPE PATH SHA256`.
"""
import ctypes
import hashlib
import os
import sys
import tempfile

import llama_cpp

# The set (name, llama.cpp file type, `pure`): legacy types and llama.cpp's k-quant mixes.
# SmolLM2's width (576) is not a multiple of the k-quants' 256-weight super-block, so llama.cpp
# stores every tensor with K = 576 in a legacy fallback type and only ffn_down (K = 1536) in a
# k-quant; its Q2_K mix even puts ffn_down in Q3_K, so no default mix holds a Q2_K block.
# `Q2_K_pure` (`pure`: no mix, the file type wherever the shape allows) is the copy with Q2_K
# blocks (ffn_down; the rest Q4_0).
TYPES = [
    ("Q4_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, False),
    ("Q5_1", llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1, False),
    ("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, False),
    ("Q2_K", llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, False),
    ("Q2_K_pure", llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, True),
    ("Q3_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, False),
    ("Q4_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, False),
    ("Q5_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, False),
    ("Q6_K", llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K, False),
]

SOURCE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's log sink while quantizing (it logs every tensor); kept referenced for the C side.
_QUIET = llama_cpp.llama_log_callback(lambda *_: None)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def output_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"SmolLM2-135M-Instruct.{name}.gguf")


def up_to_date(path: str) -> str | None:
    """The recorded sha256 when `path` exists and still hashes to it, else None."""
    try:
        with open(path + ".sha256", encoding="ascii") as f:
            recorded = f.read().split()[0]
    except (OSError, IndexError):
        return None
    if not os.path.isfile(path) or sha256_of(path) != recorded:
        return None
    return recorded


def quantize(source: str, dest: str, ftype: int, pure: bool) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.pure = pure
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(source.encode(), dest.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({source} -> {dest}, ftype {ftype}) returned {rc}")


def write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".requantize-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)


def make(source: str, out_dir: str, name: str, ftype: int, pure: bool) -> tuple[str, str]:
    path = output_path(out_dir, name)
    recorded = up_to_date(path)
    if recorded is not None:
        return path, recorded
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".requantize-", suffix=".gguf.tmp")
    os.close(fd)
    try:
        quantize(source, tmp, ftype, pure)
        digest = sha256_of(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    write_atomic(path + ".sha256", f"{digest}  {os.path.basename(path)}\n")
    return path, digest


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.environ.get("ORK_MODEL") or os.path.join(here, "..", ".cache", SOURCE_NAME)
    source = sys.argv[1] if len(sys.argv) > 1 else default
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", ".cache")
    if not os.path.isfile(source):
        sys.exit(f"requantize.py: source model not found at {source}: run scripts/fetch-model.sh")
    os.makedirs(out_dir, exist_ok=True)
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    for name, ftype, pure in TYPES:
        path, digest = make(source, out_dir, name, ftype, pure)
        print(f"{name} {path} {digest}", flush=True)


if __name__ == "__main__":
    main()
