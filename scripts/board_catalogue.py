#!/usr/bin/env python3
"""Will it run on my board? Projected TTFT and decode speed of published models' shapes on the
board presets, from `ork plan --project` on sparse GGUFs of those shapes (no download: the
tensor data is a hole in the file). Every figure is PROJECTED by the board clock
(docs/board-model.md), never measured on a board. Not part of the tests.

Usage: scripts/board_catalogue.py [--engines] [--ork target/release/ork]
       [--sparse target/release/examples/sparse_model] [--json]
Build first: cargo build --release -p ork-cli && cargo build --release -p ork-testkit --example sparse_model

Placement, per model and board, as a user would choose it: resident across as many 4 GiB IOMMU
domains as the int8 weights need (`--domains 8 --budget-mb 4096`) when the weights and 1.5 GiB
fit the board's RAM (1 GiB for the system, the board clock's own allowance, and 0.5 GiB for
ork's process, its KV cache and activations: a judgment, not a measurement); otherwise
streamed through one 3 GiB budget (`--domains 1 --budget-mb 3072`), the rest of the RAM being
page cache over the NVMe drive. w8a8 per channel (the RK3588's int8 type; the RK3576 also with
w4a16, int4 weights), 128 prompt tokens, 64 generated.

`--engines` prints the second table of docs/board-model.md instead: each model as 4-bit and 3-bit
GGUFs (shapes only), every pairing of the NPU (int8 from the pack) and the CPU (the file's bits)
for prefill and decode (the row split among them: npu/split, cpu/split), the one `ork plan
--project` chooses, and the goals of issue 38 with the physical ceiling (bytes one token reads /
the board's DDR rate) beside each projection, and the row-split decode (`projected.split_decode`:
each dense matmul's rows split between the NPU and the CPU on one DDR bus, each weight at its own
share; built: `--decode-device split`) beside the best single engine. The
placement is the plan's own (`--domains` left to `--project`: resident across as many domains as
the int8 weights need when they fit the RAM beside 1.5 GiB, else streamed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# (name, n_layer, d_model, ffn, n_head, n_head_kv, head_dim, vocab): each model's config.json on
# its publisher's model page (num_hidden_layers, hidden_size, intermediate_size,
# num_attention_heads, num_key_value_heads, hidden_size / num_attention_heads or head_dim,
# vocab_size).
MODELS = [
    ("Qwen2.5-0.5B", 24, 896, 4864, 14, 2, 64, 151936),
    ("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 128, 151936),
    ("Qwen2.5-3B", 36, 2048, 11008, 16, 2, 128, 151936),
    ("Llama-3.2-3B", 28, 3072, 8192, 24, 8, 128, 128256),
    ("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 128, 152064),
    ("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256),
    ("Qwen2.5-14B", 48, 5120, 13824, 40, 8, 128, 152064),
    ("Qwen2.5-32B", 64, 5120, 27648, 40, 8, 128, 152064),
]
# (preset, soc, RAM GiB, quantization): crates/ork-board/src/params.rs PRESETS; the RK3576 also
# with w4a16 (int4 weights, fp16 activations), a type the RK3588 lacks (docs/chip.md).
BOARDS = [
    ("orangepi5-8g", "rk3588", 8, "w8a8"),
    ("orangepi5-16g", "rk3588", 16, "w8a8"),
    ("rock5b-16g", "rk3588", 16, "w8a8"),
    ("orangepi5-32g", "rk3588", 32, "w8a8"),
    ("rk3576-8g", "rk3576", 8, "w8a8"),
    ("rk3576-8g", "rk3576", 8, "w4a16"),
]
GIB = 1 << 30
ALLOWANCE = 3 * GIB // 2

# File classes of --engines: (label, block type, output type or "tied"). A class stands for
# llama.cpp's mix by its main type: Q4_K_M also puts some attn_v / ffn_down at Q6_K and Q3_K_S
# some at Q4_K, so these files are slightly smaller than the real ones (stated in the docs).
FILES = [("Q4_0", "Q4_0", "Q6_K"), ("Q4_K_M-class", "Q4_K", "Q6_K"), ("Q3_K_S-class", "Q3_K", "Q6_K")]
# (name, dims, file class, board, goal): issue 38's goals table. Gemma 3 1B runs as a llama shape
# (google/gemma-3-1b-it config.json: 26, 1152, 6912, 4/1 heads of 256, vocab 262144, tied; its
# sliding window does not bind at 512 positions); Qwen3-30B-A3B as a llama MoE of its dims
# (config.json: 48 blocks, 2048, expert FFN 768, 32/4 heads of 128, vocab 151936, 128 experts,
# top-8; q/k norms not modelled). Q4_0 files: Gemma's tied output is Q8_0 in llama.cpp's quantizer
# (1152 is not a multiple of 256), written so here.
GEMMA = ("Gemma-3-1B", (26, 1152, 6912, 4, 1, 256, 262144), None)
QWEN3 = ("Qwen3-30B-A3B", (48, 2048, 768, 32, 4, 128, 151936), "128:8")
GOALS = [
    (GEMMA, ("Q4_0", "Q4_0", "tied"), "orangepi5-16g", 512, "decode >= 28.3 tok/s, TTFT(512) <= 1.35 s",
     lambda d, t: d >= 28.3 and t <= 1.35),
    (("Qwen2.5-1.5B", (28, 1536, 8960, 12, 2, 128, 151936), None), ("Q4_0", "Q4_0", "Q6_K"),
     "orangepi5-16g", 128, "decode >= 21.7 tok/s (1.3 x 16.7), TTFT(128) <= 0.378 s",
     lambda d, t: d >= 1.3 * 16.7 and t <= 0.378),
    (("Llama-3.1-8B", (32, 4096, 14336, 32, 8, 128, 128256), None), ("Q4_0", "Q4_0", "Q6_K"),
     "orangepi5-8g", 128, "decode >= 4 tok/s", lambda d, t: d >= 4),
    (QWEN3, ("Q3_K_S-class", "Q3_K", "Q6_K"), "orangepi5-16g", 512,
     "decode >= 12 tok/s, TTFT(512) <= 8 s", lambda d, t: d >= 12 and t <= 8),
    (QWEN3, ("Q4_K_M-class", "Q4_K", "Q6_K"), "orangepi5-16g", 128, "decode >= 5 tok/s",
     lambda d, t: d >= 5),
    (QWEN3, ("Q4_K_M-class", "Q4_K", "Q6_K"), "orangepi5-32g", 128, "decode >= 10 tok/s",
     lambda d, t: d >= 10),
    (QWEN3, ("Q3_K_S-class", "Q3_K", "Q6_K"), "pi5-16g", 512, "hold-out: llama.cpp tg128 7.99, pp512 10.91",
     lambda d, t: True),
]
ENGINE_BOARDS = ["orangepi5-8g", "orangepi5-16g", "orangepi5-32g", "rk3576-8g", "pi5-16g"]


def soc_of(board):
    """The NPU chip `ork plan --soc` needs for a preset (the CPU-only pi5-16g takes rk3588's)."""
    return "rk3576" if board.startswith("rk3576") else "rk3588"


def sparse(tool, path, dims, ty, out, experts):
    args = [tool, path, *map(str, dims), ty, out] + ([experts] if experts else [])
    subprocess.run(args, check=True)


def plan_engines(ork, model, board, prompt, gen):
    """`ork plan --project BOARD --json` with the plan's own placement; its projection."""
    out = subprocess.run(
        [ork, "plan", "--model", model, "--soc", soc_of(board), "--project",
         board, "--prompt-tokens", str(prompt), "--gen-tokens", str(gen), "--json"],
        capture_output=True, text=True)
    if out.returncode not in (0, 1) or not out.stdout:
        sys.exit(f"ork plan failed for {model} on {board}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def pairing(a):
    """A pairing with its CPU cores and NPU holdings: `cpu/split (all, dense)`."""
    on = [x for x in (a.get("cores"), a.get("npu_holds") and f"npu {a['npu_holds']}") if x]
    return f"{a['prefill']}/{a['decode']}" + (f" ({', '.join(on)})" if on else "")


def cell(p):
    j = p["projected"]
    e = j["engines"]
    keys = ("prefill", "decode", "cores", "npu_holds")
    best = next(a for a in j["alternatives"] if all(a.get(k) == e.get(k) for k in keys))
    return best, j


def engines_tables(a):
    splits = []
    with tempfile.TemporaryDirectory() as tmp:
        print("PROJECTED (board clock; CPU model "
              "cpu-0.1: decode fitted on llama.cpp's RK3588 rows, see docs). Cell: chosen "
              "prefill/decode engines (the CPU's cores: big or all; what the NPU holds: pack or dense) · TTFT(128) s · decode tok/s (ceiling: bytes per token / DDR).")
        print("| model | file | GB | " + " | ".join(ENGINE_BOARDS) + " |")
        print("|---|---|---:|" + "---|" * len(ENGINE_BOARDS))
        models = [(n, tuple(d), None) for n, *d in MODELS] + [QWEN3]
        for name, dims, experts in models:
            for label, ty, out in FILES:
                path = os.path.join(tmp, "m.gguf")
                sparse(a.sparse, path, dims, ty, out, experts)
                cells, gb = [], 0
                for board in ENGINE_BOARDS:
                    best, j = cell(plan_engines(a.ork, path, board, 128, 64))
                    gb = j["cpu"]["file_bytes"] / 1e9
                    cells.append(f"{pairing(best)} · {best['ttft_s']:.2f} · "
                                 f"{best['decode_tok_s']:.2f} ({j['cpu']['ceiling_tok_s']:.1f})")
                    sp = j.get("split_decode")
                    if sp:
                        splits.append((name, label, board, sp))
                os.remove(path)
                print(f"| {name} | {label} | {gb:.1f} | " + " | ".join(cells) + " |")
        print()
        print("Row-split decode (projected; `projected.split_decode`, built: --decode-device "
              "split): each dense matmul's rows split between the NPU (int8) and the CPU (file "
              "bits) on one DDR bus, each weight at its own share. Cell: split tok/s · best "
              "single engine tok/s · gain (NPU row share by int8 bytes).")
        print("| model | file | " + " | ".join(b for b in ENGINE_BOARDS if b != "pi5-16g") + " |")
        print("|---|---|" + "---|" * (len(ENGINE_BOARDS) - 1))
        for name, label in dict.fromkeys((n, l) for n, l, _, _ in splits):
            row = []
            for board in ENGINE_BOARDS[:-1]:
                sp = next((x[3] for x in splits if x[:3] == (name, label, board)), None)
                row.append("–" if sp is None else
                           f"{sp['decode_tok_s']:.2f} · {sp['best_single_engine_decode_tok_s']:.2f} · "
                           f"{sp['gain']:.2f}× ({sp['npu_row_share']:.2f})")
            print(f"| {name} | {label} | " + " | ".join(row) + " |")
        best = max(splits, key=lambda x: x[3]["gain"], default=None)
        if best:
            print(f"\nlargest split gain: {best[0]} {best[1]} on {best[2]}: {best[3]['gain']:.2f}x "
                  f"(issue 38's bar: 1.15x)")
        print()
        print("| model file (shapes) | board | goal | chosen | TTFT | decode tok/s | ceiling tok/s | "
              "npu/npu | cpu/cpu | met? |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        choices = []
        for (name, dims, experts), (label, ty, out), board, prompt, goal, met in GOALS:
            path = os.path.join(tmp, "g.gguf")
            sparse(a.sparse, path, dims, ty, out, experts)
            best, j = cell(plan_engines(a.ork, path, board, prompt, 128))
            os.remove(path)
            # The engines alone: npu/npu, and cpu/cpu on the big cores (llama.cpp's taskset).
            alone = {f"{x['prefill']}/{x['decode']}": x for x in j["alternatives"]
                     if x.get("cores") in (None, "big")}
            fmt = lambda k: (f"{alone[k]['ttft_s']:.2f} s · {alone[k]['decode_tok_s']:.2f}"
                             if k in alone else "–")
            ok = "yes" if met(best["decode_tok_s"], best["ttft_s"]) else "**no**"
            print(f"| {name} {label} | {board} | {goal} | {pairing(best)} | "
                  f"{best['ttft_s']:.2f} s | {best['decode_tok_s']:.2f} | "
                  f"{j['cpu']['ceiling_tok_s']:.1f} | {fmt('npu/npu')} | {fmt('cpu/cpu')} | {ok} |")
            choices.append((f"{name} {label}", board, j))
        print()
        choices_table(choices)


def bounds_text(b):
    """A decode step's parts, ms: compute by type, DDR and storage reads, attention, fixed."""
    parts = [f"{t} compute {s * 1e3:.1f}" for t, s in b["compute_s"]]
    for key, what in (("ddr_read_s", "DDR reads"), ("storage_read_s", "storage reads"),
                      ("attention_s", "attention"), ("fixed_s", "per-block fixed")):
        if b[key] > 0:
            parts.append(f"{what} {b[key] * 1e3:.1f}")
    return f"{b['step_s'] * 1e3:.1f} ms = " + " + ".join(parts)


def choices_table(choices):
    """`projected.options` of each goal row: what ork runs or is building, projected."""
    print("Execution choices beside the pairing (`projected.options`; PROJECTED). Cell: TTFT s · "
          "decode tok/s; the decode step's parts for the CPU choices.")
    print("| model file (shapes) | board | choice | status | TTFT | decode tok/s | ceiling tok/s | "
          "decode step (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for model, board, j in choices:
        for o in j.get("options") or []:
            ttft = "as chosen" if o["ttft_s"] is None else f"{o['ttft_s']:.2f} s"
            parts = bounds_text(o["decode_bounds"]) if o.get("decode_bounds") else "–"
            print(f"| {model} | {board} | {o['mode']} | {o['status']} | {ttft} | "
                  f"{o['decode_tok_s']:.2f} | {j['cpu']['ceiling_tok_s']:.1f} | {parts} |")


def plan(ork, model, board, soc, quant, domains, budget_mb):
    out = subprocess.run(
        [ork, "plan", "--model", model, "--soc", soc, "--quant", quant, "--domains", str(domains),
         "--budget-mb", str(budget_mb), "--project", board, "--prompt-tokens", "128",
         "--gen-tokens", "64", "--json"],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ork plan failed for {model} on {board}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ork", default="target/release/ork")
    ap.add_argument("--sparse", default="target/release/examples/sparse_model")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--engines", action="store_true")
    a = ap.parse_args()
    if a.engines:
        engines_tables(a)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, *dims in MODELS:
            path = os.path.join(tmp, f"{name}.gguf")
            subprocess.run([a.sparse, path, *map(str, dims)], check=True)
            for board, soc, ram, quant in BOARDS:
                p = plan(a.ork, path, board, soc, quant, 8, 4096)
                left = ram * GIB - p["model_bytes"] - ALLOWANCE
                fits = p["mode"] == "resident" and left >= 0
                if fits:
                    where = f"resident, {p['domains_used']} domain(s)"
                else:
                    p = plan(a.ork, path, board, soc, quant, 1, 3072)
                    where = "streamed, 3 GiB budget"
                j = p["projected"]
                rows.append({
                    "model": name, "board": board, "quant": quant,
                    "weights_gb": p["model_bytes"] / 1e9,
                    "placement": where, "ram_left_gb": left / 1e9, "ttft_s": j["ttft_s"], "decode_tok_s": j["decode_tok_s"],
                    "storage_gb_per_token": j["storage_bytes"] / 1e9 / max(j["passes"], 1),
                    "label": j["label"], "model_version": j["model_version"],
                })
            os.remove(path)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"PROJECTED by the board clock {rows[0]['model_version']}; per-channel scales, 128 "
          "prompt tokens, 64 new. Cell: decode tok/s · TTFT s · placement (R n: resident in n domains; "
          "S: streamed through a 3 GiB budget, NVMe GB read per pass).")
    cols = [(b[0], b[3]) for b in BOARDS]
    print("| model | int8 weights | " + " | ".join(f"{b} {q}" for b, q in cols) + " |")
    print("|---|---:|" + "---|" * len(cols))
    for name, *_ in MODELS:
        cells = []
        for b, q in cols:
            r = next(r for r in rows
                     if r["model"] == name and r["board"] == b and r["quant"] == q)
            if r["placement"].startswith("resident"):
                where = "R " + r["placement"].split(", ")[1].split()[0]
            else:
                where = f"S, {r['storage_gb_per_token']:.1f} GB"
            cells.append(f"{r['decode_tok_s']:.2f} · {r['ttft_s']:.2f} s · {where}")
        w = next(r["weights_gb"] for r in rows if r["model"] == name and r["quant"] == "w8a8")
        print(f"| {name} | {w:.1f} GB | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
