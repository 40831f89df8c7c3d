#!/usr/bin/env bash
# Makes DIR a minimal Debian 12 root: mmdebstrap's minbase variant plus python3 and python3-venv,
# nothing of ddprun's build dependencies. tests/install/test_bare_root.py installs the wheel and the
# .deb into it (scripts/bare_root_check.sh) to prove that they carry everything they need.
#
#   bash scripts/bare_root.sh DIR
#
# DIR must be absent or empty (or a root this script made with the same recipe: then nothing is
# done). Run as root (mmdebstrap's root mode, and the root's files belong to root).
#
# apt's lists are kept in the root (mmdebstrap removes them by default), so that
# `apt-get install ./x.deb` inside it can fetch the .deb's Depends without an `apt-get update`.
#
# Cache: making the root downloads about 100 MB and unpacks some hundred packages, which takes
# minutes; unpacking a tarball of it takes seconds. So the root is made once per recipe as
# ${DDPRUN_BARE_ROOT_CACHE:-/var/cache/ddprun-bare-root}/<sha256 of the recipe>.tar and unpacked
# from there on later runs. The recipe is the suite, the package list, the variant, the apt
# sources and apt options; change any of them and a new tarball is made. Delete the cache folder
# to force a fresh root (say, when the mirror has moved on by a point release).
#
# Environment: DDPRUN_BARE_ROOT_CACHE (the cache folder), DDPRUN_BARE_ROOT_MIRROR (default
# http://deb.debian.org/debian, as the host's /etc/apt/sources.list.d/debian.sources),
# DDPRUN_BARE_ROOT_SECURITY_MIRROR (default http://deb.debian.org/debian-security).
#
# Needs (Debian packages): mmdebstrap, debian-archive-keyring; tar and flock (util-linux) are
# essential.
set -euo pipefail

die() {
  echo "bare_root: error: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: bash scripts/bare_root.sh DIR"
dir=$1
[ -n "$dir" ] || die "DIR is empty"
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap's root mode; the root's files belong to root)"
command -v mmdebstrap >/dev/null || die "mmdebstrap not found: apt-get install mmdebstrap"
command -v flock >/dev/null || die "flock not found (util-linux)"
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] ||
  die "/usr/share/keyrings/debian-archive-keyring.gpg not found: apt-get install debian-archive-keyring"

suite=bookworm
variant=minbase
packages=python3,python3-venv
mirror=${DDPRUN_BARE_ROOT_MIRROR:-http://deb.debian.org/debian}
security=${DDPRUN_BARE_ROOT_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
sources=(
  "deb $mirror $suite main"
  "deb $mirror $suite-updates main"
  "deb $security $suite-security main"
)
# The host's apt may be told to accept Release files past their Valid-Until (a mirror that serves
# a snapshot of the archive does need it); the root's apt talks to the same mirror, so it gets the
# same setting (mmdebstrap writes --aptopt into the root's /etc/apt/apt.conf.d/99mmdebstrap).
aptopts=()
eval "$(apt-config shell host_valid_until Acquire::Check-Valid-Until)"
if [ "${host_valid_until:-}" = "false" ]; then
  aptopts+=(--aptopt='Acquire::Check-Valid-Until "false"')
fi

key=$(printf '%s\n' "ddprun bare root, recipe 1" "suite=$suite" "variant=$variant" "packages=$packages" \
  "${sources[@]}" "${aptopts[@]}" | sha256sum | cut -d' ' -f1)
cache=${DDPRUN_BARE_ROOT_CACHE:-/var/cache/ddprun-bare-root}
tarball=$cache/$key.tar
marker=.ddprun-bare-root

# Idempotent: DIR already made from this recipe is left as it is.
if [ -d "$dir" ] && [ -f "$dir/$marker" ]; then
  if [ "$(cat "$dir/$marker")" = "$key" ]; then
    echo "bare_root: $dir is already a bare root of this recipe ($key)"
    exit 0
  fi
  die "$dir is a bare root of another recipe ($(cat "$dir/$marker")); remove it first"
fi
if [ -e "$dir" ]; then
  [ -d "$dir" ] || die "$dir exists and is not a directory"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty; give an absent or empty directory"
fi

mkdir -p "$cache" || die "cannot create the cache folder $cache (set DDPRUN_BARE_ROOT_CACHE)"
# One maker at a time per cache: a second run waits for the first one's tarball instead of making
# it again.
exec 9>"$cache/.lock"
flock 9
if [ -s "$tarball" ]; then
  echo "bare_root: using cached $tarball"
else
  part=$tarball.part.$$
  trap 'rm -f "$part"' EXIT
  echo "bare_root: making a $variant $suite root with $packages (downloads about 100 MB; minutes) ..."
  start=$(date +%s)
  # Output to a .tar: mmdebstrap builds in a temporary folder of its own and packs it, device
  # nodes of /dev included; the tarball is renamed into place only when it is complete.
  if ! mmdebstrap --mode=root --variant="$variant" --include="$packages" --skip=cleanup/apt/lists \
      "${aptopts[@]}" --format=tar "$suite" "$part" "${sources[@]}"; then
    die "mmdebstrap failed (see above): is $mirror reachable?"
  fi
  tar -tf "$part" ./usr/bin/python3 >/dev/null 2>&1 || die "the root mmdebstrap made has no /usr/bin/python3"
  mv "$part" "$tarball"
  trap - EXIT
  echo "bare_root: made $tarball in $(( $(date +%s) - start )) s"
fi
flock -u 9

mkdir -p "$dir"
tar -C "$dir" --numeric-owner -xf "$tarball" || die "cannot unpack $tarball into $dir"
[ -x "$dir/usr/bin/python3" ] || die "$dir/usr/bin/python3 missing after unpacking $tarball"
echo "$key" >"$dir/$marker"
echo "bare_root: $dir is a bare $suite root ($packages)"
