#!/usr/bin/python3
"""Time lost to one rank's failure for a C++ trainer on libddp (ddp::runRecoverable,
worker_sdk/recovery.h): ddprun's in-process recovery, cold and with a warm spare, against ddprun's
restart (issue #36 item 5; results in bench/RESULTS_RECOVERY.md).

  python3 bench/recovery_cpp_bench.py [--runs 5] [--steps 200] [--kill 1:60] [--step_ms 20]
                                      [--nproc 4] [--smoke]

The trainer is tests/integration/workers/recoverable_trainer (gloo, one all-reduce per step, a
step of about --step_ms): rank R SIGKILLs itself right after step S (--kill R:S, first attempt
only). Contenders, interleaved (the order rotates per run):
  - ddprun in_process:         --recovery=in_process --max_restarts=1 (the replacement is a new process);
  - ddprun in_process + spare: the same with --spares_per_node=1;
  - ddprun restart:            --max_restarts=1 (every rank restarts; the trainer keeps no checkpoint,
                               so the job starts over: its steps lost are all of them, its time lost
                               is what counts here).
Time lost and steps lost as recovery_bench.py measures them (the same functions). torchrun is not
a contender: it has no store a libddp program can use without ddprun.

--smoke: 1 run, 60 steps, kill at 20; exit 1 unless every job exited 0 with finite numbers and one
digest.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib
import recovery_bench as rb

CONTENDERS = ("ddprun in_process + spare", "ddprun in_process", "ddprun restart")


def run_job(args, contender, tmp):
    d = tempfile.mkdtemp(prefix="job-", dir=tmp)
    times = os.path.join(d, "times.txt")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERABLE_", "TORCHELASTIC_"))}
    env.update(RECOVERABLE_TIMES=times, RECOVERABLE_DIE_AT="%d:%d" % args.kill)
    flags = {"ddprun in_process": ["--recovery=in_process"],
             "ddprun in_process + spare": ["--recovery=in_process", "--spares_per_node=1"],
             "ddprun restart": []}[contender]
    argv = [args.ddprun, "--nproc_per_node=%d" % args.nproc, "--max_restarts=1"] + flags + \
        [args.trainer, str(args.steps), str(args.step_ms)]
    started = time.monotonic()
    with open(os.path.join(d, "out"), "w") as out, open(os.path.join(d, "err"), "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=d, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.job_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    wall = time.monotonic() - started
    with open(os.path.join(d, "out"), errors="replace") as f:
        stdout = f.read()
    with open(os.path.join(d, "err"), errors="replace") as f:
        stderr = f.read()
    steps, kill = rb.read_times(times)
    lost_s, lost_steps, resumed = rb.lost(steps, kill, args.nproc)
    digests = re.findall(r"digest ([0-9a-f]{16})", stdout)
    res = {"contender": contender, "rc": rc, "wall_s": round(wall, 3),
           "lost_s": None if lost_s is None else round(lost_s, 5), "steps_lost": lost_steps,
           "resumed_from": resumed, "digest": digests[-1] if digests else None,
           "in_process": "recovered in process" in stderr}
    if rc != 0:
        res["stderr_tail"] = stderr[-1500:]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    build = os.environ.get("DDPRUN_BUILD_DIR") or os.path.join(benchlib.ROOT, "build")
    ap.add_argument("--ddprun", default=os.path.join(build, "bin", "ddprun"))
    ap.add_argument("--trainer", default=os.path.join(build, "test-bin", "recoverable_trainer"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kill", default="1:60", help="RANK:STEP: that rank dies after that step")
    ap.add_argument("--step_ms", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--job_timeout", type=float, default=120.0)
    ap.add_argument("--smoke", action="store_true", help="1 run, 60 steps, kill at 20 (ctest -L bench)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.steps, args.kill = 1, 60, "1:20"
    rank, _, step = args.kill.partition(":")
    args.kill = (int(rank), int(step))
    for path in (args.ddprun, args.trainer):
        if not os.access(path, os.X_OK):
            benchlib.skip("%s is not built" % path)
    tmp = tempfile.mkdtemp(prefix="recovery_cpp_bench-")
    results = []
    try:
        for run in range(args.runs):
            n = len(CONTENDERS)
            for c in CONTENDERS[run % n:] + CONTENDERS[:run % n]:
                r = run_job(args, c, tmp)
                r["run"] = run
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    problems = []
    for r in results:
        if r["rc"] != 0:
            problems.append("%s exited %s" % (r["contender"], r["rc"]))
        elif not rb.finite_positive(r["lost_s"]) or not rb.finite_positive(r["steps_lost"], allow_zero=True):
            problems.append("%s: no lost time measured" % r["contender"])
        elif r["in_process"] != r["contender"].startswith("ddprun in_process"):
            problems.append("%s: recovered in process: %s" % (r["contender"], r["in_process"]))
    digests = {r["digest"] for r in results if r["rc"] == 0}
    if len(digests) != 1 or None in digests:
        problems.append("final parameters differ between jobs: %s" % sorted(map(str, digests)))
    by = {c: [r for r in results if r["contender"] == c and r["rc"] == 0 and r["lost_s"]] for c in CONTENDERS}
    base = statistics.median(r["lost_s"] for r in by["ddprun in_process"]) if by["ddprun in_process"] else None
    rows = []
    for c in CONTENDERS:
        if not by[c] or not base:
            rows.append([c, "failed", "-", "-", "-"])
            continue
        med = statistics.median(r["lost_s"] for r in by[c])
        rows.append([c, rb.fmt_spread([r["lost_s"] for r in by[c]], 1e3, "ms", 1),
                     "/".join(map(str, sorted({r["steps_lost"] for r in by[c]}))),
                     rb.fmt_spread([r["wall_s"] for r in by[c]], digits=2), "%.2fx" % (med / base)])
    print("\n%s; commit %s; %s; ddprun %s" % (time.strftime("%Y-%m-%d %H:%M"), benchlib.git_rev(),
                                             benchlib.machine_text(), args.ddprun))
    print("\n### libddp (C++), gloo: one rank of %d SIGKILLed after step %d of %d (rank %d), step about %d ms; "
          "%d run%s, median (min–max)\n" % (args.nproc, args.kill[1], args.steps, args.kill[0], args.step_ms,
                                           args.runs, "" if args.runs == 1 else "s"))
    print("\n".join(benchlib.md_table(["contender", "time lost", "steps lost", "whole run",
                                       "time lost / in_process's"], rows)))
    for p in problems:
        print("recovery_cpp_bench: %s" % p, flush=True)
    if problems:
        print("recovery_cpp_bench: FAILED", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
