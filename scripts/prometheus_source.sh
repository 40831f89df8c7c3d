#!/usr/bin/env bash
# Unpacks Debian's source package of the installed prometheus-cpp-dev (the same version, so that its
# headers are the ones ddprun's metrics code compiles against) into BUILD/third_party/ and prints
# that folder on stdout. The wheel (DDPRUN_PORTABLE) compiles prometheus-cpp's core from it into a
# static library (cmake/PortablePrometheus.cmake), because Debian ships the library shared only.
# scripts/package.sh runs it and passes the folder as DDPRUN_PROMETHEUS_SOURCE_DIR.
#
#   bash scripts/prometheus_source.sh BUILD_DIR
#
# Needs apt's deb-src entries (scripts/install_deps.sh adds them) and dpkg-source (dpkg-dev); no
# root. Cheap when done: a folder already unpacked for this version is printed as it is.
# Exit 1, with one line saying why, when the source cannot be had.
set -euo pipefail

die() {
  echo "prometheus_source: error: $*" >&2
  exit 1
}

if [ $# -ne 1 ] || [ -z "$1" ]; then die "usage: bash scripts/prometheus_source.sh BUILD_DIR"; fi
build=$1

src_pkg=$(dpkg-query -W -f='${source:Package}' prometheus-cpp-dev 2>/dev/null) ||
  die "prometheus-cpp-dev is not installed (scripts/install_deps.sh installs it)"
src_ver=$(dpkg-query -W -f='${source:Version}' prometheus-cpp-dev)
if [ -z "$src_pkg" ] || [ -z "$src_ver" ]; then die "prometheus-cpp-dev is not installed (scripts/install_deps.sh installs it)"; fi
third=$build/third_party
dest=$third/$src_pkg-${src_ver//:/_}  # an epoch's ':' has no place in a path
marker=.ddprun-source

if [ -f "$dest/$marker" ] && [ "$(cat "$dest/$marker")" = "$src_pkg $src_ver" ]; then
  echo "$dest"
  exit 0
fi

command -v dpkg-source >/dev/null || die "dpkg-source not found: install dpkg-dev (scripts/install_deps.sh)"
apt-cache showsrc --only-source "$src_pkg" 2>/dev/null | grep -qx "Version: $src_ver" ||
  die "apt has no source of $src_pkg $src_ver: run scripts/install_deps.sh (it adds deb-src entries)"

mkdir -p "$third"
tmp=$(mktemp -d "$third/.fetch.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "prometheus_source: fetching the source of $src_pkg $src_ver (apt-get source) ..." >&2
# apt checks the files against the signed Sources index; dpkg-source applies Debian's patches.
# As root, apt would download as its _apt user, which may not reach the build folder: it then
# downloads as root anyway, with a warning; say so at once.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
(cd "$tmp" && apt-get source -qq "${sandbox[@]}" --only-source "$src_pkg=$src_ver") >&2 ||
  die "apt-get source $src_pkg=$src_ver failed (above)"
unpacked=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name "$src_pkg-*")
if [ -z "$unpacked" ] || [ "$(wc -l <<<"$unpacked")" -ne 1 ]; then
  die "apt-get source left no single $src_pkg-* folder in $tmp"
fi
[ -f "$unpacked/core/CMakeLists.txt" ] || die "$unpacked has no core/CMakeLists.txt: not prometheus-cpp's source?"
echo "$src_pkg $src_ver" >"$unpacked/$marker"
rm -rf "$dest"
mv "$unpacked" "$dest"
echo "prometheus_source: $dest" >&2
echo "$dest"
