#!/usr/bin/python3
"""Time lost to one rank's failure: ddprun's in-process recovery against restarts (ddprun's and
torchrun's) with checkpoints (issue #36's bench; results in bench/RESULTS_RECOVERY.md).

  python3 bench/recovery_bench.py [--python PY]... [--runs 3] [--steps 120] [--kill 1:40]
                                  [--step_ms 50] [--nproc 4] [--checkpoint_every 10] [--smoke]

A DDP job, gloo on CPU, --nproc ranks on this node, a step of about --step_ms; rank R kills itself
(SIGKILL) right after step S (--kill R:S, the scripts' RECOVERABLE_DIE_AT hook, first attempt
only). The contenders, interleaved (the order rotates from run to run), each --runs times:
  - ddprun in_process: ddprun --recovery=in_process --max_restarts=1 examples/torch/recoverable_ddp.py
    (ddprun.recovery: the survivors keep their processes; the replacement is a cold process that
    imports torch; every rank resumes at the step the furthest rank committed);
  - ddprun restart:    ddprun --max_restarts=1 examples/torch/checkpoint_ddp.py (every rank restarts and
    loads rank 0's last checkpoint, saved every --checkpoint_every steps);
  - torchrun restart:  PY -m torch.distributed.run --standalone --max_restarts=1 checkpoint_ddp.py.
Each launcher at its defaults otherwise (torchrun 1.13 polls its workers every 5 s, 2.x every 0.1 s).

Each rank appends "rank step time" per step done (RECOVERABLE_TIMES) and the dying rank "kill rank
step time" before its SIGKILL. Lost time: for each rank the first step done after the kill by the
work that goes on (the same process's next step, or the first step of its new process), the latest
of those over the ranks, minus the kill's time: from the failure until the job as a whole does
useful work again. Steps lost: the kill's step minus the step the job resumed from (a restart goes
back to the last checkpoint). Whole run: the launcher's wall time, start to exit.

Then the API's cost without a failure: the same job with no kill, ddprun in_process
(recoverable_ddp.py) against ddprun restart (checkpoint_ddp.py, --checkpoint_every 0: never), the
median step time (the time between a rank's consecutive steps, every rank, the first step left out).

--python (repeatable) is the interpreter of the workers and of torchrun (PYTHON_EXEC for ddprun);
by default Debian's torch 1.13 (/usr/bin/python3) and the torch 2.x tier's venv, where they exist.
Output: one JSON line per job, then markdown tables per torch version. --smoke: 1 run, 30 steps,
kill at 10, torch 1.13 only; exit 1 unless every job exited 0 and every number is finite and
positive (steps lost: not negative).
"""
import argparse
import glob
import json
import math
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

EXAMPLES = os.path.join(benchlib.ROOT, "examples", "torch")
RECOVERABLE = os.path.join(EXAMPLES, "recoverable_ddp.py")
CHECKPOINT = os.path.join(EXAMPLES, "checkpoint_ddp.py")
CONTENDERS = ("ddprun in_process + spare", "ddprun in_process", "ddprun restart", "torchrun restart")


def default_pythons():
    out = ["/usr/bin/python3"]
    out += sorted(glob.glob(os.path.expanduser("~/.cache/ddprun/torch2-*/bin/python")))[:1]
    return out


def torch_version(python):
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True).stdout.strip()


def job_argv(args, python, version, contender, ckpt, kill):
    """The launcher's command line for one contender."""
    script_args = ["--steps", str(args.steps), "--step_ms", str(args.step_ms)]
    nproc = "--nproc_per_node=%d" % args.nproc
    if contender == "ddprun in_process":
        return [args.ddprun, nproc, "--recovery=in_process", "--max_restarts=1", RECOVERABLE] + script_args
    if contender == "ddprun in_process + spare":
        return [args.ddprun, nproc, "--recovery=in_process", "--spares_per_node=1", "--max_restarts=1",
                RECOVERABLE] + script_args
    script_args += ["--checkpoint", ckpt, "--checkpoint_every", str(args.checkpoint_every if kill else 0)]
    if contender == "ddprun restart":
        return [args.ddprun, nproc, "--max_restarts=1", CHECKPOINT] + script_args
    # torch 1.13's torchrun fails under Python 3.11 unless --redirects/--tee are maps (its Std.from_str
    # returns None for "0"); rank 9's, a rank this job does not have, changes nothing (as run_bench.py).
    fix = ["--redirects", "9:1", "--tee", "9:1"] if version.startswith("1.") else []
    return [python, "-m", "torch.distributed.run", "--standalone", nproc, "--max_restarts=1"] + fix + \
        [CHECKPOINT] + script_args


def read_times(path):
    """([(rank, step, t)] in the file's order, (rank, step, t) of the kill or None)."""
    steps, kill = [], None
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                try:
                    if parts and parts[0] == "kill" and len(parts) == 4:
                        kill = (int(parts[1]), int(parts[2]), float(parts[3]))
                    elif len(parts) == 3:
                        steps.append((int(parts[0]), int(parts[1]), float(parts[2])))
                except ValueError:
                    pass  # a line cut by a SIGKILL
    except OSError:
        pass
    return steps, kill


def lost(steps, kill, nproc):
    """(seconds lost, steps lost, step the job resumed from) or (None, None, None).

    A rank's lines are in its time order (one process appends at a time, its replacement after it).
    A rank's first line after the kill that is work going on: a step past the kill's step (the same
    process going on, or a new one resumed at the kill's step), or a step that does not follow the
    rank's previous line (a new process resumed from an earlier checkpoint). The line of the kill's
    own step that a survivor logs just after the kill is the old work's end, not the new work."""
    if kill is None:
        return None, None, None
    _, kill_step, kill_t = kill
    prev, first = {}, {}
    for rank, step, t in steps:
        if rank not in first and t > kill_t and (step > kill_step or step != prev.get(rank, 0) + 1):
            first[rank] = (step, t)
        prev[rank] = step
    if len(first) < nproc:
        return None, None, None
    resumed_from = min(s for s, _ in first.values()) - 1
    return max(t for _, t in first.values()) - kill_t, kill_step - resumed_from, resumed_from


def step_time(steps):
    """Median time between a rank's consecutive steps (the first step of a process left out)."""
    last, gaps = {}, []
    for rank, step, t in steps:
        if rank in last and last[rank][0] + 1 == step:
            gaps.append(t - last[rank][1])
        last[rank] = (step, t)
    return statistics.median(gaps) if gaps else None


def run_job(args, python, version, contender, kill, tmp):
    """One job; a dict of what it measured."""
    d = tempfile.mkdtemp(prefix="job-", dir=tmp)
    times = os.path.join(d, "times.txt")
    env = dict(os.environ)
    env["PYTHON_EXEC"] = python
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(benchlib.ROOT, "python"),
                                                      env.get("PYTHONPATH")]))
    env["RECOVERABLE_TIMES"] = times
    env["RECOVERABLE_PIDS"] = pids = os.path.join(d, "pids.txt")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("RECOVERABLE_DIE_AT", None)
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    if kill:
        env["RECOVERABLE_DIE_AT"] = "%d:%d" % kill
    argv = job_argv(args, python, version, contender, os.path.join(d, "checkpoint.pt"), kill)
    out_path, err_path = os.path.join(d, "stdout"), os.path.join(d, "stderr")
    started = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=d, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.job_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher's group: whatever it left behind
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    wall = time.monotonic() - started
    with open(out_path, errors="replace") as f:
        stdout = f.read()
    with open(err_path, errors="replace") as f:
        stderr = f.read()
    steps, kill_line = read_times(times)
    lost_s, lost_steps, resumed = lost(steps, kill_line, args.nproc)
    digests = re.findall(r"digest ([0-9a-f]{16})", stdout)  # ddprun prefixes "[default0]:", torchrun nothing
    res = {"contender": contender, "kill": "%d:%d" % kill if kill else None, "rc": rc, "wall_s": round(wall, 3),
           "lost_s": None if lost_s is None else round(lost_s, 4), "steps_lost": lost_steps,
           "resumed_from": resumed, "step_ms": None, "digest": digests[-1] if digests else None,
           "in_process": "recovered in process" in stderr, "processes": count_processes(pids)}
    if not kill:
        st = step_time(steps)
        res["step_ms"] = None if st is None else round(st * 1e3, 3)
    if rc != 0:
        res["stderr_tail"] = stderr[-1500:]
    return res


def count_processes(path):
    """Distinct worker processes in RECOVERABLE_PIDS (a spare logs a line when it starts and another
    when it becomes a rank)."""
    try:
        with open(path) as f:
            return len({line.split()[1] for line in f if len(line.split()) == 3})
    except OSError:
        return 0


def fmt_spread(values, scale=1.0, unit="s", digits=2):
    med = statistics.median(values) * scale
    if len(values) == 1:
        return "%.*f %s" % (digits, med, unit)
    return "%.*f %s (%.*f–%.*f)" % (digits, med, unit, digits, min(values) * scale, digits, max(values) * scale)


def finite_positive(x, allow_zero=False):
    return isinstance(x, (int, float)) and math.isfinite(x) and (x >= 0 if allow_zero else x > 0)


def report(version, args, results):
    """Markdown tables for one torch version; returns (lines, problems)."""
    problems = []
    for r in results:
        if r["rc"] != 0:
            problems.append("%s (kill %s) exited %s" % (r["contender"], r["kill"], r["rc"]))
        if r["kill"]:
            if not finite_positive(r["lost_s"]) or not finite_positive(r["steps_lost"], allow_zero=True):
                problems.append("%s: no lost time measured (%s)" % (r["contender"], r["lost_s"]))
            # Worker processes started: the replacement only in process, every rank again on a restart.
            # With a spare: the ranks and the spare, and maybe the new spare behind it (if it got as far
            # as its first line before the job ended).
            spare = r["contender"] == "ddprun in_process + spare"
            inproc = r["contender"].startswith("ddprun in_process")
            want = args.nproc + (1 if inproc else args.nproc)
            counted = r["processes"] in (want, want + 1) if spare else r["processes"] == want
            if not counted or inproc != r["in_process"]:
                problems.append("%s: %d worker processes started (expected %d), recovered in process: %s" %
                                (r["contender"], r["processes"], want, r["in_process"]))
        elif not finite_positive(r["step_ms"]):
            problems.append("%s: no step time measured without a kill" % r["contender"])
        if not finite_positive(r["wall_s"]):
            problems.append("%s: no wall time" % r["contender"])
    digests = {r["digest"] for r in results if r["rc"] == 0}
    if len(digests) != 1 or None in digests:
        problems.append("final parameters differ between jobs: %s" % sorted(map(str, digests)))

    kill_rank, kill_step = args.kill
    lines = ["", "### torch %s: one rank of %d SIGKILLed after step %d of %d (rank %d), step about %g ms, "
             "checkpoint every %d steps; %d run%s, median (min–max)" %
             (version, args.nproc, kill_step, args.steps, kill_rank, args.step_ms, args.checkpoint_every,
              args.runs, "" if args.runs == 1 else "s"), ""]
    # A job that failed counts in no median; a contender with none that worked says so in its row.
    by = {c: [r for r in results if r["contender"] == c and r["kill"] and r["rc"] == 0 and r["lost_s"]]
          for c in CONTENDERS}
    failed = {c: [r["rc"] for r in results if r["contender"] == c and r["kill"] and r not in by[c]]
              for c in CONTENDERS}
    med_lost = {c: statistics.median(r["lost_s"] for r in by[c]) if by[c] else None for c in CONTENDERS}
    base = med_lost["ddprun in_process"]
    rows = []
    for c in CONTENDERS:
        rs = by[c]
        note = " (%d failed: exit %s)" % (len(failed[c]), ",".join(map(str, failed[c]))) if failed[c] else ""
        if not rs or not base:
            rows.append([c, "failed" + note, "-", "-", "-"])
            continue
        steps_lost = sorted({r["steps_lost"] for r in rs})
        rows.append([c, fmt_spread([r["lost_s"] for r in rs]) + note, "/".join(map(str, steps_lost)),
                     fmt_spread([r["wall_s"] for r in rs], digits=1), "%.1fx" % (med_lost[c] / base)])
    lines += benchlib.md_table(["contender", "time lost", "steps lost", "whole run", "time lost / in_process's"],
                               rows)
    warm = med_lost["ddprun in_process + spare"]
    if warm:
        tr = med_lost["torchrun restart"]
        lines += ["", "With a warm spare: %.2f s lost (the issue's bound: at most 0.5 s, %s); torchrun / warm spare: %s "
                  "(bound: at least 10x)." % (warm, "within" if warm <= 0.5 else "beyond",
                                              "%.1fx" % (tr / warm) if tr else "- (torchrun failed)")]
    if base:
        tr, dr = med_lost["torchrun restart"], med_lost["ddprun restart"]
        torchrun_x = tr / base if tr else None
        lines += ["", "torchrun / ddprun in_process: %s; ddprun restart / in_process: %s. Issue's bound for a warm "
                  "spare: at most 0.5 s lost (cold replacement here: %.2f s, %s) and at least 10x less than "
                  "torchrun (here %s)." % ("%.1fx" % torchrun_x if tr else "- (torchrun failed)",
                                          "%.1fx" % (dr / base) if dr else "-", base,
                                          "within" if base <= 0.5 else "beyond",
                                          "%.1fx, %s" % (torchrun_x, "within" if torchrun_x >= 10 else "short of it")
                                          if tr else "not measured")]

    over = {c: [r["step_ms"] for r in results if r["contender"] == c and not r["kill"]]
            for c in ("ddprun in_process", "ddprun restart")}
    if not all(over.values()):  # --no_overhead
        return lines, problems
    lines += ["", "### torch %s: no failure, the API's cost per step (%d steps; restart: no checkpoint)" %
              (version, args.steps), ""]
    over = {c: [x for x in v if finite_positive(x)] for c, v in over.items()}
    if not all(over.values()):
        return lines, problems
    ip, rs = statistics.median(over["ddprun in_process"]), statistics.median(over["ddprun restart"])
    lines += benchlib.md_table(["contender", "median step time", "/ restart's"], [
        ["ddprun in_process (recoverable_ddp.py, ddprun.recovery)", fmt_spread(over["ddprun in_process"], 1, "ms"),
         "%.3fx" % (ip / rs)],
        ["ddprun restart (checkpoint_ddp.py, plain DDP)", fmt_spread(over["ddprun restart"], 1, "ms"), "1.000x"]])
    return lines, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", help="the workers' interpreter (repeatable)")
    ap.add_argument("--ddprun", default=os.path.join(os.environ.get("DDPRUN_BIN") or
                                                     os.path.join(benchlib.ROOT, "build", "bin"), "ddprun"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--kill", default="1:40", help="RANK:STEP: that rank dies after that step")
    ap.add_argument("--step_ms", type=float, default=50.0)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--checkpoint_every", type=int, default=10)
    ap.add_argument("--no_overhead", action="store_true", help="skip the runs without a failure")
    ap.add_argument("--job_timeout", type=float, default=300.0)
    ap.add_argument("--smoke", action="store_true", help="1 run, 30 steps, kill at 10, torch 1.13 (ctest -L bench)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.steps, args.kill, args.python = 1, 30, "1:10", ["/usr/bin/python3"]
        args.no_overhead = False
    rank, _, step = args.kill.partition(":")
    args.kill = (int(rank), int(step))
    if not os.access(args.ddprun, os.X_OK):
        benchlib.skip("%s is not built" % args.ddprun)
    versions = []
    for py in args.python or default_pythons():
        v = torch_version(py)
        if v:
            versions.append((py, v))
        else:
            print("recovery_bench: no torch for %s; skipped" % py, flush=True)
    if not versions:
        benchlib.skip("no interpreter with torch")

    tmp = tempfile.mkdtemp(prefix="recovery_bench-")
    out, failed = [], False
    try:
        for py, version in versions:
            results = []
            for run in range(args.runs):
                n = len(CONTENDERS)
                jobs = [(c, args.kill) for c in CONTENDERS[run % n:] + CONTENDERS[:run % n]]
                if not args.no_overhead:
                    pair = [("ddprun in_process", None), ("ddprun restart", None)]
                    jobs += pair if run % 2 == 0 else pair[::-1]
                for contender, kill in jobs:
                    r = run_job(args, py, version, contender, kill, tmp)
                    r.update({"torch": version, "run": run})
                    results.append(r)
                    print(json.dumps(r), flush=True)
            lines, problems = report(version, args, results)
            for p in problems:
                print("recovery_bench: torch %s: %s" % (version, p), flush=True)
            failed = failed or bool(problems)
            out += lines
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n%s; commit %s; %s; ddprun %s" % (time.strftime("%Y-%m-%d %H:%M"), benchlib.git_rev(),
                                             benchlib.machine_text(), args.ddprun))
    print("\n".join(out))
    if failed:
        print("recovery_bench: FAILED", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
