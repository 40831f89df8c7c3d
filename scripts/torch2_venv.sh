#!/usr/bin/env bash
# The torch 2.x tier's venv (docs/testing.md "The torch 2.x tier"): current torch, Lightning and
# Accelerate from PyPI at the pins of scripts/torch2/ (requirements.txt, constraints.txt), made
# once per machine outside the clone, under ${XDG_CACHE_HOME:-~/.cache}/ddprun/, in a folder named
# by the pins' hash (DDPRUN_TORCH2_VENV overrides the folder). Several callers at once are fine:
# one makes it, the others wait on its lock.
#
#   scripts/torch2_venv.sh            make it if needed; print its python's path (last line)
#   scripts/torch2_venv.sh --relock   resolve requirements.txt afresh and rewrite constraints.txt
#
# Exit: 0 ready; 77 PyPI cannot be reached (the reason on stderr: the tier's tests skip with it);
# 1 anything else (a pin that does not resolve, a full disk): a failure, never a skip.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pins="$root/scripts/torch2"
base="/usr/bin/python3"  # Debian's, as the tests' runner: its venv module is python3-venv
[ -x "$base" ] || base="$(command -v python3)"

if [ "${1:-}" = "--relock" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$base" -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install -q --disable-pip-version-check -r "$pins/requirements.txt"
  {
    sed -n '1,3p' "$pins/constraints.txt"
    "$tmp/venv/bin/pip" freeze --exclude-editable | LC_ALL=C sort -f
  } >"$tmp/constraints.txt"
  mv "$tmp/constraints.txt" "$pins/constraints.txt"
  echo "torch2_venv.sh: rewrote $pins/constraints.txt; run the tier, then commit both files" >&2
  exit 0
fi
[ $# -eq 0 ] || { echo "torch2_venv.sh: unknown argument '$1' (none, or --relock)" >&2; exit 2; }

key="$(cat "$pins/requirements.txt" "$pins/constraints.txt" | sha256sum | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ddprun"
venv="${DDPRUN_TORCH2_VENV:-$cache/torch2-$key}"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
waited=$(date +%s)
flock 9  # another caller may be making it (scripts/test.sh starts one before the build): wait
waited=$(( $(date +%s) - waited ))

if [ -f "$venv/.ready" ]; then
  # What the maker said (versions, how long it took), for the CI log; and how long we waited.
  [ -f "$venv.log" ] && cat "$venv.log" >&2
  [ "$waited" -gt 1 ] && echo "torch2_venv.sh: waited ${waited} s for another caller to make it" >&2
  echo "$venv/bin/python"
  exit 0
fi
exec 2> >(tee "$venv.log" >&2)  # the maker's messages, kept for the callers after it

rm -rf "$venv"  # an attempt that did not finish
"$base" -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check)
# Can PyPI be reached? A short probe, so that a machine without it learns so in seconds, not after
# pip's own retries (minutes).
if ! probe="$("${pip[@]}" index versions torch --timeout 20 --retries 1 2>&1)"; then
  rm -rf "$venv"
  echo "torch2_venv.sh: PyPI cannot be reached, so the torch 2.x tier cannot be made: $(echo "$probe" | tail -1)" >&2
  exit 77
fi
start=$(date +%s)
"${pip[@]}" install -q -r "$pins/requirements.txt" -c "$pins/constraints.txt"
"$venv/bin/python" -c 'import torch, lightning, accelerate; print("torch", torch.__version__, "lightning", lightning.__version__, "accelerate", accelerate.__version__)' >&2
echo "torch2_venv.sh: made $venv in $(( $(date +%s) - start )) s" >&2
touch "$venv/.ready"
echo "$venv/bin/python"
