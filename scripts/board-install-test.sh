#!/usr/bin/env bash
# Install the arm64 .deb as a board owner would, in a fresh arm64 Debian 12 root on this PC
# (docs/board.md, "The install test"):
#  1. debootstrap --foreign --arch arm64 bookworm into target/board-root/root (minbase + adduser,
#     udev, ca-certificates), then its second stage inside the root, run by qemu-user-static
#     through binfmt_misc (registered for the run if it is not, and unregistered after);
#  2. `apt-get install ./ork_*.deb` inside (chroot): the user `ork` in render and video, the
#     unit, the config (0640 root:ork), the udev rule;
#  3. inside: `ork doctor --json` runs and says what it found; `ork run` on SmolLM2 (copied in)
#     prints the text x86's `ork run` prints (greedy, emulated device).
# Needs root, debootstrap, qemu-user-static, network access to the Debian mirror
# (ORK_DEBIAN_MIRROR, default http://deb.debian.org/debian) and the .deb (scripts/package.sh
# first). A root made by an earlier run is reused (delete target/board-root to start afresh).
# ORK_X86_ORK names an x86 ork to compare with (default: build the workspace's tests).
# About 15 minutes on two cores, most of it the second stage under emulation: not a CI step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ "$(id -u)" = 0 ] || { echo "error: run as root (debootstrap, chroot, binfmt_misc)" >&2; exit 1; }
for tool in debootstrap chroot qemu-aarch64-static python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install debootstrap qemu-user-static)" >&2; exit 1; }
done
DEB=$(ls -t target/ork_*_arm64.deb 2>/dev/null | head -1)
[ -n "$DEB" ] || { echo "error: no target/ork_*_arm64.deb: run scripts/package.sh first" >&2; exit 1; }
MIRROR="${ORK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE="$ROOT/target/board-root"
RFS="$BASE/root"
ORK_MODEL="$(./scripts/fetch-model.sh)"
SECONDS=0
step() { echo "== board install test [${SECONDS}s]: $*"; }

# binfmt_misc: the kernel must start arm64 programs inside the root through qemu.
BINFMT=/proc/sys/fs/binfmt_misc
REGISTERED=
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
  if [ -n "$REGISTERED" ]; then echo -1 >"$BINFMT/qemu-aarch64" || true; fi
}
trap cleanup EXIT
if [ ! -e "$BINFMT/qemu-aarch64" ]; then
  [ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT"
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -f "$conf" ] || { echo "error: no $conf (qemu-user-static)" >&2; exit 1; }
  # F: the interpreter is opened now, so it need not exist inside the root.
  cat "$conf" >"$BINFMT/register"
  REGISTERED=1
  step "registered qemu-aarch64 with binfmt_misc for this run"
fi

if [ ! -e "$BASE/.second-stage-done" ]; then
  if [ ! -x "$RFS/debootstrap/debootstrap" ]; then
    step "debootstrap first stage (download and unpack, arm64 bookworm, minbase)"
    rm -rf "$RFS"
    mkdir -p "$RFS"
    debootstrap --foreign --arch=arm64 --variant=minbase --include=adduser,udev,ca-certificates \
      bookworm "$RFS" "$MIRROR"
  fi
  step "debootstrap second stage, inside the root under qemu"
  chroot "$RFS" /debootstrap/debootstrap --second-stage
  echo "deb $MIRROR bookworm main" >"$RFS/etc/apt/sources.list"
  touch "$BASE/.second-stage-done"
fi
mounts=("$RFS/proc" "$RFS/dev")
mount -t proc proc "$RFS/proc"
mount --bind /dev "$RFS/dev"
cp /etc/resolv.conf "$RFS/etc/resolv.conf"

step "installing $(basename "$DEB") inside (apt-get install ./…)"
cp "$DEB" "$RFS/tmp/ork.deb"
chroot "$RFS" apt-get update -qq
chroot "$RFS" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall /tmp/ork.deb
step "what the package set up"
chroot "$RFS" sh -c '
  set -e
  id ork
  for g in render video; do id -nG ork | tr " " "\n" | grep -qx "$g" || { echo "ork is not in $g"; exit 1; }; done
  test -x /usr/bin/ork && test -x /usr/lib/ork/ork-serve
  test -f /usr/lib/systemd/system/ork.service && test -f /usr/lib/udev/rules.d/60-ork-npu.rules
  test "$(stat -c "%a %U %G" /etc/ork/ork.conf)" = "640 root ork"
  test "$(stat -c %U /var/lib/ork)" = ork
  ork --version'

step "ork doctor --json inside"
chroot "$RFS" ork doctor --json >"$BASE/doctor.json"
python3 - "$BASE/doctor.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["checks"]:
    print(f"  {c['status']:5} {c['name']}: {c['detail'][:110]}")
PY

step "ork run on SmolLM2 inside, as the user ork (greedy, emulated device), against x86"
mkdir -p "$RFS/var/lib/ork/models"
cp "$ORK_MODEL" "$RFS/var/lib/ork/models/model.gguf"
chroot "$RFS" chown -R ork:ork /var/lib/ork/models
RUN=(run --no-pack --device emu --temp 0 -n 24 --json --prompt "The three primary colours are")
chroot --userspec=ork:ork --groups=render,video "$RFS" \
  ork "${RUN[@]}" --model /var/lib/ork/models/model.gguf >"$BASE/board-run.json"
# x86's ork: ORK_X86_ORK, else the one the workspace tests build (scripts/test.sh).
X86_ORK="${ORK_X86_ORK:-}"
if [ -z "$X86_ORK" ]; then
  cargo test --locked --workspace --no-run
  X86_ORK=target/debug/ork
fi
"$X86_ORK" "${RUN[@]}" --model "$ORK_MODEL" >"$BASE/x86-run.json"
python3 - "$BASE/x86-run.json" "$BASE/board-run.json" <<'PY'
import json, sys
x, b = (json.load(open(p)) for p in sys.argv[1:3])
if x["text"] != b["text"] or x["tokens"] != b["tokens"]:
    sys.exit(f"error: the installed ork printed {b['text']!r}, x86 {x['text']!r}")
print(f"installed ork printed x86's text: {b['text']!r}")
PY
step "passed"
