#!/usr/bin/env python3
"""Rendezvous time side by side: ddprun on etcd, ddprun on its own daemon, torchrun's etcd backend
(etcd's v2 API, python3-etcd) and torchrun's c10d, for 2/4/8 nodes, all on loopback; then how fast
ddprun on etcd notices a lost node.

  rendezvous  N agents (separate processes, one worker each, `sh` that stamps a file and exits),
              started together: time from the first agent's start to all N workers running.
              Median of --reps fresh runs; every case uses the same 3-member etcd 3.4 cluster
              (scripts/etcd_cluster.py, v2 enabled for torch).
  node loss   3 agents of an elastic job (--nnodes=2:3, heartbeat_timeout H) on etcd; one agent
              is SIGKILLed (its watchdog kills its workers): time until the two survivors' workers
              of the next round run. Goal: within the lease TTL (H) plus 1 s.

    bench/etcd_rdzv_bench.py [--sizes 2,4,8] [--reps 3] [--torch /usr/bin/torchrun] [--smoke]
                             [--output bench/RESULTS_MULTINODE.md (appends a section)] [--no-write]

Not a test (ctest runs only its --smoke case). Every process it starts is in its own session and killed at the end of
its case; the etcd cluster and the temporary folders are removed.
"""

import argparse
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ports  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_available  # noqa: E402

import benchlib  # noqa: E402

# One file per worker and round. Not "$$": torchrun runs its arguments through string.Template,
# which turns "$$" into "$" (every worker would write the same file).
STAMP = 'echo "$RANK $DDPRUN_ROUND" > "$STAMP_DIR/w.${RANK}_${DDPRUN_ROUND:-0}"; [ -z "$HOLD" ] || while [ ! -e "$STAMP_DIR/release" ]; do sleep 0.02; done'
CASE_BOUND_S = 120


def env_for(stamp_dir, hold=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM_", "TORCHELASTIC_"))}
    env.update(STAMP_DIR=stamp_dir, PYTHONUNBUFFERED="1", LOGLEVEL="WARNING")
    if hold:
        env["HOLD"] = "1"
    return env


def stamps(stamp_dir):
    return glob.glob(os.path.join(stamp_dir, "w.*"))


def run_agents(argvs, n, hold=False):
    """Starts the agents; returns (seconds to n stamps or None, the stamp folder, the processes)."""
    d = tempfile.mkdtemp(prefix="etcd_bench_")
    env = env_for(d, hold)
    t0 = time.monotonic()
    procs = [subprocess.Popen(a, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(d, "agent%d.err" % i), "wb"), start_new_session=True)
             for i, a in enumerate(argvs)]
    while len(stamps(d)) < n:
        if time.monotonic() - t0 > CASE_BOUND_S or all(p.poll() is not None for p in procs):
            return None, d, procs
        time.sleep(0.002)
    return time.monotonic() - t0, d, procs


def case_argvs(kind, n, args, cluster, port, run_id):
    worker = ["--no_python", "/bin/sh", "-c", STAMP]
    if kind == "ddprun etcd":
        return [[args.ddprun, "--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_backend=etcd",
                 "--rdzv_endpoint=" + ",".join(cluster.endpoints), "--rdzv_id=" + run_id,
                 "--local_addr=127.0.0.1"] + worker] * n
    if kind == "ddprun daemon":
        return [[args.ddprun, "--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_backend=grpc",
                 "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_conf=is_host=0", "--rdzv_id=" + run_id,
                 "--local_addr=127.0.0.1"] + worker] * n
    quirk = ["--redirects", "9:1", "--tee", "9:1"] if args.torch == "/usr/bin/torchrun" else []  # DESIGN §5
    common = [args.torch] + quirk + ["--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_id=" + run_id,
                                     "--monitor_interval=0.1"]
    if kind == "torchrun c10d":
        return [common + ["--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port] + worker] * n
    if kind == "torchrun etcd (v2)":
        return [common + ["--rdzv_backend=etcd", "--rdzv_endpoint=" + cluster.endpoints[0]] + worker] * n
    raise ValueError(kind)


ALL_KINDS = ["ddprun etcd", "ddprun daemon", "torchrun c10d", "torchrun etcd (v2)"]


def rendezvous_table(args, cluster):
    kinds = args.kinds
    rows = {}
    for n in args.sizes:
        for kind in kinds:
            times, failures = [], 0
            for _ in range(args.reps):
                port = ports.free_port()
                daemon = None
                if kind == "ddprun daemon":
                    daemon = subprocess.Popen([args.rdzv, "--port", str(port)], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        try:
                            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                            break
                        except OSError:
                            time.sleep(0.01)
                t, d, procs = run_agents(case_argvs(kind, n, args, cluster, port, "b" + uuid.uuid4().hex[:10]), n)
                for p in procs:
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        pass
                benchlib.kill_sessions(procs + ([daemon] if daemon else []))
                if t is None:
                    failures += 1
                    sys.stderr.write("%s n=%d failed; agent 0 said: %s\n" % (
                        kind, n, open(os.path.join(d, "agent0.err"), errors="replace").read()[-400:]))
                else:
                    times.append(t)
                shutil.rmtree(d, True)
            rows[(kind, n)] = (statistics.median(times) if times else None, min(times, default=None),
                               max(times, default=None), failures)
            print("%-20s n=%-3d %s" % (kind, n, rows[(kind, n)]), flush=True)
    return kinds, rows


def node_loss(args, cluster, heartbeat_s):
    """Seconds from SIGKILL of one of three agents to both survivors' next-round workers."""
    run_id = "loss" + uuid.uuid4().hex[:8]
    argv = [args.ddprun, "--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=etcd",
            "--rdzv_endpoint=" + ",".join(cluster.endpoints), "--rdzv_id=" + run_id, "--local_addr=127.0.0.1",
            "--rdzv_conf=heartbeat_timeout=%g,last_call_timeout=1" % heartbeat_s, "--max_restarts=3",
            "--no_python", "/bin/sh", "-c", STAMP]
    t, d, procs = run_agents([argv] * 3, 3, hold=True)
    try:
        if t is None:
            return None
        time.sleep(1)
        victim = procs[2]
        before = set(stamps(d))
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        while time.monotonic() - killed < CASE_BOUND_S:
            new = set(stamps(d)) - before
            rounds = []
            for path in new:
                try:
                    with open(path) as f:
                        rounds.append(f.read().split()[1])
                except (OSError, IndexError):
                    pass
            if len([r for r in rounds if r != "1"]) >= 2:
                return time.monotonic() - killed
            time.sleep(0.005)
        return None
    finally:
        open(os.path.join(d, "release"), "w").close()
        benchlib.kill_sessions(procs)
        shutil.rmtree(d, True)


def fmt(x):
    return "-" if x is None else "%.3f" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--torch", default="/usr/bin/torchrun")
    ap.add_argument("--heartbeat", type=float, default=5.0)
    ap.add_argument("--output", default=os.path.join(ROOT, "bench", "RESULTS_MULTINODE.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--kinds", default=",".join(ALL_KINDS), help="a subset of: " + ", ".join(ALL_KINDS))
    ap.add_argument("--no-loss", action="store_true", help="skip the node loss measurement")
    ap.add_argument("--smoke", action="store_true",
                    help="2 nodes once, a 2 s lease for the node loss, print only: does it still run? (ctest)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.reps, args.heartbeat, args.no_write = "2", 1, 2.0, True
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.kinds = [k.strip() for k in args.kinds.split(",")]
    if not set(args.kinds) <= set(ALL_KINDS) or not {"ddprun etcd", "ddprun daemon"} <= set(args.kinds):
        sys.exit("etcd_rdzv_bench: --kinds must include ddprun etcd and ddprun daemon, from: " + ", ".join(ALL_KINDS))
    args.ddprun = os.path.join(args.build, "bin", "ddprun")
    args.rdzv = os.path.join(args.build, "bin", "ddprun-rdzv")
    for exe in (args.ddprun, args.rdzv):
        if not os.access(exe, os.X_OK):
            sys.exit("etcd_rdzv_bench: missing %s: build it first" % exe)
    reason = etcd_available()
    if reason:
        benchlib.skip("etcd_rdzv_bench: " + reason)
    # The peers: torchrun, and for its etcd backend python3-etcd beside its torch. Each missing one is
    # reported skipped; ddprun's two backends run regardless.
    skipped = []
    torch_python = sys.executable if args.torch != "/usr/bin/torchrun" else "/usr/bin/python3"
    if not os.access(args.torch, os.X_OK):
        skipped += ["%s: skipped (%s not installed)" % (k, args.torch) for k in args.kinds if k.startswith("torchrun")]
        args.kinds = [k for k in args.kinds if not k.startswith("torchrun")]
    # -I: no current folder on sys.path, whose etcd/ (ddprun's C++ sources) would import as a package.
    elif "torchrun etcd (v2)" in args.kinds and subprocess.run([torch_python, "-I", "-c", "import etcd; etcd.Client"],
                                                               capture_output=True).returncode != 0:
        skipped.append("torchrun etcd (v2): skipped (python3-etcd is not installed for %s)" % torch_python)
        args.kinds.remove("torchrun etcd (v2)")
    for line in skipped:
        print(line, flush=True)
    with EtcdCluster(size=3, enable_v2=True) as cluster:
        kinds, rows = rendezvous_table(args, cluster)
        losses = [] if args.no_loss else [node_loss(args, cluster, args.heartbeat) for _ in range(args.reps)]
    torch_version = subprocess.run([torch_python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    lines = ["", "## Rendezvous on etcd side by side (#14)", "",
             "Measured %s on %s (%d cores), `bench/etcd_rdzv_bench.py --sizes %s --reps %d` against one 3-member "
             "etcd 3.4 cluster on loopback (v2 enabled for torch's etcd backend, python3-etcd); torchrun is %s "
             "(torch %s). Time from the first agent's start to all N workers running, median (min-max) of %d fresh "
             "runs; one /bin/sh worker per node." % (time.strftime("%Y-%m-%d"), socket.gethostname(), os.cpu_count(),
                                                    ",".join(map(str, args.sizes)), args.reps, args.torch,
                                                    torch_version or "?", args.reps), ""]
    table = []
    for n in args.sizes:
        cells = []
        for k in kinds:
            med, lo, hi, fails = rows[(k, n)]
            cells.append("%s (%s-%s)%s" % (fmt(med), fmt(lo), fmt(hi), " %d failed" % fails if fails else ""))
        e, g = rows[("ddprun etcd", n)][0], rows[("ddprun daemon", n)][0]
        ratio = "%.2fx" % (e / g) if e and g else "-"
        table.append([n] + cells + [ratio])
    lines += benchlib.md_table(["nodes"] + kinds + ["ddprun etcd / daemon"], table)
    ok = [x for x in losses if x is not None]
    lines += [] if args.no_loss else ["", "Node loss on etcd (3 agents, `--nnodes=2:3`, heartbeat_timeout %g s = the lease TTL): SIGKILL of "
              "one agent to both survivors' next-round workers running: %s s (median of %d: %s). Goal: within the "
              "TTL + 1 s = %g s." % (args.heartbeat, fmt(statistics.median(ok)) if ok else "-", len(losses),
                                     ", ".join(fmt(x) for x in losses), args.heartbeat + 1), ""]
    lines += ["Skipped: " + "; ".join(skipped) + ".", ""] if skipped else []
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        with open(args.output, "a") as f:
            f.write(text)
    # ddprun's side must have run every time (a peer's failure is a finding, not a failure here).
    ours = [rows[(k, n)][3] for k in ("ddprun etcd", "ddprun daemon") for n in args.sizes]
    if any(ours) or (losses and None in losses):
        print("a ddprun case failed (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
