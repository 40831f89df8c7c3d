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

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
