#!/usr/bin/env python3
"""Cycles per 256 weights of each NEON dot-product kernel under LLVM's Cortex-A76 and Cortex-A55
scheduling models (llvm-mca), for ggml's kernels and ork's. An ESTIMATE from a scheduling model,
not a measurement. Driven by scripts/kernel-cycles.sh, which prepares the assembly.

Usage: kernel_cycles.py --ggml GGML.s [--ork ORK.s] [--cores rk3588|rk3576] [--json] [--gemm]

`--gemm` prints the prefill (M > 1) table instead: ork's M > 1 path (ORK_GEMM) beside the kernel
llama.cpp runs for prefill on the A76 (GGML_GEMM: the repacked GEMMs of
ggml-cpu/arch/arm/repack.cpp and llamafile's tinyBLAS, from the --ggml files holding them; else
vec_dot), in cycles per 256 multiply-adds (weights x activation rows), found and run the same way.

How a kernel's figure is made, the same way for both columns:
- the kernel's function is found in the assembly (ggml: `ggml_vec_dot_<type>_<act>`; ork: the
  M = 1 dotprod kernel named in ORK, by its demangled v0 name; a loop-free helper it calls with
  `bl`, as ork's k-quant `dot_sdot`, is inlined into it, its `ret` dropped);
- each loop head's pass is traced (`trace`): the path one iteration takes in the steady state
  (unconditional branches followed, CPU-feature tests on std_detect's cache word taken the way
  the RK3588's cores go, other conditional branches falling through, an inner loop with a
  stated trip count run that many times); the hot loop is the innermost pass with the most
  multiply-adds (ggml's main loop over blocks: the compiler unrolls its inner loops), or for
  ork's k-quants the pass making one super-block's 256 (see `hot_loop`);
- the weights one iteration covers are its multiply-adds (every weight is multiplied once): 16
  per `sdot`/`udot` on 16 bytes, 8 per `fmla` on 8 fp16 lanes (F16: `ggml_vec_dot_f16`, from
  ggml-cpu/vec.cpp, and ork's F16 kernel for fp16 cores, which sums in ggml's order), so no
  per-type table is needed;
- llvm-mca runs the pass for 200 iterations (`-mtriple=aarch64 -mcpu=CPU -mattr=+dotprod`);
  cycles per iteration = total cycles / 200, scaled to 256 weights. llvm-mca models neither
  branch prediction nor caches: the pass's instructions on the core's pipeline model only.
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
# The RK3576's cores (`--cores rk3576`): ARMv8.0-A without dotprod or fp16 arithmetic; ggml then
# builds its plain-NEON paths (`ggml_vdotq_s32` as `smull`/`smull2` to 16-bit products, F16
# widened to fp32). ork's kernels need dotprod: no ork column for them.
CORES_RK3576 = [("A72", "cortex-a72"), ("A53", "cortex-a53")]
# Multiply-adds per plain-NEON instruction: `smull`/`smull2` of 8 int8 pairs into `.8h` (the
# `.4s` forms multiply 16-bit sums by scales, not weights); F16: 4 per fp32 `fmla`.
MACS_NEON = [(re.compile(r"^\s+smull2?\s+v\d+\.8h, v\d+\.(8b|16b),"), 8)]
MACS_NEON_F16 = [(re.compile(r"^\s+fmla\s+v\d+\.4s, v\d+\.4s, v\d+\.4s$"), 4)]
# Multiply-adds per instruction: sdot/udot on 16 bytes (16 int8 products), fmla on 8 fp16 lanes.
MACS = [(re.compile(r"^\s+(sdot|udot)\s+v\d+\.4s,"), 16), (re.compile(r"^\s+fmla\s+v\d+\.8h,"), 8)]
BRANCH = re.compile(r"^\s+(b\.?\w*|cbn?z|tbn?z)\s+.*?(\.?L[\w$]+)\s*$")
LABEL = re.compile(r"^(\.?L[\w$]+):")
FUNC = re.compile(r"^([A-Za-z_][\w.$]*):\s*$")


def functions(path):
    """Each global or local function of a GNU-syntax assembly file: name -> its lines (inline
    assembly normalised by `from_inline_asm`)."""
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
    return {name: from_inline_asm(name, body) for name, body in out.items()}


def from_inline_asm(name, body):
    """`body` with its inline-assembly blocks (`#APP` .. `#NO_APP`, as ggml's hand-written
    `ggml_gemm_q4_0_4x4_q8_0`) in the form the rest reads: one tab-indented instruction a line,
    `.inst 0x… // sdot …` (how ggml spells `sdot` by element for assemblers without dotprod)
    replaced by the instruction its comment names, and numeric local labels (`3:`, `b.gt 3b`,
    `cbz x10, 9f`) renamed to unique `.L` labels."""
    out, app, defs = [], False, []
    for line in body:
        if line.startswith("#APP"):
            app = True
        elif line.startswith("#NO_APP"):
            app = False
        if not app or line.startswith("#") or line.startswith("//"):
            out.append(line)
            continue
        text = line.strip()
        m = re.match(r"^(\d+):\s*(.*)$", text)
        if m:
            lab = f".Lasm_{name}_{m.group(1)}_{len(defs)}"
            defs.append((m.group(1), len(out)))
            out.append(lab + ":")
            text = m.group(2)
        m = re.match(r"^\.inst\s+0x[0-9a-f]+\s*//\s*(.*)$", text)
        if m:
            text = m.group(1)
        if text:
            out.append("\t" + text)

    def resolve(i, num, way):
        if way == "b":
            found = [d for d in defs if d[0] == num and d[1] <= i]
            return found[-1] if found else None
        found = [d for d in defs if d[0] == num and d[1] > i]
        return found[0] if found else None

    for i, line in enumerate(out):
        m = re.match(r"^(\t(?:b\.?\w*|cbn?z|tbn?z)\s+.*?)\b(\d+)([bf])\s*$", line)
        if m:
            d = resolve(i, m.group(2), m.group(3))
            if d is not None:
                out[i] = m.group(1) + out[d[1]][:-1]
    return out


def labels_of(body):
    """Label -> its line in `body`."""
    return {m.group(1): i for i, m in ((i, LABEL.match(x)) for i, x in enumerate(body)) if m}


def loops(body):
    """(first, last) line of every loop: a label and a later branch back to it."""
    labels = labels_of(body)
    found = []
    for i, line in enumerate(body):
        m = BRANCH.match(line)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            found.append((labels[m.group(2)], i))
    return found


def is_insn(line):
    return re.match(r"^\s+[a-z]", line) is not None


def feature_taken(line, feat):
    """Whether `line` tests a word loaded from std_detect's cache (`tbz`/`tbnz` on a feature
    bit, `cbz`/`cbnz` on the whole word) and, if so, the direction the RK3588's cores take once
    the cache is filled: they have every feature the kernels test (asimd, dotprod, fp16), so
    `tbnz`/`cbnz` are taken and `tbz`/`cbz` are not. None for any other instruction."""
    m = re.match(r"^\s+(tbn?z|cbn?z)\s+[wx](\d+),", line)
    if m and m.group(2) in feat:
        # `cbz`/`cbnz` on the word: zero until std_detect has filled it, once.
        return m.group(1) in ("tbnz", "cbnz")
    return None


def cache_regs(body):
    """Registers that hold the address of std_detect's feature cache (loaded from the GOT)."""
    return {
        m.group(1)
        for m in (re.match(r"^\s+ldr\s+x(\d+), \[.*std_detect.*CACHE", x) for x in body)
        if m
    }


def trace(body, head, labels, trips=(), to_ret=False):
    """The instructions one pass of the loop headed at line `head` runs, and the labels it
    passes, following the path the steady state takes: unconditional branches are followed, a
    branch to the head ends the pass, CPU-feature tests go the way the RK3588 goes
    (`feature_taken`), every other conditional branch falls through (loop exits, rare cases).
    Two passes are followed and the second is kept (registers loaded before the head, such as
    the feature word, are then known). None if the path leaves the function, does not come
    back to the head, or runs an inner loop whose trip count neither the code states
    (`trip_count`) nor `trips` gives (the counts of the inner loops the pass meets, in order,
    as the kernel's source states them: the hot loop is otherwise an innermost loop)."""
    name = LABEL.match(body[head]).group(1)
    cache, feat = cache_regs(body), set()
    for _ in range(2):
        out, seen = pass_of(body, head, labels, name, cache, feat, list(trips), to_ret)
        if out is None:
            return None
    return out, seen


def pass_of(body, head, labels, name, cache, feat, trips, to_ret=False):
    """One pass for `trace` (updates `feat`, the registers holding the feature word; takes
    from `trips` the counts of inner loops the code does not state); `to_ret`: the pass ends
    at the function's `ret` (a whole call, `call_pass`)."""
    out, i, seen, marks = [], head + 1, set(), {}
    for _ in range(20000):
        if i >= len(body):
            break
        line = body[i]
        i += 1
        lab = LABEL.match(line)
        if lab:
            seen.add(lab.group(1))
            marks[lab.group(1)] = len(out)
        if not is_insn(line):
            continue
        out.append(line)
        ops = line.split()
        dest = re.match(r"[wx](\d+)", ops[1]) if len(ops) > 1 else None
        m = re.match(r"^\s+ldr\s+[wx](\d+), \[x(\d+)\]$", line)
        if m and m.group(2) in cache:
            feat.add(m.group(1))
            continue
        if dest and not re.match(r"^\s+(tbn?z|cbn?z|cmp|tst|str\w*|st\w+|b)\b", line):
            feat.discard(dest.group(1))
        if re.match(r"^\s+ret\b", line):
            if to_ret:
                return out, seen
            break
        m = BRANCH.match(line)
        if not m:
            continue
        target, cond = m.group(2), m.group(1) != "b"
        if target == name:
            return out, seen
        if target in seen:
            if target not in marks:
                break
            # An inner loop with a trip count the code (or `trips`) states: run its other
            # passes here, then go on past its back branch (a `b` back, as GCC's last pass of
            # ggml's Q6_K gemm `half` loop, exits by a branch before it, to the code after it).
            n = trip_count(out[: marks[target]], out[marks[target] :]) if cond else None
            if n is None and trips:
                n = trips.pop(0)
            if n is None:
                break
            out += out[marks[target] :] * (n - 1)
            continue
        taken = feature_taken(line, feat) if cond else True
        if taken and target in labels:
            i = labels[target] + 1
            seen.add(target)
    return None, seen


def trip_count(before, body):
    """Passes of an inner loop `body` (its back branch last) entered after `before`, when the
    code states them: a counter set to 0 (`mov xN, xzr`) before it, stepped by `add xN, xN,
    #S` and compared with `cmp xN, #E` right before the back branch: E / S; or a counter set
    to E (`mov wN, #E`) before it and counted down by `subs xN, xN, #S` (LLVM's form of ork's
    loop over four activation rows): E / S. Else None."""
    down = count_down(before, body)
    if down is not None:
        return down
    m = re.match(r"^\s+cmp\s+x(\d+), #(\d+)$", body[-2]) if len(body) > 1 else None
    if not m:
        return None
    r, end = m.group(1), int(m.group(2))
    steps = [re.match(r"^\s+add\s+x%s, x%s, #(\d+)$" % (r, r), x) for x in body]
    steps = [int(x.group(1)) for x in steps if x]
    if len(steps) != 1 or end % steps[0] or not any(
        re.match(r"^\s+mov\s+x%s, xzr$" % r, x) for x in before
    ):
        return None
    return end // steps[0]


def count_down(before, body):
    """E / S for a counter set by `mov [wx]N, #E` (its last setting before the loop) and
    stepped by one `subs [wx]N, [wx]N, #S` in `body`; None otherwise."""
    steps = [re.match(r"^\s+subs\s+[wx](\d+), [wx]\1, #(\d+)$", x) for x in body]
    steps = [x for x in steps if x]
    if len(steps) != 1:
        return None
    r, step = steps[0].group(1), int(steps[0].group(2))
    sets = [re.match(r"^\s+mov\s+[wx]%s, #(\d+)$" % r, x) for x in before]
    sets = [int(x.group(1)) for x in sets if x]
    if not sets or step == 0 or sets[-1] % step:
        return None
    return sets[-1] // step


def dots(lines, macs=MACS):
    """Multiply-adds `lines` make (each weight is multiplied once per activation row)."""
    return sum(n for x in lines for r, n in macs if r.match(x))


def hot_loop(body, macs=None, rules=MACS, trips=()):
    """The loop whose pass has the most multiply-adds, the shortest on ties; or, given `macs`,
    the longest pass making exactly `macs` (ork's k-quant M = 1 loop, which decodes its
    super-block in the pass, beside the M > 1 path's loops over a row decoded beforehand).
    A pass that goes through another loop head whose own pass makes as many multiply-adds in
    fewer instructions is an outer loop's, and dropped. As llvm-mca input (the pass `trace`
    follows), with the weights it covers."""
    labels = labels_of(body)
    cands = []
    for head in sorted({h for h, _ in loops(body)}):
        t = trace(body, head, labels, trips)
        n = dots(t[0], rules) if t else 0
        if n > 0 and macs in (None, n):
            cands.append((n, head, t[0], t[1]))
    names = {head: LABEL.match(body[head]).group(1) for _, head, _, _ in cands}
    inner = [
        c
        for c in cands
        if not any(d[0] == c[0] and names[d[1]] in c[3] and len(d[2]) < len(c[2]) for d in cands)
    ]
    if not inner:
        return None
    size = (lambda c: len(c[2])) if macs else (lambda c: -len(c[2]))
    n, head, t, _ = max(inner, key=lambda c: (c[0], size(c), -c[1]))
    return names[head] + ":\n" + "\n".join(t) + "\n", n


def mca(text, cpu):
    """Cycles per iteration of `text` under llvm-mca's model of `cpu` (dotprod only where the
    core has it: not the A72/A53)."""
    attr = [] if cpu in ("cortex-a72", "cortex-a53") else ["-mattr=+dotprod"]
    r = subprocess.run(
        ["llvm-mca", "-mtriple=aarch64", "-mcpu=" + cpu, *attr, "-iterations=200"],
        input=text,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.exit("llvm-mca failed:\n" + r.stderr)
    iters = int(re.search(r"Iterations:\s+(\d+)", r.stdout).group(1))
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    return cycles / iters


def per_256(body, cpu, macs=None, rules=MACS, trips=()):
    hot = hot_loop(body, macs, rules, trips) if body else None
    if hot is None:
        return None
    text, weights = hot
    return round(mca(text, cpu) * 256 / weights, 1)


def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.split("\n") if r.returncode == 0 else names


# ork's M = 1 dotprod kernel of each type, by its demangled v0 name (the build passes
# `-C symbol-mangling-version=v0`: the legacy mangling drops generic arguments, so every
# monomorphisation was named alike and no type could be told apart), and the MACs one pass
# of its hot loop makes (None: the most, as for ggml).
# - 32-weight blocks: `legacy::neon::row_sdot::<F, 1>` (one weight row, one activation row;
#   8 blocks = 256 weights per pass);
# - k-quants: `k_quants::neon::rows_sdot::one::<T>` (T = KType as u8), the shared driver's
#   M = 1 path in a function of its own (an earlier build inlined it beside the M > 1 path,
#   whose single-row tail loop also makes 256 per pass and was picked instead); its loop
#   decodes and multiplies one super-block (256 weights) per pass;
# - F16: `float::neon::fp16::tile::<4, 1>` (four weight rows against the one activation row,
#   what the driver runs at M = 1), the kernel cores with fp16 arithmetic run (the RK3588's);
#   fp16 `fmla`, as ggml's.
_LEG = r"legacy::neon::row_sdot::<[\w\[\]:]*::{}, 1: usize>$"
_KQ = r"k_quants::neon::rows_sdot::one::<{}: u8>$"
ORK = {
    "F16": (r"float::neon::fp16::tile::<4: usize, 1: usize>$", None),
    "Q4_0": (_LEG.format("Q4_0"), None),
    "Q4_1": (_LEG.format("Q4_1"), None),
    "Q5_0": (_LEG.format("Q5_0"), None),
    "Q5_1": (_LEG.format("Q5_1"), None),
    "Q8_0": (_LEG.format("Q8_0"), None),
    "IQ4_NL": (_LEG.format("Iq4Nl"), None),
    "Q2_K": (_KQ.format(0), 256),
    "Q3_K": (_KQ.format(1), 256),
    "Q4_K": (_KQ.format(2), 256),
    "Q5_K": (_KQ.format(3), 256),
    "Q6_K": (_KQ.format(4), 256),
    "IQ4_XS": (_KQ.format(5), 256),
}


# The kernel llama.cpp runs for prefill (M > 1) on the RK3588's A76 (dotprod, no i8mm), and
# the counts of the inner loops its hot pass meets that the code does not state (`trace`),
# from the kernel's source. `ggml_repack_get_optimal_repack_type` (ggml-cpu/repack.cpp) gives
# the CPU_REPACK buffer's types on a NEON dotprod core without i8mm: Q4_0, Q8_0, IQ4_NL as 4
# rows interleaved by 4 bytes (`*_4x4_q8_0`), Q4_K, Q5_K, Q6_K as 8 rows by 4 bytes
# (`*_8x4_q8_K`); its mul_mat then runs `ggml_gemm_*` (ggml-cpu/arch/arm/repack.cpp) on 4
# activation rows at a time. F16 goes to llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp,
# fp16 `fmla` on cores with fp16 arithmetic; its 4 × 6 tile, the main one its `matmul` packs).
# Every other type (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_XS) runs its `ggml_vec_dot_*` row by
# row: the M = 1 figure.
GGML_GEMM = {
    "F16": (r"tinyBLAS<8, __Float16x8_t, .*>::gemm_bloc<4, 6>\(long, long\)$", ()),
    "Q4_0": ("ggml_gemm_q4_0_4x4_q8_0", ()),
    "Q8_0": ("ggml_gemm_q8_0_4x4_q8_0", ()),
    "IQ4_NL": ("ggml_gemm_iq4_nl_4x4_q8_0", ()),
    # Per super-block: the scales of two 32-value halves (`for i < 2`), then four 64-value
    # sub-blocks (`for sb < QK_K / 64`); Q5_K reads its 8 × 16 bytes per sub-block in a loop
    # GCC keeps (`for k < reads_per_sb`); Q6_K's `half` × `sb` loops (4 inside 2).
    "Q4_K": ("ggml_gemm_q4_K_8x4_q8_K", (2, 4)),
    "Q5_K": ("ggml_gemm_q5_K_8x4_q8_K", (2, 8, 4)),
    "Q6_K": ("ggml_gemm_q6_K_8x4_q8_K", (4, 2)),
}

# ork's M > 1 kernel of each type (what `Kernel::rows` runs for m > 1 on a dotprod core):
# - 32-weight blocks: `legacy::neon::entry_sdot::<F>`, the dotprod driver with its tile of 4
#   weight rows × 4 activation rows inlined (`tile_sdot`; a pass is half of 8 blocks: 4 blocks
#   × 4 × 4 × 32 = 2048 multiply-adds), or `tile_sdot::<F>` where LLVM kept it apart;
# - k-quants: `k_quants::neon::rows_sdot::<T>` (the shared driver's M > 1 path; M = 1 runs in
#   `one`, a symbol of its own), or `rows_dot::<T>`, the safe entry, where LLVM inlined it
#   there; its hot loop is the tile over a super-block, four weight rows and four activation
#   rows (the weight rows are decoded once per chunk of activation rows beforehand,
#   `k_quants::drive`, not counted: amortised over the chunk);
# - F16: `float::neon::fp16::tile::<1, 4>` (one weight row, four activation rows).
_LEG_M = r"legacy::neon::(entry|tile)_sdot::<[\w\[\]:]*::{}>$"
_KQ_M = r"k_quants::neon::rows_(s?)dot::<{}: u8>$"
ORK_GEMM = {
    "F16": r"float::neon::fp16::tile::<1: usize, 4: usize>$",
    "Q4_0": _LEG_M.format("Q4_0"),
    "Q4_1": _LEG_M.format("Q4_1"),
    "Q5_0": _LEG_M.format("Q5_0"),
    "Q5_1": _LEG_M.format("Q5_1"),
    "Q8_0": _LEG_M.format("Q8_0"),
    "IQ4_NL": _LEG_M.format("Iq4Nl"),
    "Q2_K": _KQ_M.format(0),
    "Q3_K": _KQ_M.format(1),
    "Q4_K": _KQ_M.format(2),
    "Q5_K": _KQ_M.format(3),
    "Q6_K": _KQ_M.format(4),
    "IQ4_XS": _KQ_M.format(5),
}


# ork's k-quant M > 1 path decodes each weight row into `Super`s once per chunk of activation
# rows before its tile runs (`k_quants::decode_row`, kept out of line for this): the dotprod
# engine's (`Neon<true>`: Q2_K and Q3_K fold their scales, Q3_K and Q6_K go signed), or the
# plain one where LLVM merged the two (the same code). A pass of its loop decodes one
# super-block: 256 weights. The prefill table's ork figure leaves it out; the board clock
# charges it per weight decoded (`ORK_DECODE_CYCLES`).
_DEC = r"k_quants::decode_row::<[\w\[\]:]*::Neon<{}: bool>, {}: u8>$"
ORK_DECODE = {"Q2_K": 0, "Q3_K": 1, "Q4_K": 2, "Q5_K": 3, "Q6_K": 4, "IQ4_XS": 5}
# Bytes a store writes (the decode writes the `Super`).
STORES = [
    (re.compile(r"^\s+(str|stur)\s+q\d+,"), 16),
    (re.compile(r"^\s+stp\s+q\d+, q\d+,"), 32),
    (re.compile(r"^\s+(str|stur)\s+d\d+,"), 8),
    (re.compile(r"^\s+stp\s+d\d+, d\d+,"), 16),
    (re.compile(r"^\s+(str|stur)\s+x\d+,"), 8),
    (re.compile(r"^\s+(str|stur)\s+w\d+,"), 4),
    (re.compile(r"^\s+(strh|sturh)\s+w\d+,"), 2),
    (re.compile(r"^\s+(strb|sturb)\s+w\d+,"), 1),
    (re.compile(r"^\s+st1\s+\{ ?v\d+\.16b ?\},"), 16),
    (re.compile(r"^\s+st1\s+\{ ?v\d+\.16b, v\d+\.16b ?\},"), 32),
    (re.compile(r"^\s+st1\s+\{ ?v\d+\.16b, v\d+\.16b, v\d+\.16b ?\},"), 48),
    (re.compile(r"^\s+st1\s+\{ ?v\d+\.16b, v\d+\.16b, v\d+\.16b, v\d+\.16b ?\},"), 64),
]


def decode_cycles(o, ty, cpu):
    """Cycles per super-block (256 weights) of ork's M > 1 decode of `ty` on `cpu`, or None."""
    if ty not in ORK_DECODE or not o:
        return None
    for dot in ("true", "false"):
        for body in by_name(o, _DEC.format(dot, ORK_DECODE[ty])):
            hot = hot_loop(body, None, STORES)
            if hot is not None:
                text, stored = hot
                if stored < 256:
                    sys.exit(f"{ty}: the decode loop stores {stored} bytes a pass, not a super-block")
                return round(mca(text, cpu), 1)
    return None


def by_name(funcs, pattern):
    """The bodies of the functions of `funcs` whose demangled names match `pattern` (a plain
    symbol is matched whole), out-of-line helpers inlined."""
    if pattern in funcs:
        return [inline_calls(funcs, funcs[pattern])]
    names = list(funcs)
    return [
        inline_calls(funcs, funcs[raw])
        for raw, nice in zip(names, demangle(names))
        if re.search(pattern, nice)
    ]


def first_per_256(bodies, cpu, trips=()):
    """`per_256` of the first of `bodies` that has a hot loop (a wrapper LLVM left without the
    kernel inlined has none); None if none has."""
    for body in bodies:
        v = per_256(body, cpu, None, MACS, trips)
        if v is not None:
            return v
    return None


def gemm_columns(g, o, ty, cpu, vec_dot):
    """(ork's M > 1, ggml's prefill kernel, its name) for `ty` on `cpu`: cycles per 256
    multiply-adds (weights × activation rows); `vec_dot` is ggml's M = 1 figure, the prefill
    kernel of the types llama.cpp does not repack."""
    ork = first_per_256(by_name(o, ORK_GEMM[ty]), cpu) if o and ty in ORK_GEMM else None
    if ty not in GGML_GEMM:
        return ork, vec_dot, "vec_dot"
    pattern, trips = GGML_GEMM[ty]
    bodies = by_name(g, pattern)
    if not bodies:
        sys.exit(f"ggml's prefill kernel {pattern} not found (pass ggml-repack.s, ggml-sgemm.s)")
    name = pattern if pattern.startswith("ggml_") else "tinyBLAS<8, f16>::gemm_bloc<4, 6>"
    return ork, first_per_256(bodies, cpu, trips), name


def inline_calls(funcs, body):
    """`body` with every `bl` to a loop-free function of the file replaced by that function's
    instructions (its `ret` dropped): a helper the compiler kept out of line (ork's k-quant
    `dot_sdot`) is part of the hot loop's work."""
    out = []
    for line in body:
        m = re.match(r"^\s+bl\s+(\S+)\s*$", line)
        callee = funcs.get(m.group(1)) if m else None
        if callee is not None and not loops(callee):
            out += [x for x in callee if re.match(r"^\s+[a-z]", x) and not re.match(r"^\s+ret\b", x)]
        else:
            out.append(line)
    return out


def ork_kernel(funcs, ty):
    """ork's M = 1 dotprod kernel for `ty` (see ORK): its body with out-of-line helpers
    inlined, and the MACs per pass its hot loop must make (None: the most)."""
    pattern, macs, *rules = ORK[ty]
    names = list(funcs)
    for raw, nice in zip(names, demangle(names)):
        if re.search(pattern, nice):
            return inline_calls(funcs, funcs[raw]), macs, (rules or [MACS])[0]
    return None


# ork's attention loops (crates/ork-kernels/src/attend.rs, out of line on aarch64 for this):
# the board clock's cost of ork-exec's attention on the CPU engine (`ORK_ATTENTION_CYCLES`).
ATTN_DIM = 128  # the head size the scores figure is for (Qwen3, Llama 3, Qwen2.5 heads)
FMLA_4S = [(re.compile(r"^\s+fmla\s+v\d+\.4s, v\d+\.4s, v\d+\.(4s|s\[\d\])$"), 4)]
# Bytes a load reads (the softmax loops read each score once).
LOADS = [
    (re.compile(r"^\s+(ldr|ldur)\s+q\d+,"), 16),
    (re.compile(r"^\s+ldp\s+q\d+, q\d+,"), 32),
    (re.compile(r"^\s+(ldr|ldur)\s+d\d+,"), 8),
    (re.compile(r"^\s+ldp\s+d\d+, d\d+,"), 16),
    (re.compile(r"^\s+(ldr|ldur)\s+s\d+,"), 4),
    (re.compile(r"^\s+ldp\s+s\d+, s\d+,"), 8),
]


def call_pass(body, trips):
    """The instructions one call of a function runs, entry to `ret`, its loops run `trips`
    times (in the order the path meets their back branches), as `trace` follows a pass."""
    body = [".Lork_entry:"] + body
    t = trace(body, 0, labels_of(body), trips, to_ret=True)
    return None if t is None else ".Lork_entry:\n" + "\n".join(t[0]) + "\n"


def attention_cycles(o, cpu):
    """ork's attention costs on `cpu`: (scores: cycles per key and query head at a head of
    ATTN_DIM, the whole call of the NEON dot of two heads over four keys / 8; values: cycles
    per multiply-add of the weighted sums' pass over one value row for two heads; softmax:
    cycles per score of the largest, the exponentials and the f64 sum, each loop's vector pass
    per score it reads), or None where a loop is missing."""
    sums = by_name(o, r"attend::neon::sums::<2: usize>$")
    text = call_pass(sums[0], (ATTN_DIM // 8,)) if sums else None
    if text is None or dots(text.splitlines(), FMLA_4S) != 8 * ATTN_DIM:
        return None
    scores = mca(text, cpu) / 8
    ws = by_name(o, r"attend::neon::weighted2$")
    hot = hot_loop(ws[0], None, FMLA_4S) if ws else None
    if hot is None:
        return None
    values = mca(hot[0], cpu) / hot[1]
    softmax = 0.0
    for name in ("row_max", "exp_shifted", "sum_f64"):
        bodies = by_name(o, r"attend::%s$" % name)
        hot = hot_loop(bodies[0], None, LOADS) if bodies else None
        if hot is None:
            return None
        softmax += mca(hot[0], cpu) / (hot[1] / 4)
    return round(scores, 1), round(values, 3), round(softmax, 2)


def attention_table(o, cores, as_json):
    rows = []
    for core, cpu in cores:
        c = attention_cycles(o, cpu)
        if c is None:
            sys.exit("ork's attention loops (ork_kernels::attend) not found in the ork assembly")
        rows.append({"core": core, "scores": c[0], "values": c[1], "softmax": c[2]})
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print(f"ork's attention loops, llvm-mca estimate (not a measurement): scores in cycles per")
    print(f"key and query head at a head of {ATTN_DIM}, values in cycles per multiply-add,")
    print("softmax in cycles per score")
    print(f"{'core':4} {'scores':>7} {'values':>7} {'softmax':>8}")
    for r in rows:
        print(f"{r['core']:4} {r['scores']:>7.1f} {r['values']:>7.3f} {r['softmax']:>8.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml", required=True, action="append")
    ap.add_argument("--ork")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--gemm", action="store_true", help="print the prefill (M > 1) table")
    ap.add_argument("--cores", choices=["rk3588", "rk3576"], default="rk3588")
    ap.add_argument("--attention", action="store_true", help="print ork's attention loops")
    a = ap.parse_args()
    cores = CORES_RK3576 if a.cores == "rk3576" else CORES
    if a.attention:
        return attention_table(functions(a.ork) if a.ork else {}, cores, a.json)
    g = {}
    for path in a.ggml:
        g.update(functions(path))
    o = functions(a.ork) if a.ork else {}
    rows = []
    for ty, suffix in TYPES:
        gbody = g.get("ggml_vec_dot_" + suffix)
        if gbody is None:
            sys.exit(f"ggml_vec_dot_{suffix} not found in {a.ggml}")
        obody, omacs, orules = (ork_kernel(o, ty) if o else None) or (None, None, MACS)
        grules = MACS
        if a.cores == "rk3576":
            grules = MACS_NEON_F16 if ty == "F16" else MACS_NEON
        for core, cpu in cores:
            ork = per_256(obody, cpu, omacs, orules)
            ggml = per_256(gbody, cpu, None, grules)
            row = {"type": ty, "core": core, "ork": ork, "ggml": ggml}
            if a.cores == "rk3588":
                og, gg, kernel = gemm_columns(g, o, ty, cpu, ggml)
                row.update({"ork_gemm": og, "ggml_gemm": gg, "ggml_gemm_kernel": kernel,
                            "ork_decode": decode_cycles(o, ty, cpu)})
            rows.append(row)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
    if a.gemm:
        print("cycles per 256 multiply-adds (weights x activation rows) of the prefill (M > 1)")
        print("kernels, llvm-mca estimate (not a measurement)")
        print("(decode: ork's k-quant weight decode, cycles per 256 weights decoded, paid once")
        print("per weight row and chunk of activation rows: not in the ork column)")
        print(f"{'type':8} {'core':4} {'ork':>8} {'ggml':>8} {'ork/ggml':>9} {'decode':>7}"
              "  ggml kernel")
        for r in rows:
            og, gg = r["ork_gemm"], r["ggml_gemm"]
            print(f"{r['type']:8} {r['core']:4} {fmt(og):>8} {fmt(gg):>8} {ratio(og, gg):>9}"
                  f" {fmt(r['ork_decode']):>7}  {r['ggml_gemm_kernel']}")
        return
    print("cycles per 256 weights, llvm-mca estimate (not a measurement)")
    print(f"{'type':8} {'core':4} {'ork':>8} {'ggml':>8} {'ork/ggml':>9}")
    for r in rows:
        print(f"{r['type']:8} {r['core']:4} {fmt(r['ork']):>8} {fmt(r['ggml']):>8} "
              f"{ratio(r['ork'], r['ggml']):>9}")


if __name__ == "__main__":
    main()
