#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (unit, integration, e2e) with ctest,
# then lists what failed and every skipped test with its reason (scripts/test_summary.py). Exits
# with ctest's status: non-zero when any test failed; a skipped test is neither passed nor failed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
# The torch 2.x tier's venv (tests/torch2; about 3 GB from PyPI, once per machine): made in the
# background so that the download overlaps the build. ctest's "torch2: venv" waits for it and says
# how long it took; the tier's tests need it, and report skipped if PyPI cannot be reached.
setsid bash "$root/scripts/torch2_venv.sh" >/dev/null 2>&1 &
torch2_maker=$!
# A run cut short leaves no download behind (its own process group: pip included). By the end of a
# full run it is long done: "torch2: venv" waited for it.
trap 'kill -- "-$torch2_maker" 2>/dev/null || true' EXIT
bash "$root/scripts/build.sh"
# The wheel and the .deb (build/dist), which tests/install installs into a bare Debian 12 root. A
# packaging failure is reported and fails the run, but the tests still run (that test then says
# which package is missing).
package_status=0
bash "$root/scripts/package.sh" || { package_status=$?; echo "test.sh: scripts/package.sh failed (exit $package_status)" >&2; }
cd "${DDPRUN_BUILD_DIR:-$root/build}"
mkdir -p Testing/Temporary
console=Testing/Temporary/ctest_console.log
status=0
ctest --output-on-failure --timeout 600 -j2 "$@" 2>&1 | tee "$console" || status=$?
python3 "$root/scripts/test_summary.py" "$console" Testing/Temporary/LastTest.log ||
  echo "test.sh: could not summarize the run (scripts/test_summary.py failed)" >&2
[ "$status" -eq 0 ] && [ "$package_status" -ne 0 ] && status=$package_status
exit "$status"
