#!/usr/bin/python3
"""Multi-node benchmarks: ddprun (agents + ddprun-rdzv daemon) vs torchrun's c10d rendezvous,
all on loopback, side by side in one run; prints a markdown report (and --report PATH).

Usage: bench/multinode_bench.py [--quick | --smoke] [--build-dir DIR] [--report PATH] [--only rdzv,failure,store]
       [--sizes 2,8,16,64,256,512,1024] [--torch-sizes 2,8,16] [--kinds sh,version,standalone,ddprun]
       [--store-clients 1,8,64] [--store-bootstrap-clients 8,64,256] [--crowd 2000] [--mem-budget-gib 18] [--max-minutes 40]

  rdzv     N agents (separate processes, --nproc_per_node=1, one trivial /bin/sh worker each)
           against one rendezvous: time from the first agent's spawn to all N workers running.
           ddprun against a ddprun-rdzv daemon; torchrun --rdzv_backend=c10d (one agent hosts the
           TCPStore). Workers stamp a file and hold; then every agent gets SIGTERM (teardown).
           Floors, spawned the same way: N bare sh workers, N `ddprun-multinode --version` (loading
           the gRPC binary that ddprun execs for multi-node jobs), N `ddprun --standalone` (agent +
           worker, no network rendezvous). First: memory
           per agent (N=8, workers kept alive), sizes that would not fit are skipped, saying why;
           and one agent's CPU against the number of processes on the host (--crowd).
  failure  3 agents, --nnodes=2:3: kill -9 one node; time from the kill to the 2 survivors'
           workers running in the next round. "agent": only the agent is killed, workers sleep.
           "node": the agent and all its descendants (a host dies), and workers fail when a peer
           worker of their round dies, as a collective would. "host" (torchrun): the agent that
           holds torchrun's store.
  store    set/get/add/compare_set operations per second with 1, 8, 64 client processes (one
           connection each) against ddprun's store (StoreClient -> ddprun-rdzv, in the round of a
           running 1-node job) and against PyTorch's TCPStore (c10d::TCPStore of libtorch 1.13,
           server in its own process); both driven by the same C++ loop (bench/store_bench.cc).
           Then a job's store bootstrap with 8, 64, 256 ranks (connect, publish an address, read
           every peer's, barrier): time to the last rank through, against TCPStore.

Each case is one module of bench/multinode/ (rdzv.py, failure.py, store.py); driver.py holds the
Bench they all run in (processes, folders, command lines, the report).

Needs the helpers built: cmake -S . -B build-mnb -G Ninja &&
cmake --build build-mnb -- ddprun ddprun-multinode ddprun-watchdog ddprun-rdzv ddprun-store-bench \
  tcpstore-bench
(--build-dir, else $DDPRUN_BUILD_DIR, else build-mnb). Full run ~25 min, --quick ~5 min.

Not a test (ctest runs only its --smoke case). Bounded in time (--max-minutes, and a limit per step). Every process
the driver starts carries a unique DDPRUN_MNB_MARK in its environment; at the end of each step and
on exit (also on Ctrl-C / SIGTERM) every such process is SIGKILLed and reaped, and the temporary
directory is removed. Loopback only. Run as root for the SCHED_FIFO spawn loop (else nice -10).
"""
import argparse
import os
import resource
import signal
import sys

from multinode import failure, rdzv, store
from multinode.common import ROOT, Aborted, log
from multinode.driver import Bench

CASES = {"rdzv": rdzv.run, "failure": failure.run, "store": store.run}  # in the order they run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions, shorter windows")
    p.add_argument("--smoke", action="store_true",
                   help="2 agents, one repetition of everything, the smallest store cases: does it still run? (ctest)")
    p.add_argument("--build-dir", default=os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build-mnb")))
    p.add_argument("--report", help="also write the markdown report to this file")
    p.add_argument("--only", default="rdzv,failure,store")
    p.add_argument("--sizes", help="ddprun agent counts (default 2,8,64,256,1024; quick: 2,8,64,256)")
    p.add_argument("--torch-sizes", help="torchrun agent counts (default 2,8,16; quick: 2,8)")
    p.add_argument("--store-clients", default="1,8,64")
    p.add_argument("--store-bootstrap-clients", help="ranks of the store bootstrap (default 8,64,256; quick: 8,64)")
    p.add_argument("--kinds", default="sh,version,standalone,ddprun",
                   help="what runs at each ddprun size: the floors sh, version, standalone, and ddprun")
    p.add_argument("--mem-budget-gib", type=float, default=18.0)
    p.add_argument("--min-free-gib", type=float, default=2.5,
                   help="a step is stopped when MemAvailable falls below this")
    p.add_argument("--steady-seconds", type=float, default=None,
                   help="window for the steady-state CPU once all workers run (default 5, quick 2; 0: skip)")
    p.add_argument("--crowd", type=int, default=2000, help="extra processes for the agent CPU probe")
    p.add_argument("--max-minutes", type=float, default=40.0, help="hard bound on the whole run")
    args = p.parse_args()
    if args.smoke:
        args.quick = True
        args.sizes = args.sizes or "2"
        args.torch_sizes = args.torch_sizes if args.torch_sizes is not None else "2"
        args.store_clients = "1,2"
        args.store_bootstrap_clients = args.store_bootstrap_clients or "2"
        args.crowd = min(args.crowd, 50)
        args.max_minutes = min(args.max_minutes, 4.0)
        if args.steady_seconds is None:
            args.steady_seconds = 0.5
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]
    args.sizes = ints(args.sizes or ("2,8,16,64,256" if args.quick else "2,8,16,64,256,512,1024"))
    args.torch_sizes = ints(args.torch_sizes if args.torch_sizes is not None else ("2,8" if args.quick else "2,8,16"))
    args.store_clients = ints(args.store_clients)
    args.store_bootstrap_clients = ints(args.store_bootstrap_clients or ("8,64" if args.quick else "8,64,256"))
    args.store_bootstrap_reps = 3 if args.quick else 7
    args.step_timeout = 60 if args.quick else 120
    args.fail_reps = 2 if args.quick else 5
    args.torch_fail_reps = 1
    args.ddprun_fail_bound = 30
    args.torch_fail_bound = 60 if args.quick else 90
    args.store_seconds = 0.5 if args.quick else 2.0
    args.store_reps = 1 if args.quick else 3
    if args.steady_seconds is None:
        args.steady_seconds = 2.0 if args.quick else 5.0
    if args.smoke:
        args.store_bootstrap_reps = args.fail_reps = 1
        args.store_seconds = 0.2
        # torchrun takes a minute to notice a lost node (its own timeouts); the smoke test only
        # needs the case to run, so "no new round within 10 s" is an answer.
        args.torch_fail_bound = 10
    args.build_dir = os.path.abspath(args.build_dir)
    only = set(args.only.split(","))

    for b in ("ddprun", "ddprun-multinode", "ddprun-rdzv", "ddprun-watchdog"):
        if not os.access(os.path.join(args.build_dir, "bin", b), os.X_OK):
            sys.exit("missing %s/bin/%s: build first (see --help)" % (args.build_dir, b))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the daemon holds one fd per agent

    def on_signal(sig, frame):
        raise Aborted("signal %d" % sig)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    def on_alarm(sig, frame):
        raise Aborted("--max-minutes reached")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.max_minutes * 60))

    bench = Bench(args)
    rc = 0
    try:
        for name, run in CASES.items():
            if name in only:
                run(bench)
    except (KeyboardInterrupt, Aborted) as e:
        log("aborted: %s" % (e or "Ctrl-C"))
        bench.report.append("\n**Run aborted: %s; results above are partial.**\n" % (e or "Ctrl-C"))
        rc = 130
    finally:
        signal.alarm(0)
        bench.close()
    text = bench.render()
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
