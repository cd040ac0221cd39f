#!/usr/bin/env bash
# A fleet on one machine (issue 40, docs/fleet.md): HAProxy (packaging/haproxy/ork.cfg) in front
# of 3 `ork serve` replicas of SmolLM2 on loopback ports, driven by the official `openai` client
# (scripts/fleet_load.py: steady load with affinity and /metrics checks, a rolling restart with
# 0 failed requests, a SIGKILL whose only failures are its own streams). Also checks the k8s
# manifests (scripts/k8s_check.py) and the HAProxy file (`haproxy -c`).
# Usage: scripts/fleet-test.sh [ORK_BINARY]   (default: target/release/ork, else target/debug/ork)
# Needs haproxy (installed with apt-get when run as root), python3 with openai, kubernetes, pyyaml
# (installed with pip if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
model=${ORK_MODEL:-$PWD/.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
ork=${1:-}
if [ -z "$ork" ]; then
  for b in target/release/ork target/debug/ork; do [ -x "$b" ] && { ork=$b; break; }; done
fi
[ -n "$ork" ] && [ -x "$ork" ] || { echo "fleet-test: no ork binary: cargo build --release -p ork-cli" >&2; exit 2; }
[ -r "$model" ] || { echo "fleet-test: cannot read the model $model (scripts/fetch-model.sh)" >&2; exit 2; }
if ! command -v haproxy >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >&2 \
        || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >&2; }; } \
      || { echo "fleet-test: apt-get install haproxy failed" >&2; exit 2; }
  else
    echo "fleet-test: haproxy is missing: sudo apt-get install haproxy" >&2; exit 2
  fi
fi
for mod in openai kubernetes yaml; do
  if ! python3 -c "import $mod" >/dev/null 2>&1; then
    pkg=$mod; [ "$mod" = yaml ] && pkg=pyyaml
    python3 -m pip install --quiet --disable-pip-version-check "$pkg" >&2 \
      || { echo "fleet-test: pip install $pkg failed" >&2; exit 2; }
  fi
done
python3 scripts/k8s_check.py packaging/k8s/*.yaml
ORK_FLEET_BIND=127.0.0.1:1 ORK_REPLICA_1=127.0.0.1:2 ORK_REPLICA_2=127.0.0.1:3 \
  ORK_REPLICA_3=127.0.0.1:4 haproxy -q -c -f packaging/haproxy/ork.cfg
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! python3 scripts/fleet_load.py "$ork" "$model" packaging/haproxy/ork.cfg "$work"; then
  tail -n 20 "$work"/*.log >&2 || true
  exit 1
fi
echo "fleet-test: ok in $(( $(date +%s) - start )) s"
