#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (unit, integration, e2e) with ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
cd "${DDPRUN_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 -j2 "$@"
