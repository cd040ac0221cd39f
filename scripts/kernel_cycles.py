#!/usr/bin/env python3
"""Cycles per 256 weights of each NEON dot-product kernel under LLVM's Cortex-A76 and Cortex-A55
scheduling models (llvm-mca), for ggml's kernels and ork's. An ESTIMATE from a scheduling model,
not a measurement. Driven by scripts/kernel-cycles.sh, which prepares the assembly.

Usage: kernel_cycles.py --ggml GGML.s [--ork ORK.s] [--json]

How a kernel's figure is made, the same way for both columns:
- the kernel's function is found in the assembly (ggml: `ggml_vec_dot_<type>_<act>`; ork: the
  functions whose demangled name holds the type and `neon`, see ORK_PATTERNS);
- its loops are the spans from a label to a backward branch to it; the hot loop is the one with
  the most multiply-adds (the main loop over blocks: ggml's inner loops over a
  super-block's sub-blocks are unrolled by the compiler, so the main loop has no inner loop);
- the weights one iteration covers are its multiply-adds (every weight is multiplied once): 16
  per `sdot`/`udot` on 16 bytes, 8 per `fmla` on 8 fp16 lanes (F16: `ggml_vec_dot_f16`, from
  ggml-cpu/vec.cpp), so no per-type table is needed;
- llvm-mca runs the loop body for 200 iterations (`-mtriple=aarch64 -mcpu=CPU -mattr=+dotprod`);
  cycles per iteration = total cycles / 200, scaled to 256 weights.
"""
import argparse
import json
import re
import subprocess
import sys

# (type, ggml function suffix): ggml's vec_dot names in ggml/src/ggml-cpu/arch/arm/quants.c.
TYPES = [
    ("F16", "f16"),
    ("Q4_0", "q4_0_q8_0"),
    ("Q4_1", "q4_1_q8_1"),
    ("Q5_0", "q5_0_q8_0"),
    ("Q5_1", "q5_1_q8_1"),
    ("Q8_0", "q8_0_q8_0"),
    ("Q2_K", "q2_K_q8_K"),
    ("Q3_K", "q3_K_q8_K"),
    ("Q4_K", "q4_K_q8_K"),
    ("Q5_K", "q5_K_q8_K"),
    ("Q6_K", "q6_K_q8_K"),
    ("IQ4_NL", "iq4_nl_q8_0"),
    ("IQ4_XS", "iq4_xs_q8_K"),
]
CORES = [("A76", "cortex-a76"), ("A55", "cortex-a55")]
# Multiply-adds per instruction: sdot/udot on 16 bytes (16 int8 products), fmla on 8 fp16 lanes.
MACS = [(re.compile(r"^\s+(sdot|udot)\s+v\d+\.4s,"), 16), (re.compile(r"^\s+fmla\s+v\d+\.8h,"), 8)]
BRANCH = re.compile(r"^\s+(b\.?\w*|cbn?z|tbn?z)\s+.*?(\.?L[\w$]+)\s*$")
LABEL = re.compile(r"^(\.?L[\w$]+):")
FUNC = re.compile(r"^([A-Za-z_][\w.$]*):\s*$")


def functions(path):
    """Each global or local function of a GNU-syntax assembly file: name -> its lines."""
    out, cur = {}, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = FUNC.match(line)
            if m and not m.group(1).startswith("."):
                cur = m.group(1)
                out[cur] = []
            elif cur is not None:
                out[cur].append(line)
    return out


def loops(body):
    """(first, last) line of every loop: a label and a later branch back to it."""
    labels = {}
    for i, line in enumerate(body):
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = i
    found = []
    for i, line in enumerate(body):
        m = BRANCH.match(line)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            found.append((labels[m.group(2)], i))
    return found


def dots(body, span):
    """Multiply-adds one pass of the loop `span` makes (each weight is multiplied once)."""
    return sum(n for x in body[span[0] : span[1] + 1] for r, n in MACS if r.match(x))


def hot_loop(body):
    """The loop with the most dot instructions, as llvm-mca input, and the weights it covers."""
    spans = [s for s in loops(body) if dots(body, s) > 0]
    if not spans:
        return None
    span = max(spans, key=lambda s: (dots(body, s), -(s[1] - s[0])))
    lines = [x for x in body[span[0] + 1 : span[1] + 1] if re.match(r"^\s+[a-z]", x)]
    label = LABEL.match(body[span[0]]).group(1)
    return label + ":\n" + "\n".join(lines) + "\n", dots(body, span)


def mca(text, cpu):
    """Cycles per iteration of `text` under llvm-mca's model of `cpu`."""
    r = subprocess.run(
        ["llvm-mca", "-mtriple=aarch64", "-mcpu=" + cpu, "-mattr=+dotprod", "-iterations=200"],
        input=text,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.exit("llvm-mca failed:\n" + r.stderr)
    iters = int(re.search(r"Iterations:\s+(\d+)", r.stdout).group(1))
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    return cycles / iters


def per_256(body, cpu):
    hot = hot_loop(body) if body else None
    if hot is None:
        return None
    text, weights = hot
    return round(mca(text, cpu) * 256 / weights, 1)


def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.split("\n") if r.returncode == 0 else names


def ork_kernel(funcs, ty):
    """ork's NEON dotprod kernel for `ty`: the functions whose demangled name holds the type
    (lower case, as ork-kernels' blocks modules name them) and `neon`; the one whose hot loop
    has the most dot instructions (the M = 1 row kernel)."""
    names = list(funcs)
    best = None
    for raw, nice in zip(names, demangle(names)):
        low = nice.lower()
        if "neon" not in low or not re.search(r"(^|[^a-z0-9])" + ty.lower() + r"($|[^a-z0-9])", low):
            continue
        hot = hot_loop(funcs[raw])
        if hot and (best is None or hot[1] > best[1]):
            best = (raw, hot[1])
    return funcs[best[0]] if best else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml", required=True, action="append")
    ap.add_argument("--ork")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    g = {}
    for path in a.ggml:
        g.update(functions(path))
    o = functions(a.ork) if a.ork else {}
    rows = []
    for ty, suffix in TYPES:
        gbody = g.get("ggml_vec_dot_" + suffix)
        if gbody is None:
            sys.exit(f"ggml_vec_dot_{suffix} not found in {a.ggml}")
        obody = ork_kernel(o, ty) if o else None
        for core, cpu in CORES:
            rows.append(
                {"type": ty, "core": core, "ork": per_256(obody, cpu), "ggml": per_256(gbody, cpu)}
            )
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("cycles per 256 weights, llvm-mca estimate (not a measurement)")
    print(f"{'type':8} {'core':4} {'ork':>8} {'ggml':>8} {'ork/ggml':>9}")
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        ratio = f"{r['ork'] / r['ggml']:.2f}" if r["ork"] and r["ggml"] else "-"
        print(f"{r['type']:8} {r['core']:4} {fmt(r['ork']):>8} {fmt(r['ggml']):>8} {ratio:>9}")


if __name__ == "__main__":
    main()
