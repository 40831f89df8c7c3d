#!/usr/bin/env bash
# Installs ddprun's build and test dependencies from Debian 12 packages. Idempotent: packages that
# are already present are not downloaded again, and apt-get update runs only when something is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libboost1.81-dev libboost-filesystem1.81-dev libboost-system1.81-dev libboost-json1.81-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libcli11-dev catch2 libgloo-dev
  libnghttp2-dev  # HPACK decoding in the daemon's front door (netguard/token_recognizer.h)
  libssl-dev openssl  # TLS (tls/): OpenSSL terminates it in the front door; the tests make certificates
  tcpdump  # the TLS tests capture loopback traffic and search it for the job token
  prometheus-cpp-dev  # the metrics port (metrics/): prometheus-cpp's core (its HTTP server is Boost.Beast's)
  python3-torch iproute2 procps iptables
  slurm-client  # scontrol: the oracle for Slurm hostlist expansion in the tests
  prometheus  # promtool and a real Prometheus server, to check the metrics port in the tests
  # A real one-node Slurm that tests/integration/test_slurm_cluster.py starts under a temp dir
  # (scripts/slurm_cluster.py); without systemd (CI) the packages start no service by themselves.
  munge slurmctld slurmd
  etcd-server etcd-client  # a real 3-member etcd v3 cluster for the etcd backend's tests (scripts/etcd_cluster.py)
  # Packaging (scripts/package.sh): dpkg-shlibdeps for the .deb's Depends, python3-venv for the
  # wheel's build tools; the bare Debian 12 root that tests/install installs them into.
  dpkg-dev python3-venv mmdebstrap debian-archive-keyring
)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The wheel's metrics port (docs/install.md, "The wheel"): scripts/prometheus_source.sh compiles
# prometheus-cpp's core into it from Debian's source package of the installed prometheus-cpp-dev
# (same version, so the headers match), fetched with `apt-get source`. That needs deb-src entries,
# which a fresh Debian 12 (debian.sources with `Types: deb` only) lacks: add them here, as a file of
# our own beside the host's, with the host's URIs, Suites, Components and Signed-By (a mirror or
# snapshot configured there is followed), then apt-get update. Cheap when done: one `apt-cache showsrc`.
src_pkg=$(dpkg-query -W -f='${source:Package}' prometheus-cpp-dev)
src_ver=$(dpkg-query -W -f='${source:Version}' prometheus-cpp-dev)
has_source() {
  apt-cache showsrc --only-source "$src_pkg" 2>/dev/null | grep -qx "Version: $src_ver"
}
if has_source; then
  echo "install_deps: apt knows the source of $src_pkg $src_ver"
else
  deb_src=/etc/apt/sources.list.d/ddprun-deb-src.sources
  host=/etc/apt/sources.list.d/debian.sources
  if [ -f "$host" ]; then
    # Each enabled stanza of type deb, as deb-src; comments and Architectures (binary only) dropped.
    stanzas=$(awk '
      function flush() { if (isdeb && !off && body != "") printf "Types: deb-src\n%s\n", body; body = ""; isdeb = 0; off = 0 }
      /^[ \t]*$/ { flush(); next }
      /^#/ { next }
      tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") isdeb = 1; next }
      tolower($1) == "enabled:" { if (tolower($2) == "no") off = 1; next }
      tolower($1) == "architectures:" { next }
      { body = body $0 "\n" }
      END { flush() }' "$host")
  else
    # A host with one-line sources.list and no deb-src lines: Debian's own archive.
    kr=/usr/share/keyrings/debian-archive-keyring.gpg
    stanzas="Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: $kr

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: $kr
"
  fi
  [ -n "$stanzas" ] || { echo "install_deps: error: no enabled 'Types: deb' stanza in $host to mirror as deb-src" >&2; exit 1; }
  echo "install_deps: adding $deb_src (the source of $src_pkg $src_ver, for the wheel's metrics port)"
  printf '# Added by ddprun'"'"'s scripts/install_deps.sh: Debian source packages (apt-get source prometheus-cpp).\n%s\n' \
    "$stanzas" | $SUDO tee "$deb_src" >/dev/null
  $SUDO apt-get update -qq
  if ! has_source; then
    echo "install_deps: error: apt has no source of $src_pkg $src_ver after adding $deb_src; the mirror may have" \
      "moved on: upgrade prometheus-cpp-dev (apt-get install --only-upgrade prometheus-cpp-dev) and run again" >&2
    exit 1
  fi
fi
