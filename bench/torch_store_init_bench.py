#!/usr/bin/python3
"""A real torch job's init_process_group, through ddprun's store against torch's own (issue #35).

Every rank of one node runs `init_process_group("gloo")` through env:// and a barrier, and records
when it entered init and when the barrier returned (time.time()); the bootstrap is the last return
minus the last entry: the store's part of the start, not the imports before it. Contenders, on the
same script, interleaved, median of `--runs`:
  ddprun agent   ddprun's default: the agent serves torch's store (TORCHELASTIC_USE_AGENT_STORE=True)
  ddprun rank0   ddprun --torch_store=rank0: rank 0 hosts torch's TCPStore (1.13: the legacy server;
                 2.x: libuv)
  torchrun       torchrun --standalone of the same interpreter (2.x: its agent's TCPStore, libuv)

  python3 bench/torch_store_init_bench.py --python PY --worlds 8,32 [--runs 3]
  python3 bench/torch_store_init_bench.py --smoke          # ctest: world 2, one run

Ratios above 1 mean ddprun's store (agent) is faster. Stdlib only; torch runs in the workers.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

WORKER = r'''
import json, os, sys, time
import torch.distributed as dist
t0 = time.time()
dist.init_process_group("gloo")
dist.barrier()
t1 = time.time()
with open(os.path.join(sys.argv[1], "r%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"t0": t0, "t1": t1, "agent": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}, f)
dist.destroy_process_group()
'''


def run_one(kind, python, world, work, timeout_s, version, ddprun):
    out = tempfile.mkdtemp(dir=work)
    script = os.path.join(work, "init_worker.py")
    env = dict(os.environ, PYTHON_EXEC=python, OMP_NUM_THREADS="1")
    if kind == "torchrun":
        # torch 1.13's torchrun fails without a redirects map (tests/support/e2e_lib.py, the same quirk).
        quirk = ["--redirects", "9:1", "--tee", "9:1"] if version.startswith("1.") else []
        argv = [python, "-m", "torch.distributed.run"] + quirk + ["--standalone", "--nproc_per_node=%d" % world,
                                                                   script, out]
    else:
        flags = ["--torch_store=rank0"] if kind == "ddprun rank0" else []
        argv = [ddprun, "--nproc_per_node=%d" % world] + flags + [script, out]
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s at world %d exited %d: %s" % (kind, world, p.returncode, p.stderr[-2000:]))
    recs = []
    for r in range(world):
        with open(os.path.join(out, "r%d.json" % r)) as f:
            recs.append(json.load(f))
    shutil.rmtree(out, True)
    want = "False" if kind == "ddprun rank0" else "True"
    if kind != "torchrun" and any(r["agent"] != want for r in recs):
        raise RuntimeError("%s: TORCHELASTIC_USE_AGENT_STORE is not %s" % (kind, want))
    return max(r["t1"] for r in recs) - max(r["t0"] for r in recs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--worlds", default="8,32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--ddprun", default=os.path.join(benchlib.ROOT, "build", "bin", "ddprun"))
    a = ap.parse_args(argv)
    if a.smoke:
        a.worlds, a.runs = "2", 1
    if subprocess.run([a.python, "-c", "import torch.distributed"], capture_output=True).returncode != 0:
        benchlib.skip("%s has no torch.distributed" % a.python)
    version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    kinds = ["ddprun agent", "ddprun rank0", "torchrun"]
    work = tempfile.mkdtemp(prefix="ddprun_init_bench_")
    try:
        with open(os.path.join(work, "init_worker.py"), "w") as f:
            f.write(WORKER)
        rows = []
        for world in [int(w) for w in a.worlds.split(",")]:
            times = {k: [] for k in kinds}
            for rep in range(a.runs):
                order = kinds if rep % 2 == 0 else list(reversed(kinds))  # interleaved
                for kind in order:
                    times[kind].append(run_one(kind, a.python, world, work, 120 + 10 * world, version, a.ddprun))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append([str(world)] + ["%.1f ms" % (1000 * med[k]) for k in kinds] +
                        ["%.2fx" % (med["ddprun rank0"] / med["ddprun agent"]),
                         "%.2fx" % (med["torchrun"] / med["ddprun agent"])])
            print(json.dumps({"world": world, "torch": version,
                              "median_s": {k: round(v, 5) for k, v in med.items()}}), flush=True)
        print()
        print("torch %s; %d runs, median; %s" % (version, a.runs, benchlib.machine_text()))
        print()
        print("\n".join(benchlib.md_table(["ranks", "ddprun (agent's store)", "ddprun --torch_store=rank0", "torchrun",
                                 "rank0 / agent", "torchrun / agent"], rows)))
    finally:
        shutil.rmtree(work, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
