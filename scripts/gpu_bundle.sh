#!/usr/bin/env bash
# Packs what the real-GPU checks need (scripts/gpu_check.sh) into one folder that can be copied to
# a GPU machine that has the NVIDIA driver, CUDA 13 and NCCL but none of our Debian packages:
# the stripped binaries (ddprun, its watchdog, train, the unit tests) and every shared library they
# load except glibc, libstdc++/libgcc (a newer one is backward compatible) and CUDA/NCCL (the GPU
# machine's own, matching its driver, are used).
#   scripts/gpu_bundle.sh [DEST]      (default: .gpu in the repository root; build/ must be built)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
dest="${1:-$root/.gpu}"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/examples"
bins=("$build/bin/ddprun" "$build/bin/ddprun-watchdog" "$build/bin/train"
      "$build/tests/unit/ddprun_unit_tests")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "gpu_bundle: $b is not built" >&2; exit 1; }
  strip -o "$dest/bin/$(basename "$b")" "$b"
done
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libcudart\.so|libnccl\.so)'
for b in "${bins[@]}"; do
  { ldd "$b" 2>/dev/null || true; } | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name"
  done
done
cp "$root/examples/torch/ddp_train.py" "$dest/examples/"
cp -r "$root/python" "$dest/python"   # the Python package (heartbeats), for the torch hang check
find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
cp "$root/scripts/gpu_check.sh" "$dest/"
du -sh "$dest"
