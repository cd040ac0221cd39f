#!/usr/bin/env bash
# MoE experts from the page cache (issue 38 item 3; docs/moe.md, "The CPU engine: experts from
# the page cache"): the decode stall of `ork run --device cpu` on a MoE model larger than a
# memory cgroup's limit, with expert readahead (router-driven + next-block prediction) and
# without it (--no-prefetch --no-speculate), and their ratio; fails above ORK_RA_MAX_RATIO.
# Needs root (a memory cgroup). A .ci/run stage (ORK_RA_TOKENS=16 ORK_RA_ROUNDS=5).
#
#   scripts/moe-readahead.sh [ORK_BINARY]        (default target/debug/ork, as .ci/run has it)
#
# Environment: ORK_RA_LIMIT_MB (cgroup limit, default 192), ORK_RA_TOKENS (decode tokens,
# default 32), ORK_RA_ROUNDS (rounds, default 2; the median is used), ORK_RA_MAX_RATIO (fail
# above it, default 0.5), ORK_MODEL (the real SmolLM2 the fixture is made from), ORK_RA_DIR
# (where the model is written; default a fresh dir under /var/tmp: real storage, not tmpfs, so
# that dropped pages must be read back from disk).
#
# The model: ork-testkit's upcycled SmolLM2 with 8 perturbed experts per block (426 MiB on
# disk, ~400 MiB of it experts, top-2), made into the temp dir. A round runs, in this order:
# the file cached and no limit ("warm"), then under the limit readahead off, then on, the
# file's pages dropped from the page cache (posix_fadvise DONTNEED) before each limited run.
# Stall per token = a limited run's decode seconds per token minus the same round's warm
# run's; the round's ratio = stall on / stall off. The gate is the median of the rounds'
# ratios (runs close in time see the same load; other builds on the machine move the speed).
#
# Without a memory cgroup (not root, or no memory controller) there is no fallback: an
# outside posix_fadvise(DONTNEED) between tokens does not stand in for a limit, because it
# leaves the pages ork has mapped in the page cache (measured: a 64 MiB mapped, touched file
# stays 64 MiB resident after DONTNEED, and drops to 16 MiB once unmapped). It exits 3 (.ci/run says so and goes on; every other failure exits 1 or 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK="${1:-target/debug/ork}"
LIMIT_MB="${ORK_RA_LIMIT_MB:-192}"
TOKENS="${ORK_RA_TOKENS:-32}"
ROUNDS="${ORK_RA_ROUNDS:-2}"
MAX_RATIO="${ORK_RA_MAX_RATIO:-0.5}"
[ "$ROUNDS" -ge 1 ] || { echo "error: ORK_RA_ROUNDS must be at least 1" >&2; exit 2; }
[ -x "$ORK" ] || { echo "error: $ORK not found: build it (cargo build -p ork-cli)" >&2; exit 2; }
no_cgroup() {
  echo "error: no memory cgroup ($1): the stall cannot be measured (posix_fadvise DONTNEED leaves ork's mapped pages cached, so it is no stand-in; see the script's header)" >&2
  exit 3
}
[ "$(id -u)" = 0 ] || no_cgroup "needs root"
export ORK_MODEL="${ORK_MODEL:-$(./scripts/fetch-model.sh)}"

DIR="${ORK_RA_DIR:-$(mktemp -d /var/tmp/ork-moe-readahead.XXXXXX)}"
CG=""
cleanup() {
  if [ -n "$CG" ] && [ -d "$CG" ]; then
    rmdir "$CG" 2>/dev/null || true
  fi
  [ -n "${ORK_RA_DIR:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT

echo "== making the MoE model in $DIR" >&2
# The test profile: .ci/run's tests have built the example with it already.
MODEL="$(cargo run -q --locked --profile test -p ork-testkit --example moe_fixtures -- perturbed "$DIR")"
SIZE_MB=$(( $(stat -c %s "$MODEL") >> 20 ))
[ "$SIZE_MB" -gt "$LIMIT_MB" ] || { echo "error: model ${SIZE_MB} MiB is not above the ${LIMIT_MB} MiB limit" >&2; exit 2; }
FS="$(stat -f -c %T "$DIR")"
[ "$FS" != tmpfs ] && [ "$FS" != ramfs ] || { echo "error: $DIR is on $FS: the model must be on storage" >&2; exit 2; }

# A child memory cgroup: v2's memory.max where v2 is mounted, else v1's memory controller.
make_cgroup() {
  local limit=$(( LIMIT_MB << 20 )) parent
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    KIND="cgroup v2 memory.max"
    # Under this process's cgroup, else under the root: v2 gives a child the memory controller
    # only if its parent has it in cgroup.subtree_control, which a cgroup holding processes
    # cannot (the no-internal-process rule).
    for parent in "/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)" /sys/fs/cgroup; do
      parent="${parent%/}"
      grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null \
        || echo +memory > "$parent/cgroup.subtree_control" 2>/dev/null || continue
      CG="$parent/ork-readahead-$$"
      mkdir "$CG" 2>/dev/null || { CG=""; continue; }
      echo "$limit" > "$CG/memory.max" 2>/dev/null && return 0
      rmdir "$CG" 2>/dev/null || true
      CG=""
    done
    return 1
  fi
  KIND="cgroup v1 memory.limit_in_bytes"
  CG="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)/ork-readahead-$$"
  mkdir "$CG" 2>/dev/null || { CG=""; return 1; }
  echo "$limit" > "$CG/memory.limit_in_bytes" 2>/dev/null && return 0
  rmdir "$CG" 2>/dev/null || true
  CG=""
  return 1
}
make_cgroup || no_cgroup "cannot make a child cgroup with a memory limit (${KIND:-no cgroup mounted})"

drop() { python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$MODEL"; }
# One run's JSON.
run() { # $1: in-cgroup (1/0), rest: extra flags
  local in_cg="$1"; shift
  local cmd=("$ORK" run --model "$MODEL" --device cpu --threads 2 -n "$TOKENS"
    --prompt "The capital of France is" --json "$@")
  if [ "$in_cg" = 1 ]; then
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "${cmd[@]}"
  else
    "${cmd[@]}"
  fi
}
field() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(eval(sys.argv[1]))' "$1"; }

echo "== $KIND = $LIMIT_MB MiB; model $SIZE_MB MiB on $FS; $TOKENS decode tokens; $ROUNDS rounds; ork $ORK" >&2
tokens=""
rows=()
for r in $(seq "$ROUNDS"); do
  cat "$MODEL" > /dev/null
  out=$(run 0)
  warm=$(field 'd["decode_tok_s"]' <<<"$out")
  [ -n "$tokens" ] || tokens=$(field 'd["tokens"]' <<<"$out")
  row="$warm"
  for arm in off on; do
    drop
    if [ $arm = off ]; then out=$(run 1 --no-prefetch --no-speculate); else out=$(run 1); fi
    t=$(field 'd["decode_tok_s"]' <<<"$out")
    [ "$(field 'd["tokens"]' <<<"$out")" = "$tokens" ] || { echo "error: readahead $arm changed the tokens" >&2; exit 1; }
    ex=$(field 'd["cpu_experts"]' <<<"$out")
    echo "round $r: warm $warm tok/s, readahead $arm $t tok/s | $ex" >&2
    row="$row $t"
  done
  rows+=("$row")
  last_on="$out"
done

printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, sys
kind, limit, size, max_ratio = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ex = json.loads(sys.argv[5])["cpu_experts"]
opt = lambda v: "none" if v is None else f"{v:.2f}"
ratios, stalls = [], []
for n, line in enumerate(sys.stdin, 1):
    warm, off, on = map(float, line.split())
    s_off, s_on = 1e3 / off - 1e3 / warm, 1e3 / on - 1e3 / warm
    if s_off <= 0:
        sys.exit(f"error: round {n}: no stall without readahead: the limit does not make the run read from storage")
    ratios.append(s_on / s_off)
    stalls.append((s_off, s_on))
    print(f"round {n}: warm {warm:.2f} tok/s, off {off:.2f} tok/s (stall {s_off:.1f} ms/token), "
          f"on {on:.2f} tok/s (stall {s_on:.1f} ms/token): ratio {s_on / s_off:.2f}")
ratio = statistics.median(ratios)
print(f"{kind} {limit} MiB, model {size} MiB: stall ratio (readahead on / off, median of {len(ratios)} rounds) "
      f"{ratio:.2f} (goal <= {max_ratio}); median stall off {statistics.median(s for s, _ in stalls):.1f} ms/token, "
      f"on {statistics.median(s for _, s in stalls):.1f} ms/token")
skew, recall, predictions = ex.get("router_skew"), ex.get("recall"), ex.get("predictions")
kept, released, ahead = (ex.get(k, 0) / 2**20 for k in ("keep_bytes", "released_bytes", "readahead_bytes"))
print(f"router skew {opt(skew)}, next-block prediction recall {opt(recall)} ({predictions} predictions); "
      f"experts kept after use {kept:.1f} MiB, released {released:.0f} MiB, read ahead {ahead:.0f} MiB")
sys.exit(0 if ratio <= max_ratio else 1)
' "$KIND" "$LIMIT_MB" "$SIZE_MB" "$MAX_RATIO" "$last_on"
