#!/usr/bin/python3
"""Recovery from a bad node (README "--exclude_node_after"): three real agents on one ddprun-rdzv,
--nnodes=2:2, node c on standby; node b's worker fails every attempt. With --exclude_node_after=2
the second failure excludes b and the job goes on with c: this measures the time from b's second
failure (the worker prints a wall-clock stamp as it exits) to the workers of the next round running
on a and c (each prints a stamp as it starts), and checks that the job then ends 0.

The peer: torchrun has no exclusion. Under its c10d rendezvous (torch 1.13 at /usr/bin/torchrun,
--nnodes=2:3, the same workers) b's failures spend --max_restarts until the job fails; b is in every
round, so the job never trains on c. Its row gives the time until it fails and how it ended.

  python3 bench/exclusion_bench.py [--repeat 5] [--smoke] [--out FILE]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

WORKER = r"""#!/bin/sh
# b fails at once, every attempt; a and c run until they have started in a round without b.
now() { python3 -c 'import time; print("%.6f" % time.time())'; }
if [ "$NODE_TAG" = "b" ]; then
  echo "FAIL $(now) ${TORCHELASTIC_RESTART_COUNT}" >> "$BENCH_DIR/events"
  exit 3
fi
echo "RUN $(now) $NODE_TAG ${TORCHELASTIC_RESTART_COUNT} ${WORLD_SIZE}" >> "$BENCH_DIR/events"
sleep "$HOLD_S"
exit 0
"""


def run_agents(argv_of, tmp, hold_s, timeout_s, tags=("a", "b", "c")):
    """Starts a and b, then c once a and b ran (c is on standby), waits for all; returns (exits, events)."""
    env = dict(os.environ, BENCH_DIR=tmp, HOLD_S=str(hold_s))
    for k in list(env):
        if k.startswith(("PET_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            del env[k]
    procs = {}
    events = os.path.join(tmp, "events")
    deadline = time.monotonic() + timeout_s
    try:
        for tag in tags[:2]:
            procs[tag] = subprocess.Popen(argv_of(tag), env=dict(env, NODE_TAG=tag), stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(tmp, "agent_%s.log" % tag), "w"),
                                          start_new_session=True)
        while time.monotonic() < deadline and not (os.path.exists(events) and "FAIL" in open(events).read()):
            time.sleep(0.01)
        procs[tags[2]] = subprocess.Popen(argv_of(tags[2]), env=dict(env, NODE_TAG=tags[2]),
                                          stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(tmp, "agent_%s.log" % tags[2]), "w"),
                                          start_new_session=True)
        exits = {}
        for tag, p in procs.items():
            try:
                exits[tag] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                exits[tag] = "timeout"
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
    lines = open(events).read().split("\n") if os.path.exists(events) else []
    return exits, [l.split() for l in lines if l]


def worker_in(tmp):
    prog = os.path.join(tmp, "w.sh")
    with open(prog, "w") as f:
        f.write(WORKER)
    os.chmod(prog, 0o755)
    return prog


def measure_ddprun(args, rdzv_port, i):
    tmp = tempfile.mkdtemp(prefix="ddprun_exclusion_")
    try:
        prog = worker_in(tmp)
        start = time.time()

        def argv_of(tag):
            return [args.ddprun, "--nnodes=2:2", "--rdzv_backend=grpc", "--rdzv_endpoint=127.0.0.1:%d" % rdzv_port,
                    "--rdzv_id=excl%d_%d" % (os.getpid(), i), "--nproc_per_node=1", "--max_restarts=3",
                    "--exclude_node_after=2", "--shutdown_timeout=2", prog]

        exits, events = run_agents(argv_of, tmp, args.hold, args.timeout)
        fails = [float(e[1]) for e in events if e[0] == "FAIL"]
        runs_c = [float(e[1]) for e in events if e[0] == "RUN" and e[2] == "c"]
        runs_a_after = [float(e[1]) for e in events if e[0] == "RUN" and e[2] == "a" and len(fails) >= 2
                        and float(e[1]) > fails[1]]
        recovery = None
        if len(fails) >= 2 and runs_c and runs_a_after:
            recovery = max(min(runs_c), min(runs_a_after)) - fails[1]
        return {"exits": exits, "fails": len(fails), "recovery_s": recovery, "total_s": time.time() - start}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_torchrun(args, i):
    tmp = tempfile.mkdtemp(prefix="torchrun_exclusion_")
    try:
        prog = worker_in(tmp)
        port = benchlib.free_port()
        start = time.time()

        def argv_of(tag):
            # --redirects/--tee 9:1: Debian's torchrun 1.13 crashes without them (tests/support/e2e_lib.py).
            return [args.torchrun, "--redirects", "9:1", "--tee", "9:1", "--nnodes=2:3", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port,
                    "--rdzv_id=excl%d_%d" % (os.getpid(), i), "--nproc_per_node=1", "--max_restarts=3",
                    "--monitor_interval=0.1", "--no_python", prog]

        exits, events = run_agents(argv_of, tmp, args.hold, args.torchrun_timeout)
        fails = [float(e[1]) for e in events if e[0] == "FAIL"]
        # Its agent for b gives up once its own budget is spent (torchrun counts restarts per
        # agent); then a and c go on without it: recovery is b's second failure to that round.
        after = lambda tag: [float(e[1]) for e in events if e[0] == "RUN" and e[2] == tag and fails and
                             float(e[1]) > fails[-1]]
        recovery = None
        if len(fails) >= 2 and after("a") and after("c"):
            recovery = max(min(after("a")), min(after("c"))) - fails[1]
        return {"exits": exits, "fails": len(fails), "recovery_s": recovery, "total_s": time.time() - start}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one run of each, short holds")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hold", type=float, default=2.0, help="seconds a and c run in the last round")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--build", default=os.path.join(benchlib.ROOT, "build"))
    ap.add_argument("--torchrun", default="/usr/bin/torchrun")
    ap.add_argument("--torchrun-runs", type=int, default=1, help="torchrun runs (each lasts --torchrun-timeout)")
    ap.add_argument("--torchrun-timeout", type=float, default=60,
                    help="seconds before torchrun's agents are killed (it does not end by itself here)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.smoke:
        args.repeat, args.hold = 1, 0.5
    args.ddprun = os.path.join(args.build, "bin", "ddprun")
    rdzv = os.path.join(args.build, "bin", "ddprun-rdzv")
    if not os.access(args.ddprun, os.X_OK) or not os.access(rdzv, os.X_OK):
        benchlib.skip("ddprun or ddprun-rdzv not built under %s" % args.build)
    tmp = tempfile.mkdtemp(prefix="exclusion_rdzv_")
    daemon, port = benchlib.start_rdzv(rdzv, os.path.join(tmp, "rdzv.log"))
    rows, recoveries = [], []
    try:
        for i in range(args.repeat):
            d = measure_ddprun(args, port, i)
            if d["recovery_s"] is not None:
                recoveries.append(d["recovery_s"])
            rows.append(["ddprun --exclude_node_after=2", str(i + 1),
                         " ".join("%s=%s" % kv for kv in sorted(d["exits"].items())), str(d["fails"]),
                         "%.3f" % d["recovery_s"] if d["recovery_s"] is not None else "none",
                         "%.2f" % d["total_s"]])
            if os.access(args.torchrun, os.X_OK) and not args.smoke and i < args.torchrun_runs:
                t = measure_torchrun(args, i)
                rows.append(["torchrun (no exclusion)", str(i + 1),
                             " ".join("%s=%s" % kv for kv in sorted(t["exits"].items())), str(t["fails"]),
                             "%.3f" % t["recovery_s"] if t["recovery_s"] is not None else "none",
                             "%.2f" % t["total_s"]])
    finally:
        benchlib.stop(daemon)
        shutil.rmtree(tmp, ignore_errors=True)
    out = ["# Recovery from a bad node: exclusion and a standby", "",
           "torchrun has no exclusion: its agent on b restarts with the others until b's own budget "
           "(--max_restarts=3, counted per agent) is spent, then exits 1, and a and c go on without it.", "", benchlib.machine_text(), "",
           "Command: `python3 bench/exclusion_bench.py %s`" % " ".join(sys.argv[1:]), ""]
    out += benchlib.md_table(["launcher", "run", "exit codes", "b's failures", "K-th failure to training on a+c (s)",
                              "total (s)"], rows)
    if recoveries:
        out += ["", "ddprun, K-th failure to the next round's workers running on a and c: median %.3f s "
                "(min %.3f, max %.3f) over %d runs" % (statistics.median(recoveries), min(recoveries),
                                                     max(recoveries), len(recoveries))]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
