#!/usr/bin/env bash
# The main job: installs what is missing, builds ddprun and the example trainer if needed, then
# trains a real data-parallel model (examples/train, on ddprun's worker SDK, gloo on CPU) on 4
# local workers under ddprun. Extra arguments go to ddprun before the program, e.g.
#   scripts/run_example.sh --max_restarts=1
# (trainer flags: edit TRAIN_ARGS below, or run build/bin/train --help).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
bash "$root/scripts/install_deps.sh" >/dev/null
bash "$root/scripts/build.sh" ddprun ddprun-watchdog train >/dev/null
TRAIN_ARGS=(--epochs 5)
"$build/bin/ddprun" --standalone --nproc_per_node=4 "$@" "$build/bin/train" "${TRAIN_ARGS[@]}"
