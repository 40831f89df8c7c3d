#!/usr/bin/env python3
"""Health probes under a flood of silent connections to the metrics port (issue #37 item 4).

A ddprun-rdzv with --metrics_port 0; an attacker holds `--connections` connections to the metrics
port that never send a byte, each opened again as soon as the daemon closes it, for `--attack_s`;
meanwhile a prober sends GET /healthz from 127.0.0.1 every `--interval_s`, each with a 1 s timeout
(a kubelet probe's default). Reported per daemon and attacker address: probes answered 200 of
sent, and how many connections the attacker opened. Given --old, the same runs against that
build's ddprun-rdzv, interleaved, for a side-by-side.

  bench/probe_abuse.py --build build --old ../main-old/build --reps 3 --report /tmp/probes.md
  bench/probe_abuse.py --smoke      (one 2 s run per address: does it still run?)

Stdlib only; every child bounded in time.
"""
import argparse
import os
import re
import select
import socket
import statistics
import sys
import tempfile
import threading
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_daemon(rdzv, log_path):
    proc, _ = benchlib.start_rdzv(rdzv, log_path, ["--log_level", "warning", "--metrics_port", "0"])
    line = proc.stdout.readline()
    m = re.search(r"metrics on \S+:(\d+)", line)
    if not m:
        benchlib.stop(proc)
        raise RuntimeError("no metrics address: %r" % line)
    return proc, int(m.group(1))


def connect_from(source, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


class Flood(threading.Thread):
    """`count` silent connections from `source`, each reopened as soon as it closes, until stopped."""

    def __init__(self, source, port, count):
        super().__init__(daemon=True)
        self.source, self.port, self.count = source, port, count
        self.opened = 0
        self.stopping = threading.Event()

    def run(self):
        socks = [connect_from(self.source, self.port) for _ in range(self.count)]
        self.opened = sum(1 for s in socks if s)
        while not self.stopping.is_set():
            live = [s for s in socks if s]
            ready = select.select(live, [], [], 0.005)[0] if live else []
            for i, s in enumerate(socks):
                if s is not None and s not in ready:
                    continue
                if s is not None:
                    s.close()
                socks[i] = connect_from(self.source, self.port)
                self.opened += 1
        for s in socks:
            if s:
                s.close()


def probe(port, timeout_s=1.0):
    """GET /healthz from 127.0.0.1: True when answered 200 within timeout_s."""
    deadline = time.monotonic() + timeout_s
    s = connect_from("127.0.0.1", port)
    if not s:
        return False
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            s.settimeout(left)
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.startswith(b"HTTP/1.1 200 ")
    except OSError:
        return False
    finally:
        s.close()


def one_run(rdzv, source, args, tmp):
    proc, port = start_daemon(rdzv, os.path.join(tmp, "rdzv.log"))
    try:
        quiet = sum(probe(port) for _ in range(5))
        cpu0 = benchlib.cpu_s(proc.pid)
        flood = Flood(source, port, args.connections)
        flood.start()
        time.sleep(0.2)  # the flood holds its places
        sent = answered = 0
        end = time.monotonic() + args.attack_s
        while time.monotonic() < end:
            nxt = time.monotonic() + args.interval_s
            sent += 1
            answered += probe(port)
            time.sleep(max(0.0, nxt - time.monotonic()))
        flood.stopping.set()
        flood.join(10)
        cpu = benchlib.cpu_s(proc.pid) - cpu0
        return {"quiet": quiet, "sent": sent, "answered": answered, "opened": flood.opened, "cpu": cpu,
                "alive": proc.poll() is None}
    finally:
        benchlib.stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--old", help="another build folder whose ddprun-rdzv runs side by side")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attack_s", type=float, default=8.0)
    ap.add_argument("--interval_s", type=float, default=0.1)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--report")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.attack_s = 1, 2.0
    builds = [("new", args.build)] + ([("old", args.old)] if args.old else [])
    daemons = []
    for name, build in builds:
        rdzv = os.path.join(build, "bin", "ddprun-rdzv")
        if not os.access(rdzv, os.X_OK):
            benchlib.skip("no %s" % rdzv)
        daemons.append((name, rdzv))
    # Another address than the prober's, and the prober's own (a process on the node, or whatever
    # shares the kubelet's address).
    sources = ["127.0.0.2", "127.0.0.1"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="probe-abuse-") as tmp:
        for rep in range(args.reps):
            for source in sources:
                for name, rdzv in daemons:  # interleaved: the machine's drift hits both alike
                    r = one_run(rdzv, source, args, tmp)
                    results.setdefault((name, source), []).append(r)
                    print("rep %d %s attacker %s: %d/%d probes answered (quiet %d/5), attacker opened %d, daemon %.1f CPU-s" %
                          (rep, name, source, r["answered"], r["sent"], r["quiet"], r["opened"], r["cpu"]), flush=True)
    rows = []
    for (name, source), rs in results.items():
        answered = [r["answered"] for r in rs]
        sent = [r["sent"] for r in rs]
        rows.append([
            "%s ddprun-rdzv" % name, source,
            "%d of %d" % (sum(answered), sum(sent)),
            "%.0f%%" % (100.0 * sum(answered) / max(1, sum(sent))),
            "%d-%d" % (min(answered), max(answered)),
            "%.0f" % statistics.median(r["opened"] / args.attack_s for r in rs),
            "%.1f" % statistics.median(r["cpu"] for r in rs),
            "yes" if all(r["alive"] for r in rs) else "NO"])
    table = "\n".join(benchlib.md_table(["daemon", "attacker address", "probes answered 200 (all reps)", "share",
                               "per rep (min-max)", "attacker connections opened / s (median)",
                               "daemon CPU-s during the attack (median)", "daemon alive"],
                              rows)) + "\n"
    head = ("%s; `bench/probe_abuse.py --reps %d --attack_s %g --interval_s %g --connections %d`; %s\n\n" %
            (time.strftime("%Y-%m-%d"), args.reps, args.attack_s, args.interval_s, args.connections,
             benchlib.machine_text()))
    print(head + table)
    if args.report:
        with open(args.report, "w") as f:
            f.write(head + table)


if __name__ == "__main__":
    sys.exit(main())
