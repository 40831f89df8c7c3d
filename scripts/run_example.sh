#!/usr/bin/env bash
# The main job: installs what is missing, builds ddprun if needed, then trains a real PyTorch DDP
# model on 4 local workers (gloo, CPU) under ddprun. Extra arguments go to ddprun before the program.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install_deps.sh" >/dev/null
bash "$root/scripts/build.sh" ddprun ddprun-watchdog >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export PYTHON_EXEC="${PYTHON_EXEC:-/usr/bin/python3}"
"${DDPRUN_BUILD_DIR:-$root/build}/bin/ddprun" --standalone --nproc_per_node=4 "$@" \
  "$root/examples/torch/ddp_train.py" --out "$out/model.pt"
