#!/usr/bin/env bash
# MoE experts from the page cache (issue 38 item 3; docs/moe.md, "The CPU engine: experts from
# the page cache"): the decode stall of `ork run --device cpu` on a MoE model larger than a
# memory cgroup's limit, with expert readahead (router-driven + next-block prediction) and
# without it (--no-prefetch --no-speculate), and their ratio. Needs root (a memory cgroup).
#
#   scripts/moe-readahead.sh [ORK_BINARY]        (default target/debug/ork, as .ci/run builds)
#
# Environment: ORK_RA_LIMIT_MB (cgroup limit, default 192), ORK_RA_TOKENS (decode tokens,
# default 32), ORK_RA_ROUNDS (rounds per arm, default 2; the median is used),
# ORK_RA_MAX_RATIO (fail above it, default 0.5), ORK_MODEL (the real SmolLM2 the fixture is
# made from), ORK_RA_DIR (where the model is written; default a fresh dir under /var/tmp:
# real storage, not tmpfs, so that dropped pages must be read back from disk).
#
# The model: ork-testkit's upcycled SmolLM2 with 8 perturbed experts per block (447 MB on
# disk, ~400 MB of it experts, top-2), made into the temp dir. Before every run its pages are
# dropped from the page cache (posix_fadvise DONTNEED on the file). Stall per token = the
# run's decode seconds per token minus those of a run with the file cached and no limit
# (same binary, same tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK="${1:-target/debug/ork}"
LIMIT_MB="${ORK_RA_LIMIT_MB:-192}"
TOKENS="${ORK_RA_TOKENS:-32}"
ROUNDS="${ORK_RA_ROUNDS:-2}"
MAX_RATIO="${ORK_RA_MAX_RATIO:-0.5}"
[ -x "$ORK" ] || { echo "error: $ORK not found: build it (cargo build -p ork-cli)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "error: needs root to make a memory cgroup" >&2; exit 2; }
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
MODEL="$(cargo run -q -p ork-testkit --example moe_fixtures -- perturbed "$DIR")"
SIZE_MB=$(( $(stat -c %s "$MODEL") >> 20 ))
[ "$SIZE_MB" -gt "$LIMIT_MB" ] || { echo "error: model ${SIZE_MB} MiB is not above the ${LIMIT_MB} MiB limit" >&2; exit 2; }

# A child memory cgroup: v2's memory.max where v2 is mounted, else v1's memory controller.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)/ork-readahead-$$"
  mkdir "$CG"
  echo $(( LIMIT_MB << 20 )) > "$CG/memory.max"
  KIND="cgroup v2 memory.max"
else
  base="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  CG="$base/ork-readahead-$$"
  mkdir "$CG"
  echo $(( LIMIT_MB << 20 )) > "$CG/memory.limit_in_bytes"
  KIND="cgroup v1 memory.limit_in_bytes"
fi

drop() { python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$MODEL"; }
# One run: prints "DECODE_TOK_S TOKENS_CHECKSUM JSON".
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

echo "== $KIND = $LIMIT_MB MiB; model $SIZE_MB MiB; $TOKENS decode tokens; ork $ORK" >&2
cat "$MODEL" > /dev/null
warm=$(run 0); warm_tps=$(field 'd["decode_tok_s"]' <<<"$warm")
tokens=$(field 'd["tokens"]' <<<"$warm")
echo "warm (file cached, no limit): $warm_tps tok/s" >&2

declare -A tps
for arm in off on; do
  vals=()
  for r in $(seq "$ROUNDS"); do
    drop
    if [ $arm = off ]; then out=$(run 1 --no-prefetch --no-speculate); else out=$(run 1); fi
    t=$(field 'd["decode_tok_s"]' <<<"$out")
    got=$(field 'd["tokens"]' <<<"$out")
    [ "$got" = "$tokens" ] || { echo "error: readahead $arm changed the tokens" >&2; exit 1; }
    ex=$(field 'd.get("cpu_experts")' <<<"$out")
    echo "readahead $arm, round $r: $t tok/s | $ex" >&2
    vals+=("$t")
  done
  tps[$arm]=$(printf '%s\n' "${vals[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
done

python3 - "$warm_tps" "${tps[off]}" "${tps[on]}" "$MAX_RATIO" "$KIND" "$LIMIT_MB" "$SIZE_MB" <<'EOF'
import sys
warm, off, on, max_ratio = map(float, sys.argv[1:5])
kind, limit, size = sys.argv[5:8]
s_off = 1e3 / off - 1e3 / warm
s_on = 1e3 / on - 1e3 / warm
ratio = s_on / s_off if s_off > 0 else float("nan")
print(f"{kind} {limit} MiB, model {size} MiB: decode warm {warm:.2f} tok/s, "
      f"limited without readahead {off:.2f} tok/s (stall {s_off:.1f} ms/token), "
      f"with readahead {on:.2f} tok/s (stall {s_on:.1f} ms/token): ratio {ratio:.2f} (goal <= {max_ratio})")
if s_off <= 0:
    print("error: no stall without readahead: the limit does not make the run read from storage", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if ratio <= max_ratio else 1)
EOF
