#!/usr/bin/env bash
# The wheel's rule (docs/install.md): its programs need nothing from the system but glibc and
# libgcc_s. auditwheel cannot say so: the manylinux policy allows libstdc++.so.6, and `repair` copies
# any other library into the wheel (ddprun.libs/) instead of refusing. So: readelf -d of every ELF
# file in the wheel, each one's NEEDED printed, and none outside the list below; no grafted libraries.
#
#   bash scripts/wheel_needed.sh WHEEL
#
# Exit 0: the rule holds; 1: it does not (the offenders named); 2: bad input (usage, not a wheel, no
# readelf). scripts/package.sh runs it on every wheel it makes; tests/install/test_wheel_needed.py too.
set -euo pipefail

usage_error() {
  echo "wheel_needed: error: $*" >&2
  exit 2
}

[ $# -eq 1 ] || usage_error "usage: bash scripts/wheel_needed.sh WHEEL"
wheel=$1
[ -f "$wheel" ] || usage_error "$wheel is not a file"
command -v readelf >/dev/null || usage_error "readelf not found (binutils)"
# glibc's libraries (libpthread, libdl and librt are stubs in libc since 2.34, still valid) and libgcc_s.
allowed=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 libgcc_s.so.1 "

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m zipfile -e "$wheel" "$tmp" 2>/dev/null || usage_error "$wheel is not a zip file (a wheel)"

bad=0
n=0
grafted=$(find "$tmp" -path '*.libs/*' -type f | sed "s|^$tmp/||")
if [ -n "$grafted" ]; then
  echo "wheel_needed: auditwheel grafted libraries into the wheel (a binary needs them):"
  # shellcheck disable=SC2001
  sed 's/^/  /' <<<"$grafted"
  bad=1
fi
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  n=$((n + 1))
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  needed=${needed% }
  echo "${f#"$tmp"/}: NEEDED ${needed:-(none: static)}"
  for lib in $needed; do
    if [[ $allowed != *" $lib "* ]]; then
      echo "wheel_needed: ${f#"$tmp"/} needs $lib, which is neither glibc's nor libgcc_s"
      bad=1
    fi
  done
done < <(find "$tmp" -type f -print0 | sort -z)
[ $n -gt 0 ] || { echo "wheel_needed: no ELF file in $wheel"; exit 1; }
if [ $bad -ne 0 ]; then
  echo "wheel_needed: FAILED: $wheel needs more than glibc and libgcc_s"
  exit 1
fi
echo "wheel_needed: ok: $n ELF files in $(basename "$wheel") need only glibc and libgcc_s"
