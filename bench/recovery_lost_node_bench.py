#!/usr/bin/python3
"""Time lost to a lost node: ddprun's in-process recovery against restarts (ddprun's and
torchrun's) across 2 nodes with a standby (issue #36's lost-node bench; bench/RESULTS_RECOVERY.md).

  python3 bench/recovery_lost_node_bench.py [--python PY]... [--runs 3] [--steps 300] [--kill_at 105]
                                            [--step_ms 50] [--nproc_per_node 2] [--smoke]

Three agents on loopback, one process group each ("nodes"): a and b form the job's 2-node round
(--nnodes=2:2, elastic, the rendezvous on a), c joins once the job logged its first step and stands
by (--standby_s to join: torchrun's agent imports torch first). Once the job logs step --kill_at
(well before the last: a node lost as the ranks finish is another case), node b is lost: its agent
and every process below it stopped and SIGKILLed at once, as a machine that dies. The contenders,
interleaved (the order rotates from run to run):
  - ddprun in_process + spare: the same with --spares_per_node=1: c, waiting, starts its ranks'
    processes ahead (torch imported); they take b's place. The node is lost only once they are
    ready (each logged rank -1 just before ddprun.recovery.run), after --kill_at, as a standby
    that waited long;
  - ddprun in_process: --recovery=in_process, examples/torch/recoverable_ddp.py: a's workers keep
    their processes, c's start cold in b's place and take their state from a's;
  - ddprun restart:    --max_restarts=1, examples/torch/checkpoint_ddp.py (every rank restarts and
    loads the last checkpoint, saved every --checkpoint_every steps);
  - torchrun restart:  PY -m torch.distributed.run --rdzv_backend=c10d, the same checkpointing script.

Lost time and steps lost as in recovery_bench.py (the same functions): from the node's SIGKILL to
the first step done after it by every rank. The world keeps its size (c takes b's place), so the
final parameters of every job that ended must be the same (the digest).

--smoke: 1 run, 250 steps, node lost at step 80 (later with the spare: once c's processes are
warm), torch 1.13 only, torchrun left out; exit 1 unless the ddprun jobs exited 0 with finite
numbers and the same digest, and the spare's job started c's ranks warm.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib
import recovery_bench as rb

CONTENDERS = ("ddprun in_process + spare", "ddprun in_process", "ddprun restart", "torchrun restart")


def agent_argv(args, python, version, contender, port, run_id, ckpt):
    script = ["--steps", str(args.steps), "--step_ms", str(args.step_ms)]
    nproc = "--nproc_per_node=%d" % args.nproc_per_node
    if contender.startswith("ddprun in_process"):
        spares = ["--spares_per_node=1"] if contender.endswith("spare") else []
        return [args.ddprun, "--nnodes=2:2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port,
                "--rdzv_id=" + run_id, "--rdzv_conf=last_call_timeout=1", nproc, "--recovery=in_process",
                "--max_restarts=1"] + spares + [rb.RECOVERABLE] + script + ["--notice_timeout_s", "120"]
    script += ["--checkpoint", ckpt, "--checkpoint_every", str(args.checkpoint_every)]
    if contender == "ddprun restart":
        return [args.ddprun, "--nnodes=2:2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port,
                "--rdzv_id=" + run_id, "--rdzv_conf=last_call_timeout=1", nproc, "--max_restarts=1",
                rb.CHECKPOINT] + script
    fix = ["--redirects", "9:1", "--tee", "9:1"] if version.startswith("1.") else []  # as recovery_bench.py
    return [python, "-m", "torch.distributed.run", "--nnodes=2:2", "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=" + run_id, nproc, "--max_restarts=1"] + fix + \
        [rb.CHECKPOINT] + script


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def lose_node(pid):
    """SIGKILLs a node's every process at once, as a machine that dies, whatever sessions or process
    groups its launcher put them in (torchrun 2.x starts its workers in new sessions): stopped first,
    so that none reacts to the others' deaths, then killed."""
    procs = benchlib.descendants(pid)
    for p in procs:
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    procs = benchlib.descendants(pid)  # anything forked meanwhile
    for p in procs:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def waiting_processes(path):
    """How many processes logged rank -1 (a warm process, no rank yet) in RECOVERABLE_PIDS."""
    try:
        with open(path) as f:
            return sum(1 for line in f if line.split()[:1] == ["-1"])
    except OSError:
        return 0


def steps_so_far(path):
    steps, _ = rb.read_times(path)
    return max((s for _, s, _ in steps), default=0)


def run_job(args, python, version, contender, tmp):
    d = tempfile.mkdtemp(prefix="job-", dir=tmp)
    times = os.path.join(d, "times.txt")
    env = dict(os.environ)
    for name in ("RECOVERABLE_DIE_AT", "TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        env.pop(name, None)
    pids = os.path.join(d, "pids.txt")
    env.update(PYTHON_EXEC=python, RECOVERABLE_TIMES=times, RECOVERABLE_PIDS=pids,
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(benchlib.ROOT, "python"),
                                                        env.get("PYTHONPATH")])))
    port = benchlib.free_port()
    run_id = "lost-node-%d" % port
    argv = agent_argv(args, python, version, contender, port, run_id, os.path.join(d, "checkpoint.pt"))
    if args.keep:  # what ran, for whoever reads the kept logs (the port finds the agents of a stuck job)
        with open(os.path.join(d, "argv.json"), "w") as f:
            json.dump({"contender": contender, "argv": argv, "port": port}, f)
    nodes, files = {}, []

    def start(tag):
        out = open(os.path.join(d, tag + ".out"), "w")
        err = open(os.path.join(d, tag + ".err"), "w")
        files.extend([out, err])
        nodes[tag] = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=d, start_new_session=True)

    started = time.monotonic()
    deadline = started + args.job_timeout
    kill = None
    rcs = {}
    stage = "a hosts the rendezvous"  # where the job was when it ended: a hang says where it waited
    try:
        start("a")
        # a must host the rendezvous (ddprun) or torchrun's c10d store (the first agent to bind the
        # endpoint does): the node lost is never the one that hosts it, for either launcher.
        while not listening(port) and time.monotonic() < deadline and nodes["a"].poll() is None:
            time.sleep(0.05)
        stage = "the first step"
        start("b")
        while steps_so_far(times) < 1 and time.monotonic() < deadline and nodes["a"].poll() is None:
            time.sleep(0.05)
        waiting = waiting_processes(pids)  # a's and b's spares, if any
        stage = "c stands by"
        start("c")  # the round is full: c stands by
        time.sleep(args.standby_s)
        if contender.endswith("spare"):  # c's ranks' processes and its spare, warm
            while waiting_processes(pids) < waiting + args.nproc_per_node + 1 and time.monotonic() < deadline \
                    and nodes["a"].poll() is None:
                time.sleep(0.05)
        stage = "step %d" % args.kill_at
        while steps_so_far(times) < args.kill_at and time.monotonic() < deadline and nodes["a"].poll() is None:
            time.sleep(0.01)
        if steps_so_far(times) >= args.steps:
            raise RuntimeError("the job ended before the node could be lost: raise --steps or lower --kill_at")
        kill_t = time.time()
        lose_node(nodes["b"].pid)
        # The last step done with b: the ranks may log one more while b is being stopped (its part of
        # that step was in), and nothing after it can be new work yet (a recovery takes far longer).
        lost_t = time.time()
        steps_now, _ = rb.read_times(times)
        kill_step = max((s for _, s, t in steps_now if t <= lost_t), default=0)
        kill = (-1, kill_step, kill_t)
        stage = "a and c end after the loss"
        for tag in ("a", "c"):
            try:
                rcs[tag] = nodes[tag].wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rcs[tag] = None
    finally:
        for p in nodes.values():
            if p.poll() is None:
                lose_node(p.pid)
            p.wait()
        for f in files:
            f.close()
    wall = time.monotonic() - started
    text = {}
    for tag in nodes:
        with open(os.path.join(d, tag + ".out"), errors="replace") as f:
            text[tag + ".out"] = f.read()
        with open(os.path.join(d, tag + ".err"), errors="replace") as f:
            text[tag + ".err"] = f.read()
    steps, _ = rb.read_times(times)
    world = 2 * args.nproc_per_node
    lost_s, lost_steps, resumed = rb.lost(steps, kill, world) if kill else (None, None, None)
    if lost_steps is not None and lost_steps < 0:
        # A step whose all-reduce had b's part can be logged after the loss (the step's sleep pads it
        # to --step_ms after its all-reduce), so the loss's step may be known one late: none was lost.
        lost_steps = 0
    digests = re.findall(r"digest ([0-9a-f]{16})", text.get("a.out", "") + text.get("c.out", ""))
    rc = 0 if rcs.get("a") == 0 and rcs.get("c") == 0 else (rcs.get("a") or rcs.get("c"))
    res = {"contender": contender, "rc": rc, "rcs": rcs, "wall_s": round(wall, 3),
           "lost_s": None if lost_s is None else round(lost_s, 4), "steps_lost": lost_steps, "resumed_from": resumed,
           "kill_step": kill[1] if kill else None, "digest": digests[-1] if digests else None,
           "in_process": "live rank(s) here told round" in text.get("a.err", ""),
           "warm": "a warm spare starts as rank" in text.get("c.err", "")}
    if rc != 0:
        res["stage"] = stage
        # Whether the ranks were done (a job whose ranks all logged the last step and whose
        # processes did not exit hung in its teardown, not in its recovery).
        res["last_step_by_rank"] = {str(r): max((st for rr, st, _ in steps if rr == r), default=0)
                                    for r in range(world)}
        res["stderr_tail"] = (text.get("a.err", "")[-1200:], text.get("c.err", "")[-1200:])
    return res


def report(version, args, results, contenders):
    problems = []
    for r in results:
        if r["rc"] != 0:
            problems.append("%s exited %s" % (r["contender"], r["rcs"]))
        elif not rb.finite_positive(r["lost_s"]) or not rb.finite_positive(r["steps_lost"], allow_zero=True):
            problems.append("%s: no lost time measured" % r["contender"])
        if r["contender"].startswith("ddprun in_process") and r["rc"] == 0 and not r["in_process"]:
            problems.append("%s: the survivor's agent did not carry its workers" % r["contender"])
        if r["contender"].endswith("spare") and r["rc"] == 0 and not r["warm"]:
            problems.append("%s: the standby's ranks did not start warm" % r["contender"])
    digests = {r["digest"] for r in results if r["rc"] == 0}
    if len(digests) > 1 or None in digests:
        problems.append("final parameters differ between jobs: %s" % sorted(map(str, digests)))
    lines = ["", "### torch %s: node b of 2 (%d ranks each) lost after step %d of %d, standby node c, step about "
             "%g ms, checkpoint every %d steps; %d run%s, median (min–max)" %
             (version, args.nproc_per_node, args.kill_at, args.steps, args.step_ms, args.checkpoint_every, args.runs,
              "" if args.runs == 1 else "s"), ""]
    by = {c: [r for r in results if r["contender"] == c and r["rc"] == 0 and r["lost_s"]] for c in contenders}
    failed = {c: [str(r["rcs"]) for r in results if r["contender"] == c and r not in by[c]] for c in contenders}
    med = {c: statistics.median(r["lost_s"] for r in by[c]) if by[c] else None for c in contenders}
    base = med.get("ddprun in_process")
    rows = []
    for c in contenders:
        note = " (%d failed: %s)" % (len(failed[c]), "; ".join(failed[c])) if failed[c] else ""
        if not by[c] or not base:
            rows.append([c, "failed" + note, "-", "-", "-"])
            continue
        rows.append([c, rb.fmt_spread([r["lost_s"] for r in by[c]]) + note,
                     "/".join(map(str, sorted({r["steps_lost"] for r in by[c]}))),
                     rb.fmt_spread([r["wall_s"] for r in by[c]], digits=1), "%.1fx" % (med[c] / base)])
    lines += benchlib.md_table(["contender", "time lost", "steps lost", "whole run", "time lost / in_process's"], rows)
    return lines, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", help="the workers' interpreter (repeatable)")
    ap.add_argument("--ddprun", default=os.path.join(os.environ.get("DDPRUN_BIN") or
                                                     os.path.join(benchlib.ROOT, "build", "bin"), "ddprun"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="long enough for the standby's spares to import torch")
    ap.add_argument("--kill_at", type=int, default=105, help="node b is lost once the job logged this step")
    ap.add_argument("--step_ms", type=float, default=50.0)
    ap.add_argument("--nproc_per_node", type=int, default=2)
    ap.add_argument("--checkpoint_every", type=int, default=10)
    ap.add_argument("--standby_s", type=float, default=3.0, help="time for c to join as the standby")
    ap.add_argument("--job_timeout", type=float, default=300.0)
    ap.add_argument("--no_torchrun", action="store_true")
    ap.add_argument("--contender", action="append", choices=CONTENDERS, help="only these (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the jobs' directories (logs) and print where")
    ap.add_argument("--smoke", action="store_true", help="1 run, 250 steps, lost at 80, torch 1.13, no torchrun")
    args = ap.parse_args()
    contenders = CONTENDERS
    if args.smoke:
        args.runs, args.steps, args.kill_at, args.python, args.no_torchrun = 1, 250, 80, ["/usr/bin/python3"], True
        args.standby_s = 1.0
        args.job_timeout = min(args.job_timeout, 80.0)  # a job takes ~20 s: a hang reports within ctest's bound
    if args.no_torchrun:
        contenders = CONTENDERS[:3]
    if args.contender:
        contenders = tuple(c for c in contenders if c in args.contender)
    if not os.access(args.ddprun, os.X_OK):
        benchlib.skip("%s is not built" % args.ddprun)
    versions = [(py, v) for py in (args.python or rb.default_pythons()) for v in [rb.torch_version(py)] if v]
    if not versions:
        benchlib.skip("no interpreter with torch")
    tmp = tempfile.mkdtemp(prefix="lost_node_bench-")
    out, failed = [], False
    try:
        for py, version in versions:
            results = []
            for run in range(args.runs):
                n = len(contenders)
                for c in contenders[run % n:] + contenders[:run % n]:
                    r = run_job(args, py, version, c, tmp)
                    r.update({"torch": version, "run": run})
                    results.append(r)
                    print(json.dumps(r), flush=True)
            lines, problems = report(version, args, results, contenders)
            for p in problems:
                print("recovery_lost_node_bench: torch %s: %s" % (version, p), flush=True)
            # torchrun's failures are its own result (reported in its row), not the bench's.
            failed = failed or any(not p.startswith("torchrun") for p in problems)
            out += lines
    finally:
        if args.keep:
            print("recovery_lost_node_bench: the jobs' logs are kept in %s" % tmp, flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n%s; commit %s; %s; ddprun %s" % (time.strftime("%Y-%m-%d %H:%M"), benchlib.git_rev(),
                                             benchlib.machine_text(), args.ddprun))
    print("\n".join(out))
    if failed:
        print("recovery_lost_node_bench: FAILED", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
