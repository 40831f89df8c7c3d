#!/usr/bin/env bash
# Configures (once) and builds ddprun with Ninja into build/. Usage: scripts/build.sh [targets...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -- "$@"
