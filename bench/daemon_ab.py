#!/usr/bin/env python3
"""Two ddprun-rdzv builds side by side, interleaved: the front door, the relay and the store framing
before and after a change to them (issues #33 item 5 and #37: one event loop, the store framing's
memory bound, the relay's handshake turns and drains).

Per repetition and build (A, then B, then A...): a fresh daemon without a job token (the guard on: every
gRPC connection passes the relay; no token because ddprun-store-bench shows none);
  - agents: ddprun-rdzv-capacity (of build B: the same client for both daemons) forms one job of
    --nodes simulated agents, each its own gRPC connection through the relay, then their --nodes
    store clients (gRPC, through the relay) do the bootstrap: connect, join, store wall times and
    the daemon's CPU;
  - store framing: a real 1-node ddprun job holds a round; ddprun-store-bench (build B) runs
    get and add at 1 and 8 clients over the store's own framing: ops/s.
Reported as B/A ratios of the medians. Noisy machines: read the min-max too.

  bench/daemon_ab.py --a /work/wt-old/build --b build --reps 5 --nodes 500 --report out.md

Stdlib only. Every child is bounded in time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import benchlib


def capacity(gen, port, pid, token, nodes):
    out = subprocess.run([gen, "--address", "127.0.0.1:%d" % port, "--jobs", "1", "--nodes", str(nodes), "--store",
                          "--daemon_pid", str(pid)], capture_output=True, text=True,
                         timeout=180, preexec_fn=benchlib.raise_nofile)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not line:
        raise RuntimeError("ddprun-rdzv-capacity printed nothing: %s" % out.stderr[-500:])
    j = json.loads(line[-1])
    if j.get("error"):
        raise RuntimeError("ddprun-rdzv-capacity: %s" % j["error"])
    return j


def store_ops(b, port, token, workdir, tag, seconds):
    """ops/s of get and add at 1 and 8 clients over the store framing, on a real job's round."""
    info = os.path.join(workdir, "info-%s" % tag)
    script = 'echo "$DDPRUN_ROUND $TORCHELASTIC_RUN_ID" > "%s.tmp" && mv "%s.tmp" "%s" && exec sleep 600' % (
        info, info, info)
    run_id = "ab-%s" % uuid.uuid4().hex[:8]
    agent = subprocess.Popen([os.path.join(b, "bin", "ddprun"), "--nnodes=1", "--rdzv_backend=grpc",
                              "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=" + run_id, "--nproc_per_node=1",
                              "--rdzv_conf=is_host=0", "--no_python", "/bin/sh", "-c", script],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(info):
            if time.monotonic() > deadline:
                raise RuntimeError("the store job's worker did not start")
            time.sleep(0.05)
        rnd, rid = open(info).read().split()
        out = subprocess.run([os.path.join(b, "bin", "ddprun-store-bench"), "--port", str(port), "--run_id", rid,
                              "--round", rnd, "--ops", "get,add", "--clients", "1,8", "--seconds", str(seconds)],
                             capture_output=True, text=True, timeout=120)
        res = {}
        for l in out.stdout.splitlines():
            if l.startswith("{"):
                j = json.loads(l)
                res["%s@%d" % (j["op"], j["clients"])] = j["ops_per_s"]
        if not res:
            raise RuntimeError("ddprun-store-bench printed nothing: %s" % out.stderr[-500:])
        return res
    finally:
        benchlib.kill_sessions([agent])


def one(build, b, args, workdir, rep, token):
    log = os.path.join(workdir, "rdzv-%s-%d.log" % (os.path.basename(os.path.dirname(build.rstrip("/"))), rep))
    proc, port = benchlib.start_rdzv(os.path.join(build, "bin", "ddprun-rdzv"), log, ["--log_level", "warning"])
    try:
        j = capacity(os.path.join(b, "bin", "ddprun-rdzv-capacity"), port, proc.pid, token, args.nodes)
        r = {k: j.get(k) for k in ("connect_wall_s", "first_join_to_all_assigned_s", "store_all_done_s",
                                   "store_set_p50_s", "store_get_p50_s", "connect_daemon_cpu_s", "join_daemon_cpu_s",
                                   "store_daemon_cpu_s")}
        r.update(store_ops(b, port, token, workdir, "%d-%d" % (rep, port), args.store_seconds))
        return r
    finally:
        benchlib.stop(proc)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="the build before (its bin/ddprun-rdzv)")
    p.add_argument("--b", required=True, help="the build after (its daemon, and the clients for both)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--store_seconds", type=int, default=2)
    p.add_argument("--report", default=None)
    p.add_argument("--smoke", action="store_true", help="one run each of 10 agents, 1 s of store ops (ctest; A may be B)")
    args = p.parse_args()
    if args.smoke:
        args.reps, args.nodes, args.store_seconds = 1, 10, 1
    for exe in [os.path.join(args.a, "bin", "ddprun-rdzv")] + [
            os.path.join(args.b, "bin", x) for x in ("ddprun-rdzv", "ddprun-rdzv-capacity", "ddprun-store-bench", "ddprun")]:
        if not os.access(exe, os.X_OK):
            sys.exit("missing %s" % exe)
    runs = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="ddprun_ab_") as workdir:
        token = os.path.join(workdir, "token")
        with open(token, "w") as f:
            f.write("ab-token-%d\n" % os.getpid())
        os.chmod(token, 0o600)
        for rep in range(args.reps):
            order = ("A", "B") if rep % 2 == 0 else ("B", "A")
            for which in order:
                r = one(args.a if which == "A" else args.b, args.b, args, workdir, rep, token)
                r["load"] = benchlib.loadavg()
                runs[which].append(r)
                print(which, json.dumps(r), flush=True)
    keys = [k for k in runs["A"][0] if k != "load"]
    lines = ["| figure | A: before, median (min-max) | B: after, median (min-max) | B / A |", "|---|---|---|---|"]
    for k in keys:
        a = [r[k] for r in runs["A"] if r.get(k) is not None]
        b = [r[k] for r in runs["B"] if r.get(k) is not None]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append("| %s | %.4g (%.4g-%.4g) | %.4g (%.4g-%.4g) | %s |" % (
            k, ma, min(a), max(a), mb, min(b), max(b), ("%.2fx" % (mb / ma)) if ma else "n/a"))
    text = "\n".join(lines)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
