#!/usr/bin/env python3
"""A job's rendezvous round while ddprun-rdzv is under HTTP/2 abuse, side by side with the quiet figure.

For each repetition: a fresh ddprun-rdzv with a job token; ddprun-rdzv-capacity (bench/rdzv_capacity.cc)
runs one job of --nodes simulated agents (each its own connection and Session stream, with the token)
and reports the time from its first Join to every node assigned to the round ("round time"). First
quiet, then while tests/integration/http2_attack.py attacks from 127.0.0.2 (no token; rapid reset:
HEADERS + RST_STREAM in a loop, --connections connections). The daemon's RSS is sampled every 50 ms;
"after" is its RSS 10 s after the attack ended (the daemon trims its heap every 5 s).

Then --connection_guard=off without a token, under the same attack (issue #37 item 1). Until #37 that
was gRPC 1.51 on its own (connections unrelayed; the earlier tables' "peer" row, run with the call
limits lifted too): it grew to 2.4 GB and died at its address-space cap. Off now keeps the relay's frame
limits. It runs under an address-space cap (--unguarded_cap_mib) all the same, and the report says
whether it survived.

Build first (the bench targets are on by default, DDPRUN_BUILD_BENCH):
  cmake --build build-bench -- ddprun-rdzv ddprun-rdzv-capacity
  bench/rdzv_abuse.py --build build-bench --report bench/RESULTS_ABUSE.md

Stdlib only. Every child is bounded in time.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import benchlib
from benchlib import cpu_s, rss_kb, stop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTACK = os.path.join(ROOT, "tests", "integration", "http2_attack.py")


class Sampler:
    def __init__(self, pid):
        self.pid, self.peak, self.running = pid, 0, True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            self.peak = max(self.peak, rss_kb(self.pid))
            time.sleep(0.05)

    def stop(self):
        self.running = False
        self.thread.join(5)
        return self.peak


def start_daemon(rdzv, token, guard, cap_mib, log_path):
    extra = ["--log_level", "warning", "--connection_guard", guard]
    if token:
        extra += ["--token_file", token]
    # Without a token: the guard's gate has nothing to wait for; the limits are the defaults.
    wrap = ["prlimit", "--as=%d" % (cap_mib << 20), "--"] if cap_mib else []
    return benchlib.start_rdzv(rdzv, log_path, extra, wrap)


def round_time(gen, port, pid, token, nodes, tag, timeout_s):
    """Seconds from the job's first Join to all nodes assigned, or None when the round failed."""
    try:
        out = subprocess.run([gen, "--address", "127.0.0.1:%d" % port, "--daemon_pid", str(pid), "--jobs", "1",
                              "--nodes", str(nodes), "--tag", tag, "--timeout_s", str(timeout_s)] +
                             (["--token_file", token] if token else []),
                             capture_output=True, text=True, timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])["first_join_to_all_assigned_s"]
    except (IndexError, KeyError, ValueError):
        return None


def attack(port, seconds, connections, spread, source="127.0.0.2"):
    # The spreading attacker is a smart one: it opens as many streams per connection as the guard
    # lets an unauthenticated connection open, then moves to a new address. `source` 127.0.0.1 is
    # the agents' own address (one host, or a NAT gateway in front of them and the attacker).
    where = ["--spread", "--per_connection", "16"] if spread else ["--source", source]
    return subprocess.Popen([sys.executable, ATTACK, "--port", str(port), "--attack", "rapid_reset", "--seconds",
                             str(seconds), "--connections", str(connections)] + where,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def generator(build):
    # $DDPRUN_RDZV_CAPACITY: where ctest's build put it (bench/CMakeLists.txt).
    return os.environ.get("DDPRUN_RDZV_CAPACITY") or os.path.join(build, "bin", "ddprun-rdzv-capacity")


def one_rep(args, guard, cap_mib, rep, workdir, spread=False, token=True, source="127.0.0.2"):
    rdzv = os.path.join(args.build, "bin", "ddprun-rdzv")
    gen = generator(args.build)
    log = os.path.join(workdir, "rdzv-%s-%d.log" % (guard, rep))
    token = args.token if token else None
    daemon, port = start_daemon(rdzv, token, guard, cap_mib, log)
    r = {"guard": guard, "rep": rep}
    try:
        r["rss_start_kb"] = rss_kb(daemon.pid)
        r["quiet_s"] = round_time(gen, port, daemon.pid, token, args.nodes, "q%d%s" % (rep, guard), 30)
        sampler = Sampler(daemon.pid)
        cpu0 = cpu_s(daemon.pid)
        attacker = attack(port, args.attack_s, args.connections, spread, source)
        time.sleep(1.0)  # the attack is under way
        r["attack_s"] = round_time(gen, port, daemon.pid, token, args.nodes, "a%d%s" % (rep, guard),
                                   args.attack_s + 60)
        try:
            out, _ = attacker.communicate(timeout=args.attack_s + 30)
            r["attacker"] = json.loads(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, IndexError, ValueError):
            attacker.kill()
            attacker.communicate()
        r["rss_peak_kb"] = sampler.stop()
        r["daemon_cpu_during_s"] = round(cpu_s(daemon.pid) - cpu0, 2)
        r["survived"] = daemon.poll() is None
        time.sleep(args.after_s)
        r["rss_after_kb"] = rss_kb(daemon.pid) if daemon.poll() is None else None
        r["survived"] = daemon.poll() is None
    finally:
        r["exit"] = stop(daemon)
    return r


def fmt_s(values):
    values = [v for v in values if v is not None]
    if not values:
        return "failed"
    return "%.3f (%.3f-%.3f)" % (statistics.median(values), min(values), max(values))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--attack_s", type=float, default=8)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--unguarded_cap_mib", type=int, default=3072)
    p.add_argument("--report", default=None)
    p.add_argument("--after_s", type=float, default=10, help="when the RSS after the attack is read")
    p.add_argument("--same_address_only", action="store_true",
                   help="only the attacker at the agents' own address (issue #24 item 8), a short table")
    p.add_argument("--smoke", action="store_true",
                   help="one repetition of 3 nodes, a 1 s attack: does it still run? (ctest)")
    args = p.parse_args()
    if args.smoke:
        args.reps, args.nodes, args.attack_s, args.connections, args.after_s = 1, 3, 1.0, 2, 0.5
        args.unguarded_cap_mib = min(args.unguarded_cap_mib, 1024)
    for exe in (os.path.join(args.build, "bin", "ddprun-rdzv"), generator(args.build)):
        if not os.access(exe, os.X_OK):
            sys.exit("missing %s: build it first (see --help)" % exe)
    if not os.path.exists(ATTACK):
        benchlib.skip("%s is not in this tree" % ATTACK)
    with tempfile.TemporaryDirectory(prefix="ddprun_abuse_") as workdir:
        args.token = os.path.join(workdir, "token")
        with open(args.token, "w") as f:
            f.write("bench-token-%d\n" % os.getpid())
        os.chmod(args.token, 0o600)
        same = [one_rep(args, "auto", 0, i, workdir, source="127.0.0.1") for i in range(args.reps)]
        if args.same_address_only:
            for r in same:
                print(json.dumps(r), flush=True)
            print("| attacker at the agents' address | quiet %s | under attack %s | %.2fx |" % (
                fmt_s([r["quiet_s"] for r in same]), fmt_s([r["attack_s"] for r in same]),
                statistics.median(r["attack_s"] / r["quiet_s"] for r in same if r["attack_s"] and r["quiet_s"])))
            return 0
        guarded = [one_rep(args, "auto", 0, i, workdir) for i in range(args.reps)]
        spread = [one_rep(args, "auto", 0, i, workdir, spread=True) for i in range(args.reps)]
        # Issue #37 item 2: no token to gate on; the penalized address's connections on probation.
        same_open = [one_rep(args, "on", 0, i, workdir, source="127.0.0.1", token=False) for i in range(args.reps)]
        unguarded = [one_rep(args, "off", args.unguarded_cap_mib, 0, workdir, token=False)]
    for r in same + guarded + spread + same_open + unguarded:
        print(json.dumps(r), flush=True)
    u = unguarded[0]

    def row(name, reps):
        quiet = [r["quiet_s"] for r in reps]
        under = [r["attack_s"] for r in reps]
        ratio = [a / q for a, q in zip(under, quiet) if a is not None and q]
        return "| %s | %s | %s | %s | %d MiB | %d MiB | %s | %s |" % (
            name, fmt_s(quiet), fmt_s(under), ("%.2fx" % statistics.median(ratio)) if ratio else "n/a",
            statistics.median(r["rss_start_kb"] for r in reps) >> 10, max(r["rss_peak_kb"] for r in reps) >> 10,
            "%d MiB" % (max((r["rss_after_kb"] or 0) for r in reps) >> 10),
            statistics.median(r["daemon_cpu_during_s"] for r in reps))

    lines = [
        "# ddprun-rdzv under HTTP/2 abuse",
        "",
        "Measured %s on %s (%d cores), `bench/rdzv_abuse.py --reps %d --nodes %d --attack_s %g --connections %d`."
        % (datetime.date.today(), platform.node(), os.cpu_count(), args.reps, args.nodes, args.attack_s,
           args.connections),
        "Attack: rapid reset (HEADERS + RST_STREAM in a loop, no token) from 127.0.0.2 (or, second row, from a new"
        " loopback address for every connection) over %d connections at a time for"
        " %g s; the job: %d simulated agents with the token (bench/rdzv_capacity.cc), round time = first Join"
        " to every node assigned. Median (min-max) of %d fresh daemons." % (args.connections, args.attack_s,
                                                                          args.nodes, args.reps),
        "",
        "| daemon | round quiet (s) | round under attack (s) | attack / quiet | RSS start | RSS peak | RSS %g s after | daemon CPU during (s) |" % args.after_s,
        "|---|---|---|---|---|---|---|---|",
        row("ddprun-rdzv (guard auto: on with a token); attacker at one address", guarded),
        row("ddprun-rdzv; the attacker at the agents' own address (127.0.0.1: one host, a NAT gateway)", same),
        row("ddprun-rdzv, the attacker at a new address for every connection, 16 streams each (no penalty applies)", spread),
        row("ddprun-rdzv without a token (guard on); the attacker at the agents' own address (#37 item 2: on probation)",
            same_open),
        "| ddprun-rdzv `--connection_guard=off`, no token (before #37: gRPC 1.51 alone, 2.4 GB, died at its cap; address space capped at %d MiB) | %s | %s | %s | %d MiB | %d MiB | %s | %s |" % (
            args.unguarded_cap_mib, fmt_s([u["quiet_s"]]), fmt_s([u["attack_s"]]),
            ("%.2fx" % (u["attack_s"] / u["quiet_s"])) if u["attack_s"] and u["quiet_s"] else "n/a",
            u["rss_start_kb"] >> 10, u["rss_peak_kb"] >> 10,
            ("%d MiB" % (u["rss_after_kb"] >> 10)) if u["rss_after_kb"] is not None else "died (exit %s)" % u["exit"],
            u["daemon_cpu_during_s"]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    # ddprun's own rounds must have happened (the peer's may fail: that is its finding).
    ours = [r[k] for r in guarded + spread + same_open for k in ("quiet_s", "attack_s")]
    if any(v is None for v in ours):
        print("a round of ddprun-rdzv failed (see the table)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
