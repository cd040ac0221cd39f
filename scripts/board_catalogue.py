#!/usr/bin/env python3
"""Will it run on my board? Projected TTFT and decode speed of published models' shapes on the
board presets, from `ork plan --project` on sparse GGUFs of those shapes (no download: the
tensor data is a hole in the file). Every figure is PROJECTED by the board clock
(docs/board-model.md), never measured on a board. Not part of the tests.

Usage: scripts/board_catalogue.py [--ork target/release/ork]
       [--sparse target/release/examples/sparse_model] [--json]
Build first: cargo build --release -p ork-cli && cargo build --release -p ork-testkit --example sparse_model

Placement, per model and board, as a user would choose it: resident across as many 4 GiB IOMMU
domains as the int8 weights need (`--domains 8 --budget-mb 4096`) when the weights and 1.5 GiB
fit the board's RAM (1 GiB for the system, the board clock's own allowance, and 0.5 GiB for
ork's process, its KV cache and activations: a judgment, not a measurement); otherwise
streamed through one 3 GiB budget (`--domains 1 --budget-mb 3072`), the rest of the RAM being
page cache over the NVMe drive. w8a8 per channel (the RK3588's int8 type; the RK3576 also with
w4a16, int4 weights), 128 prompt tokens, 64 generated.
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
    a = ap.parse_args()
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
