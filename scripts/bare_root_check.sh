#!/usr/bin/env bash
# Proof on a bare system (issue #23): installs the Python wheel and the .deb into a minimal Debian
# root (made by scripts/bare_root.sh) and runs ddprun from each there, single-node and 2-node.
#
#   bash scripts/bare_root_check.sh ROOTDIR WHEEL DEB
#
# Inside the root, in this order, failing on the first error, each step under a `== step ==` header:
#   wheel: python3 -m venv /opt/venv; pip install --no-index the wheel; ddprun --version,
#          ddprun-rdzv --version; ddprun --nproc_per_node=2 python3 /pkgs/prog.py (both ranks must
#          print); the same with --metrics_port=0, its /metrics scraped while both workers run; a
#          2-node job against a ddprun-rdzv daemon on 127.0.0.1 (two agents at once, WORLD_SIZE=2)
#          whose --metrics_port 0 is scraped after the job; import ddprun from the venv's python.
#   deb:   apt-get install ./ddprun_*.deb (apt fetches its Depends from the mirror), then the same
#          with /usr/bin's binaries; import ddprun only where the .deb ships the Python package.
# The four scrapes (ROOTDIR/pkgs/scrapes/{wheel,deb}-{ddprun,ddprun-rdzv}.prom) are then checked
# here, outside the root, by the host's `promtool check metrics`: the root stays bare (promtool is
# the 48 MB Debian package prometheus). The last line is "bare_root_check: all checks passed".
#
# Isolation: nothing of the build machine is bind-mounted into the root. The wheel, the .deb and
# the worker program (tests/install/prog.py) are copied to ROOTDIR/pkgs; the host's resolv.conf is
# copied so that apt can resolve the mirror. Everything runs under
#   unshare --mount --pid --fork --kill-child --mount-proc=ROOTDIR/proc bash -c 'SETUP; chroot ROOTDIR'
# with an empty environment (SETUP: the /dev below, made in the new namespace before the chroot).
# The new mount namespace holds the only mounts, so they vanish with it and none is left behind: a
# fresh /proc for the new pid namespace (ddprun watches its process
# tree there, python and apt read it), and a minimal /dev made fresh on a tmpfs (null, zero, full,
# random, urandom, tty, the fd links, an empty pts and a tmpfs /dev/shm, as every system has) rather
# than the host's devtmpfs, which would hand the root every device of the build machine. The
# nodes mmdebstrap put in the root's /dev are not used: where the root lies on a nodev filesystem
# (a tmpfs /tmp) they could not be opened. The pid namespace ends every process left inside when
# its first process exits, and --kill-child kills that one when unshare is killed (by the outer
# timeout). Every command inside runs under `timeout`, and the rendezvous daemon is killed on every
# path (trap). The host's network is used as it is (apt fetches the .deb's Depends; the jobs use
# 127.0.0.1 and ports the kernel picks).
#
# Environment: DDPRUN_BARE_CHECK_TIMEOUT: seconds for the whole run inside the root (default 1200).
# Needs (host): unshare, chroot, timeout; promtool (Debian package prometheus).
set -euo pipefail

die() {
  echo "bare_root_check: error: $*" >&2
  exit 1
}

[ $# -eq 3 ] || die "usage: bash scripts/bare_root_check.sh ROOTDIR WHEEL DEB"
root=$1
wheel=$2
deb=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prog=$here/../tests/install/prog.py
limit=${DDPRUN_BARE_CHECK_TIMEOUT:-1200}

[ "$(id -u)" -eq 0 ] || die "must run as root (unshare, chroot, mount)"
for tool in unshare chroot timeout; do
  command -v "$tool" >/dev/null || die "$tool not found (util-linux / coreutils)"
done
command -v promtool >/dev/null || die "promtool not found (Debian package prometheus; scripts/install_deps.sh installs it)"
[ -d "$root" ] || die "ROOTDIR $root is not a directory (make it with scripts/bare_root.sh)"
[ -x "$root/usr/bin/python3" ] || die "$root has no /usr/bin/python3: not a root made by scripts/bare_root.sh"
[ -f "$wheel" ] || die "wheel $wheel not found"
[ -f "$deb" ] || die ".deb $deb not found"
case "$wheel" in *.whl) ;; *) die "$wheel does not end in .whl" ;; esac
case "$deb" in *.deb) ;; *) die "$deb does not end in .deb" ;; esac
[ -f "$prog" ] || die "$prog not found"
root=$(cd "$root" && pwd)
# The proof needs a root with nothing of ddprun in it: a second check would find the first one's
# venv and package (pip and apt keep an installed version of the same number as it is).
if [ -e "$root/pkgs" ] || [ -e "$root/opt/venv" ]; then
  die "$root was used by an earlier check; make a fresh root with scripts/bare_root.sh"
fi

# Copies, never bind mounts: the root sees nothing of the build tree.
mkdir -m 755 "$root/pkgs"
install -m 644 "$wheel" "$root/pkgs/$(basename "$wheel")"
install -m 644 "$deb" "$root/pkgs/$(basename "$deb")"
install -m 644 "$prog" "$root/pkgs/prog.py"
mkdir -m 755 "$root/pkgs/scrapes"  # the metrics ports' scrapes, for promtool here afterwards
# apt inside needs the mirror's name resolved: the host's resolver configuration (a copy of the
# file, -L: it may be a symlink into /run). /etc/hosts as a fresh Debian install has it, so that
# localhost and this host's name resolve (the root made by mmdebstrap has none).
if [ -e /etc/resolv.conf ]; then
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
else
  echo "bare_root_check: warning: no /etc/resolv.conf here; apt inside the root may not resolve the mirror" >&2
fi
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" \
  >"$root/etc/hosts"

cat >"$root/pkgs/inside.sh" <<'INSIDE'
#!/bin/bash
# Runs inside the bare root (pid 1 of its pid namespace); see scripts/bare_root_check.sh.
set -euo pipefail
wheel=/pkgs/$1
deb=/pkgs/$2
T="timeout -k 5"  # every command: timeout -k 5 SECONDS ...
rdzv_pid=""
agent_pid=""

# No `producer | grep -q` anywhere: with pipefail, grep's early exit can fail the producer (SIGPIPE).
step() { printf '\n== %s ==\n' "$*"; }
fail() { echo "bare_root_check: FAILED: $*"; exit 1; }

stop_rdzv() {
  if [ -n "$rdzv_pid" ]; then
    kill "$rdzv_pid" 2>/dev/null || true
    wait "$rdzv_pid" 2>/dev/null || true
    rdzv_pid=""
  fi
}
stop_agent() {
  if [ -n "$agent_pid" ]; then
    kill "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
    agent_pid=""
  fi
}
trap 'stop_agent; stop_rdzv' EXIT
trap 'exit 143' TERM INT

# The shared libraries of every ELF program among the paths on stdin: one not found is a missing
# dependency of the package (the most likely failure on a bare system), named here clearly.
# Shared libraries (*.so*) are checked through the programs that load them: alone, a bundled
# library may find its own bundled dependencies only through the program's run path.
check_libs() {
  local f out bad=0 n=0
  while IFS= read -r f; do
    if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
    case "${f##*/}" in *.so | *.so.*) continue ;; esac
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    n=$((n + 1))
    out=$($T 30 ldd "$f" 2>&1) || true
    echo "$f:"
    # shellcheck disable=SC2001
    sed 's/^/  /' <<<"$out"
    if [[ $out == *"not found"* ]]; then bad=1; fi
  done
  [ $n -gt 0 ] || fail "no ELF program found among the package's files"
  [ $bad -eq 0 ] || fail "shared libraries not found (above)"
}

versions() {  # $1: label, $2: the folder both binaries must come from
  local got
  for b in ddprun ddprun-rdzv; do
    got=$(command -v "$b") || fail "$1: $b is not on PATH ($PATH)"
    [ "$got" = "$2/$b" ] || fail "$1: $b is $got, expected $2/$b"
  done
  step "$1: $2/ddprun --version"
  $T 30 ddprun --version | tee /tmp/version.out
  [[ $(head -n1 /tmp/version.out) == "ddprun "* ]] || fail "$1: ddprun --version printed no 'ddprun VERSION' line"
  step "$1: $2/ddprun-rdzv --version"
  $T 30 ddprun-rdzv --version | tee /tmp/version.out
  [[ $(head -n1 /tmp/version.out) == "ddprun-rdzv "* ]] ||
    fail "$1: ddprun-rdzv --version printed no 'ddprun-rdzv VERSION' line"
}

# GET $1 into $2 (python3 is the one HTTP client a bare root has); fails unless the answer is 200.
scrape() {
  $T 30 python3 -c 'import sys, urllib.request
r = urllib.request.urlopen(sys.argv[1], timeout=10)
sys.stdout.write(r.read().decode())
sys.exit(0 if r.status == 200 else 1)' "$1" >"$2"
}

# The line "...PREFIX ADDR..." of FILE, printed by the process PID: waits up to 15 s for it, prints
# ADDR (IPv4:port). Runs in $(...): what it says on failure goes to stderr, not into the result.
wait_address() {  # $1: file, $2: the text before the address, $3: pid, $4: what, for messages
  local addr="" _
  for _ in $(seq 150); do
    addr=$(sed -n "s|.*$2\([0-9.]*:[0-9][0-9]*\).*|\1|p" "$1" | head -n1)
    [ -n "$addr" ] && break
    kill -0 "$3" 2>/dev/null || { cat "$1" >&2; fail "$4 exited at start" >&2; }
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$1" >&2; fail "$4 did not print its address within 15 s" >&2; }
  echo "$addr"
}

single_node() {  # $1: label
  step "$1: ddprun --nproc_per_node=2 python3 /pkgs/prog.py"
  local rc=0
  $T 120 ddprun --nproc_per_node=2 python3 /pkgs/prog.py >/tmp/single.out 2>&1 || rc=$?
  cat /tmp/single.out
  [ $rc -eq 0 ] || fail "$1: single-node ddprun exited $rc"
  for r in 0 1; do
    grep -q "prog: RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 " /tmp/single.out || fail "$1: rank $r did not print"
  done
  echo "bare_root_check: $1: single-node 2 ranks ok"
}

# The agent's metrics port, as Prometheus would scrape it during a job: ddprun --metrics_port=0
# prints where it listens (at --log_level=info); the workers hold (prog.py's PROG_HOLD) until the
# scrape is taken, so both count as running in it.
agent_metrics() {  # $1: label
  step "$1: ddprun --metrics_port=0 --nproc_per_node=2, scraped while the workers run"
  rm -f /tmp/release
  PROG_HOLD=/tmp/release $T 120 ddprun --nproc_per_node=2 --metrics_port=0 --log_level=info \
    python3 /pkgs/prog.py >/tmp/agent.out 2>&1 &
  agent_pid=$!
  local addr _ held=0 rc=0 out=/pkgs/scrapes/$1-ddprun.prom
  addr=$(wait_address /tmp/agent.out "metrics and probes on http://" "$agent_pid" "$1: ddprun --metrics_port=0")
  echo "ddprun's metrics port: http://$addr/metrics"
  for _ in $(seq 300); do
    held=$(grep -c "prog: RANK=[01] holding until" /tmp/agent.out || true)
    [ "$held" -eq 2 ] && break
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ "$held" -eq 2 ] || { cat /tmp/agent.out; fail "$1: the 2 workers did not start within 30 s"; }
  scrape "http://$addr/healthz" /tmp/healthz.out || { cat /tmp/agent.out; fail "$1: ddprun's /healthz did not answer 200"; }
  scrape "http://$addr/metrics" "$out" || { cat /tmp/agent.out; fail "$1: ddprun's /metrics did not answer 200"; }
  touch /tmp/release
  wait "$agent_pid" || rc=$?
  agent_pid=""
  cat /tmp/agent.out
  [ $rc -eq 0 ] || fail "$1: ddprun --metrics_port=0 exited $rc"
  echo "$(wc -l <"$out") lines in $out; among them:"
  grep -E '^(ddprun_agent_workers|process_resident_memory_bytes)[ {]' "$out" || true
  grep -qx 'ddprun_agent_workers{state="running"} 2' "$out" ||
    fail "$1: the scrape has no ddprun_agent_workers{state=\"running\"} 2 line"
  echo "bare_root_check: $1: ddprun's metrics port scraped"
}

two_node() {  # $1: label
  step "$1: 2-node job (ddprun-rdzv on 127.0.0.1 with --metrics_port 0, two agents)"
  # Port 0: the daemon takes free ports and prints them ("ddprun-rdzv listening on 127.0.0.1:PORT",
  # then "ddprun-rdzv metrics on 127.0.0.1:PORT").
  $T 300 ddprun-rdzv --port 0 --bind 127.0.0.1 --metrics_port 0 --log_level info >/tmp/rdzv.out 2>&1 &
  rdzv_pid=$!
  local addr maddr port
  addr=$(wait_address /tmp/rdzv.out "ddprun-rdzv listening on " "$rdzv_pid" "$1: ddprun-rdzv")
  maddr=$(wait_address /tmp/rdzv.out "ddprun-rdzv metrics on " "$rdzv_pid" "$1: ddprun-rdzv --metrics_port 0")
  port=${addr##*:}
  echo "ddprun-rdzv listens on $addr, its metrics port on $maddr"
  local args=(--nnodes=2 --nproc_per_node=1 --rdzv_backend=grpc "--rdzv_endpoint=127.0.0.1:$port"
              "--rdzv_id=bare-$1" --shutdown_timeout=2)
  $T 120 ddprun "${args[@]}" python3 /pkgs/prog.py >/tmp/node_a.out 2>&1 &
  local a=$!
  $T 120 ddprun "${args[@]}" python3 /pkgs/prog.py >/tmp/node_b.out 2>&1 &
  local b=$!
  local rc_a=0 rc_b=0
  wait $a || rc_a=$?
  wait $b || rc_b=$?
  echo "--- agent a (exit $rc_a) ---"; cat /tmp/node_a.out
  echo "--- agent b (exit $rc_b) ---"; cat /tmp/node_b.out
  # The daemon's metrics after the job, before it is stopped: the job is forgotten once its agents
  # left, its series are kept 2 minutes more (daemon_metrics.cc).
  local out=/pkgs/scrapes/$1-ddprun-rdzv.prom scraped=1
  scrape "http://$maddr/readyz" /tmp/readyz.out && scrape "http://$maddr/metrics" "$out" || scraped=0
  stop_rdzv
  echo "--- ddprun-rdzv ---"; cat /tmp/rdzv.out
  if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then fail "$1: 2-node agents exited $rc_a and $rc_b"; fi
  for r in 0 1; do
    grep -q "prog: RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 " /tmp/node_a.out /tmp/node_b.out ||
      fail "$1: 2-node rank $r did not print with WORLD_SIZE=2"
  done
  echo "bare_root_check: $1: 2-node job ok"
  [ $scraped -eq 1 ] || fail "$1: ddprun-rdzv's /readyz or /metrics did not answer 200"
  echo "$(wc -l <"$out") lines in $out; among them:"
  grep -E '^ddprun_(jobs|rounds_formed_total)[ {]' "$out" || true
  grep -qx "ddprun_rounds_formed_total{run_id=\"bare-$1\"} 1" "$out" ||
    fail "$1: the daemon's scrape has no ddprun_rounds_formed_total{run_id=\"bare-$1\"} 1 line"
  echo "bare_root_check: $1: ddprun-rdzv's metrics port scraped"
}

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
base_path=$PATH

step "the bare root"
# shellcheck disable=SC1091
. /etc/os-release
echo "$PRETTY_NAME; $(python3 --version); $(dpkg-query -W -f='${binary:Package}\n' | wc -l) packages"

# ---------------- the wheel ----------------
step "wheel: python3 -m venv /opt/venv"
$T 300 python3 -m venv /opt/venv
step "wheel: pip install --no-index $wheel"
$T 300 /opt/venv/bin/pip install --no-index --disable-pip-version-check "$wheel"
export PATH=/opt/venv/bin:$base_path
step "wheel: shared libraries"
find /opt/venv -path '*ddprun*' -type f | sort | check_libs
versions wheel /opt/venv/bin
single_node wheel
agent_metrics wheel
two_node wheel
step "wheel: import ddprun"
$T 60 /opt/venv/bin/python3 -c 'import ddprun; print(ddprun.__file__)' | tee /tmp/import.out
[[ $(cat /tmp/import.out) == /opt/venv/* ]] || fail "wheel: the venv's python3 imported ddprun from outside the venv"
echo "bare_root_check: wheel: ok"

# ---------------- the .deb ----------------
export PATH=$base_path
export DEBIAN_FRONTEND=noninteractive
# bare_root.sh keeps apt's lists; they are fetched again only when missing or older than a day
# (the mirror removes superseded versions, which stale lists would still ask for).
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null)" ]; then
  step "deb: apt-get update (lists missing or older than a day)"
  $T 600 apt-get update
fi
step "deb: apt-get install -y $deb"
# No pty for dpkg's log: the root has no /dev/pts (apt would print "E: Can not write log").
(cd /pkgs && $T 600 apt-get install -y -o Dpkg::Use-Pty=0 "./$(basename "$deb")")
pkg=$(dpkg-deb -f "$deb" Package)
dpkg-query -W "$pkg"
step "deb: shared libraries"
dpkg -L "$pkg" | check_libs
versions deb /usr/bin
deb_python=0
[ -d /usr/lib/python3/dist-packages/ddprun ] && deb_python=1
if [ $deb_python -eq 1 ]; then
  unset PROG_DDPRUN_OPTIONAL
else
  echo "(the .deb ships no /usr/lib/python3/dist-packages/ddprun: prog.py runs without import ddprun)"
  export PROG_DDPRUN_OPTIONAL=1
fi
single_node deb
agent_metrics deb
two_node deb
if [ $deb_python -eq 1 ]; then
  step "deb: import ddprun"
  $T 60 /usr/bin/python3 -c 'import ddprun; print(ddprun.__file__)' || fail "deb: import ddprun from /usr/bin/python3"
fi
echo "bare_root_check: deb: ok"
echo "bare_root_check: the checks inside the root passed"
INSIDE
chmod 755 "$root/pkgs/inside.sh"

echo "bare_root_check: root $root, wheel $(basename "$wheel"), deb $(basename "$deb")"
# Runs in the new namespaces, before the chroot: the minimal /dev (see the top of this file).
# shellcheck disable=SC2016
ns_setup='set -e
r=$1; shift
mount -t tmpfs -o mode=755,nosuid,size=1m tmpfs "$r/dev"
mknod -m 666 "$r/dev/null" c 1 3; mknod -m 666 "$r/dev/zero" c 1 5; mknod -m 666 "$r/dev/full" c 1 7
mknod -m 666 "$r/dev/random" c 1 8; mknod -m 666 "$r/dev/urandom" c 1 9; mknod -m 666 "$r/dev/tty" c 5 0
ln -s /proc/self/fd "$r/dev/fd"
ln -s fd/0 "$r/dev/stdin"; ln -s fd/1 "$r/dev/stdout"; ln -s fd/2 "$r/dev/stderr"
mkdir -m 755 "$r/dev/pts"; mkdir -m 1777 "$r/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=256m tmpfs "$r/dev/shm"
exec chroot "$r" "$@"'
rc=0
timeout -k 10 "$limit" unshare --mount --pid --fork --kill-child --mount-proc="$root/proc" \
  /bin/bash -c "$ns_setup" ns_setup "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
  /bin/bash /pkgs/inside.sh "$(basename "$wheel")" "$(basename "$deb")" || rc=$?

# The mounts lived in the namespace that just ended; make sure (a leftover would keep the root busy).
if awk -v r="$root" '$5 == r || index($5, r "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
  echo "bare_root_check: error: mounts left under $root:" >&2
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print "  " $5 }' /proc/self/mountinfo >&2
  exit 1
fi
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  die "timed out after ${limit}s inside the root (DDPRUN_BARE_CHECK_TIMEOUT)"
fi
[ $rc -eq 0 ] || die "a check inside the root failed (exit $rc; the step above says which)"

# The scrapes, by the host's promtool: it must say nothing at all (a lint complaint is a failure too).
for label in wheel deb; do
  for b in ddprun ddprun-rdzv; do
    f=$root/pkgs/scrapes/$label-$b.prom
    printf '\n== %s: promtool check metrics < %s ==\n' "$label" "${f#"$root"}"
    [ -s "$f" ] || die "$label: no scrape of $b's metrics port ($f)"
    prc=0
    said=$(timeout -k 5 60 promtool check metrics <"$f" 2>&1) || prc=$?
    echo "promtool: exit $prc${said:+, said:}"
    [ -z "$said" ] || echo "$said"
    if [ $prc -ne 0 ] || [ -n "$said" ]; then die "$label: promtool check metrics rejected $b's scrape (above)"; fi
    echo "bare_root_check: $label: promtool check metrics $b: ok"
  done
done
echo "bare_root_check: all checks passed"
