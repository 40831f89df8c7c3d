#!/usr/bin/env bash
# Runs one Python test file on the torch 2.x tier (tests/torch2/CMakeLists.txt): the venv of
# scripts/torch2_venv.sh runs the test and, through PYTHON_EXEC, every worker it starts. Where the
# venv cannot be made because PyPI cannot be reached, exit 77 (ctest: skipped) with the reason.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$(bash "$root/scripts/torch2_venv.sh" | tail -1)"
status=${PIPESTATUS[0]}
if [ "$status" -eq 77 ]; then
  echo "SKIPPED: torch 2.x tier: PyPI cannot be reached to make its venv (scripts/torch2_venv.sh said why above)"
  exit 77
fi
[ "$status" -eq 0 ] || { echo "run.sh: scripts/torch2_venv.sh failed (exit $status)" >&2; exit 1; }
export PYTHON_EXEC="$python"
exec "$python" "$@"
