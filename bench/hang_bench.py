#!/usr/bin/python3
"""Hang detection: how long ddprun takes to call a hang and show the stacks, and what its
heartbeats and flight recorder cost a training step.

Part 1, detection and diagnosis (this script is also the worker program, in --worker mode):

  * finish-torch: `ddprun --standalone --nproc_per_node=N --finish_timeout=F python3 THIS --worker
    finish-torch`. The ranks meet on a torch.distributed.TCPStore (rank 0 hosts it at
    MASTER_ADDR:MASTER_PORT); rank N-1 prints `LEFT <time.time()>` and exits 0; every other rank
    waits in wait_forever_torch() on store.wait(["never"], 600 s). ddprun exits 124 once F seconds
    have passed and it has the ranks' Python stacks (SIGABRT under PYTHONFAULTHANDLER=1, at most
    3 s).
  * finish-plain: the same without torch: the ranks meet on a TCP socket served by rank 0; the
    waiting ranks sit in wait_forever_plain() (recv on that socket; rank 0 in time.sleep).
  * heartbeat: `--hang_timeout=H`; every rank calls ddprun.report_step(step) every 20 ms in
    beat_loop(); rank N-1 prints `LAST_BEAT <time.time()>` after its last beat and stops in
    stalled_here().

  Reported per variant and N: diagnosis overhead = (ddprun's exit - LEFT/LAST_BEAT) - timeout,
  split at the time ddprun logs "is hung" (its log line's clock, ms) into detection lag and the
  time taken by the stacks and the shutdown; and whether each rank still running had its stack in
  ddprun's stderr: in the failure summary (the root cause's traceback or a "Stack of rank R"
  block) and in the console ("[defaultR]:" lines), found by the waiting function's name.

Part 2, the cost on the C++ SDK's train step: `ddprun --standalone --nproc_per_node=2
--hang_timeout=60 /bin/sh -c '[unset DDPRUN_FLIGHT_RECORDER DDPRUN_HEARTBEAT_SOCKET;] exec train
"$@"' sh --epochs E --samples S`, with and without the unset, interleaved (ABAB...), wall time per
run, medians and their ratio. --hang_timeout is given to both so that the "with" runs send
heartbeats (ddprun names the heartbeat socket only when hang detection is on).

Every run is bounded (--timeout, then SIGKILL to its process group) and tagged in its environment;
after each run any process still carrying the tag is killed and counted. Temp dirs only,
loopback only. Stdlib only (torch only inside the finish-torch worker).

usage: bench/hang_bench.py [--smoke] [--out FILE] [--repeat R] [--hang-repeat K]
"""
import argparse
import datetime
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = os.path.abspath(__file__)
TAG_VAR = "HANG_BENCH_TAG"


# ---------------------------------------------------------------- workers (run under ddprun)
def wait_forever_torch(store):
    from datetime import timedelta
    while True:
        store.wait(["never"], timedelta(seconds=600))


def wait_forever_plain(conn):
    while True:
        if conn is None:
            time.sleep(600)
        elif not conn.recv(1):  # EOF (rank 0 gone): stay here all the same
            time.sleep(600)


def worker_finish_torch():
    from datetime import timedelta
    import torch.distributed as dist
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The launcher's store where it serves one (TORCHELASTIC_USE_AGENT_STORE=True, as torch's
    # env:// reads it: ddprun's agent, torchrun 2.x's), else rank 0's.
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n, hosts,
                          timedelta(seconds=100))
    store.set("met%d" % rank, "1")
    store.wait(["met%d" % i for i in range(n)], timedelta(seconds=100))
    if rank == n - 1:
        print("LEFT %.6f" % time.time(), flush=True)
        sys.exit(0)
    wait_forever_torch(store)


def worker_finish_plain():
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(max(128, n))
        srv.settimeout(100)
        peers = [srv.accept()[0] for _ in range(n - 1)]
        for c in peers:
            c.sendall(b"g")
        conn = None
    else:
        deadline = time.monotonic() + 100
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn.settimeout(None)
        if conn.recv(1) != b"g":
            sys.exit("rank %d: no go from rank 0" % rank)
    if rank == n - 1:
        print("LEFT %.6f" % time.time(), flush=True)
        sys.exit(0)
    wait_forever_plain(conn)


def stalled_here():
    time.sleep(600)


def beat_loop(stall_after):
    import ddprun
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not ddprun.enabled():
        sys.exit("ddprun.enabled() is false: no heartbeat socket (--hang_timeout off?)")
    step = 0
    while True:
        ddprun.report_step(step)
        if rank == n - 1 and step >= stall_after:
            print("LAST_BEAT %.6f" % time.time(), flush=True)
            stalled_here()
        step += 1
        time.sleep(0.02)


def worker(kind, stall_after):
    if kind == "finish-torch":
        worker_finish_torch()
    elif kind == "finish-plain":
        worker_finish_plain()
    elif kind == "heartbeat":
        beat_loop(stall_after)
    else:
        sys.exit("unknown worker kind %r" % kind)


# ---------------------------------------------------------------- driver
def kill_tagged(tag):
    """Kills every process of ours whose environment carries `tag`; returns how many there were."""
    needle = ("%s=%s" % (TAG_VAR, tag)).encode()
    found = 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found += 1
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass
    return found


class Run:
    pass


def run_ddprun(argv, tmp, timeout, extra_env=None):
    """Runs argv (ddprun ...) in its own session, stdout/stderr to files; returns a Run with rc,
    t_start, t_exit (time.time() as waitpid returned), out, err, timed_out, leftovers."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "DDPRUN_"))}
    env.pop("PYTHONFAULTHANDLER", None)
    env.update(TMPDIR=tmp, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "python"),
               PYTHONDONTWRITEBYTECODE="1")
    env[TAG_VAR] = tag
    env.update(extra_env or {})
    r = Run()
    out_path, err_path = os.path.join(tmp, "out-%s" % tag), os.path.join(tmp, "err-%s" % tag)
    with open(out_path, "w") as fo, open(err_path, "w") as fe:
        r.t_start = time.time()
        p = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env, cwd=tmp,
                             start_new_session=True)
    r.timed_out = False

    def on_timeout():
        r.timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    timer = threading.Timer(timeout, on_timeout)
    timer.start()
    try:
        p.wait()  # a blocking waitpid: the exit time to the scheduler's precision, not a poll's
        r.t_exit = time.time()
    finally:
        timer.cancel()
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    r.rc = p.returncode
    time.sleep(0.05)
    r.leftovers = kill_tagged(tag)
    with open(out_path, errors="replace") as f:
        r.out = f.read()
    with open(err_path, errors="replace") as f:
        r.err = f.read()
    os.unlink(out_path)
    os.unlink(err_path)
    return r


HUNG_RE = re.compile(r"^\[ddprun \w (\d\d):(\d\d):(\d\d)\.(\d{3})\] worker rank (\d+) .*is hung", re.M)


def declared_at(err, near):
    """ddprun's 'is hung' log line as time.time() (its clock is local HH:MM:SS.mmm), or None."""
    m = HUNG_RE.search(err)
    if not m:
        return None
    h, mi, s, ms = (int(x) for x in m.groups()[:4])
    base = datetime.datetime.fromtimestamp(near)
    t = base.replace(hour=h, minute=mi, second=s, microsecond=ms * 1000).timestamp()
    while t - near > 43200:
        t -= 86400
    while near - t > 43200:
        t += 86400
    return t


def stacks_found(err, func_of_rank):
    """(ranks whose stack in the summary names their function, ranks whose console dump does, notes)."""
    summary, console, notes = set(), set(), []
    owner = None
    in_summary = False
    for line in err.splitlines():
        m = re.match(r"^\[default(\d+)\]:(.*)$", line)
        if m:
            r = int(m.group(1))
            if r in func_of_rank and re.search(r"\bin %s\b" % func_of_rank[r], m.group(2)):
                console.add(r)
            continue
        if line.startswith("=" * 20):
            in_summary = True
            owner = None
            continue
        if not in_summary:
            continue
        m = re.match(r"^\s+rank\s*:\s*(\d+)", line)
        if m:
            owner = int(m.group(1))
            continue
        m = re.match(r"^Stack of rank (\d+) \(local_rank: \d+\)(:?)\s*(.*)$", line)
        if m:
            owner = int(m.group(1))
            if m.group(3):
                notes.append("rank %d: %s" % (owner, m.group(3)))
            continue
        if line.startswith("Other failures"):
            owner = None
            continue
        if owner in func_of_rank and re.search(r"\bin %s\b" % func_of_rank[owner], line):
            summary.add(owner)
    return summary, console, notes


def stamp(out, word):
    m = re.search(r"^\[default\d+\]:%s ([0-9.]+)\s*$" % word, out, re.M)
    return float(m.group(1)) if m else None


def hang_case(args, tmp, variant, n):
    """One run of part 1; returns a dict of what it measured."""
    timeout_s = args.finish_timeout if variant.startswith("finish") else args.hang_timeout
    cmd = [args.ddprun, "--standalone", "--nproc_per_node=%d" % n, "--max_restarts=0"]
    if variant == "finish-plain":
        # Its rank 0 serves its own socket at MASTER_ADDR:MASTER_PORT, which the agent's torch store
        # would hold: rank 0's port, as torchrun 1.x gives it (README, "torch's store").
        cmd.append("--torch_store=rank0")
    if variant.startswith("finish"):
        cmd.append("--finish_timeout=%g" % timeout_s)
    else:
        cmd.append("--hang_timeout=%g" % timeout_s)
    cmd += [args.python, THIS, "--worker", variant, "--stall-after", str(args.stall_after)]
    r = run_ddprun(cmd, tmp, args.timeout)
    word = "LAST_BEAT" if variant == "heartbeat" else "LEFT"
    t_left = stamp(r.out, word)
    if variant == "heartbeat":
        func = {k: "beat_loop" for k in range(n - 1)}
        func[n - 1] = "stalled_here"
    else:
        func = {k: "wait_forever_torch" if variant == "finish-torch" else "wait_forever_plain" for k in range(n - 1)}
    summary, console, notes = stacks_found(r.err, func)
    t_decl = declared_at(r.err, r.t_exit)
    res = dict(variant=variant, n=n, rc=r.rc, timed_out=r.timed_out, leftovers=r.leftovers,
               expected=len(func), summary=len(summary), console=len(console), notes=notes,
               wall=r.t_exit - r.t_start,
               missing=sorted(set(func) - (summary & console)))
    res["overhead"] = (r.t_exit - t_left - timeout_s) if t_left is not None else None
    res["lag"] = (t_decl - t_left - timeout_s) if (t_decl is not None and t_left is not None) else None
    res["stacks"] = (r.t_exit - t_decl) if t_decl is not None else None
    ok = r.rc == 124 and t_left is not None and not res["missing"] and not r.timed_out
    res["ok"] = ok
    if not ok and args.verbose_failures:
        res["err_tail"] = r.err[-3000:]
        res["out_tail"] = r.out[-1500:]
    return res


def train_case(args, tmp, with_fr):
    inner = ("" if with_fr else "unset DDPRUN_FLIGHT_RECORDER DDPRUN_HEARTBEAT_SOCKET; ") + \
        'exec %s "$@"' % args.train
    cmd = [args.ddprun, "--standalone", "--nproc_per_node=2", "--max_restarts=0", "--hang_timeout=60",
           "/bin/sh", "-c", inner, "sh", "--epochs", str(args.epochs), "--samples", str(args.samples)]
    r = run_ddprun(cmd, tmp, args.timeout)
    epochs = len(re.findall(r"^\[default0\]:epoch \d+ loss [0-9.eE+-]+", r.out, re.M))
    m = re.search(r"^\[default0\]:digest (\S+)", r.out, re.M)
    return dict(with_fr=with_fr, rc=r.rc, wall=r.t_exit - r.t_start, epochs=epochs,
                digest=m.group(1) if m else None, timed_out=r.timed_out, leftovers=r.leftovers,
                ok=r.rc == 0 and epochs == args.epochs and not r.timed_out,
                tail="" if r.rc == 0 else (r.out + r.err)[-2000:])


def fmt(x, nd=2):
    return "-" if x is None else ("%.*f" % (nd, x))


def med_range(xs, nd=2):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt(xs[0], nd)
    return "%s (%s..%s)" % (fmt(statistics.median(xs), nd), fmt(min(xs), nd), fmt(max(xs), nd))


def md_table(header, rows):
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="one tiny case of each (N=2/4/2, one train pair of ~1 s): does it still run?")
    ap.add_argument("--out", default=None, help="also write the report (markdown) to this file")
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "bin", "train"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch (Debian's 1.13)")
    ap.add_argument("--torch-ns", default="4,16")
    ap.add_argument("--plain-ns", default="16,64")
    ap.add_argument("--heartbeat-ns", default="4,16")
    ap.add_argument("--finish-timeout", type=float, default=2.0, help="F, seconds")
    ap.add_argument("--hang-timeout", type=float, default=2.0, help="H, seconds")
    ap.add_argument("--stall-after", type=int, default=50, help="beats before the heartbeat rank stops (20 ms each)")
    ap.add_argument("--hang-repeat", type=int, default=3, help="runs of each part-1 case")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each train variant (interleaved)")
    ap.add_argument("--epochs", type=int, default=40, help="train --epochs (about 5 s here at 4096 samples)")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=120, help="per run, seconds (then SIGKILL)")
    ap.add_argument("--only", default="hangs,train", help="hangs, train or both")
    ap.add_argument("--verbose-failures", action="store_true", default=True, help=argparse.SUPPRESS)
    # worker mode
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.stall_after)

    if args.smoke:
        args.torch_ns, args.plain_ns, args.heartbeat_ns = "2", "4", "2"
        args.hang_repeat, args.repeat, args.epochs = 1, 1, 6
    for x in (args.ddprun, args.train):
        if not os.access(x, os.X_OK):
            sys.exit("missing %s (build ddprun and train first)" % x)
    only = set(args.only.split(","))
    probe = subprocess.run([args.python, "-c", "import torch.distributed"], capture_output=True, text=True,
                           timeout=120)
    torch_missing = None if probe.returncode == 0 else ((probe.stderr.strip().splitlines() or ["?"])[-1])

    started = time.time()
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="hang_bench_")
    hangs, trains, failures = [], [], []
    try:
        if "hangs" in only:
            cases = [("finish-torch", int(n)) for n in args.torch_ns.split(",") if n]
            cases += [("finish-plain", int(n)) for n in args.plain_ns.split(",") if n]
            cases += [("heartbeat", int(n)) for n in args.heartbeat_ns.split(",") if n]
            for rep in range(args.hang_repeat):
                for variant, n in cases:
                    if variant == "finish-torch" and torch_missing:
                        continue
                    res = hang_case(args, tmp, variant, n)
                    res["rep"] = rep
                    hangs.append(res)
                    print("# %s N=%d #%d: rc=%s overhead=%s s lag=%s s stacks=%s s summary %d/%d console %d/%d "
                          "wall %.1f s leftovers %d%s" % (
                              variant, n, rep, res["rc"], fmt(res["overhead"], 3), fmt(res["lag"], 3),
                              fmt(res["stacks"], 3), res["summary"], res["expected"], res["console"],
                              res["expected"], res["wall"], res["leftovers"],
                              "" if res["ok"] else " FAILED (missing stacks of ranks %s)" % res["missing"]),
                          flush=True)
                    for note in res["notes"]:
                        print("#   note: %s" % note, flush=True)
                    if not res["ok"]:
                        failures.append("%s N=%d #%d" % (variant, n, rep))
                        if "err_tail" in res:
                            print("#   stderr tail:\n" + "\n".join("#   " + l for l in res["err_tail"].splitlines()[-40:]),
                                  flush=True)
        if "train" in only:
            for rep in range(args.repeat):
                for with_fr in (True, False):
                    res = train_case(args, tmp, with_fr)
                    res["rep"] = rep
                    trains.append(res)
                    print("# train %s #%d: rc=%d wall %.2f s epochs %d digest %s leftovers %d" % (
                        "with" if with_fr else "without", rep, res["rc"], res["wall"], res["epochs"],
                        res["digest"], res["leftovers"]), flush=True)
                    if not res["ok"]:
                        failures.append("train %s #%d" % ("with" if with_fr else "without", rep))
                        print("\n".join("#   " + l for l in res["tail"].splitlines()[-30:]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    took = time.time() - started

    L = []
    L.append("load average before %.2f/%.2f/%.2f, after %.2f/%.2f/%.2f; %.0f s in all; %d CPUs" % (
        load_before + load_after + (took, os.cpu_count())))
    L.append("")
    if torch_missing:
        L.append("finish-torch skipped: %s cannot import torch.distributed (%s)" % (args.python, torch_missing))
        L.append("")
    if "hangs" in only:
        L.append("Hangs: F = --finish_timeout = %g s, H = --hang_timeout = %g s; overhead = ddprun's exit - "
                 "(LEFT or LAST_BEAT) - timeout; lag = ddprun's 'is hung' log line - (LEFT or LAST_BEAT) - "
                 "timeout; stacks = exit - 'is hung'. Seconds, median (min..max) over the runs. Stacks: runs "
                 "in which every rank expected had its waiting function in the summary / on the console." % (
                     args.finish_timeout, args.hang_timeout))
        L.append("")
        rows = []
        seen = []
        for h in hangs:
            if (h["variant"], h["n"]) not in seen:
                seen.append((h["variant"], h["n"]))
        for variant, n in seen:
            hs = [h for h in hangs if h["variant"] == variant and h["n"] == n]
            rcs = ",".join(str(h["rc"]) for h in hs)
            exp = hs[0]["expected"]
            rows.append([variant, n, len(hs), rcs, med_range([h["overhead"] for h in hs]),
                         med_range([h["lag"] for h in hs]), med_range([h["stacks"] for h in hs]),
                         "%d/%d runs (%s of %d)" % (sum(h["summary"] == exp for h in hs), len(hs),
                                                    ",".join(str(h["summary"]) for h in hs), exp),
                         "%d/%d runs (%s of %d)" % (sum(h["console"] == exp for h in hs), len(hs),
                                                    ",".join(str(h["console"]) for h in hs), exp),
                         sum(h["leftovers"] for h in hs)])
        L += md_table(["variant", "N", "runs", "exit codes", "overhead s", "lag s", "stacks s",
                       "stacks in summary", "stacks on console", "leftover procs"], rows)
        L.append("")
    if "train" in only:
        w = [t["wall"] for t in trains if t["with_fr"] and t["ok"]]
        wo = [t["wall"] for t in trains if not t["with_fr"] and t["ok"]]
        digests = sorted({t["digest"] for t in trains if t["digest"]})
        L.append("Train: `ddprun --standalone --nproc_per_node=2 --hang_timeout=60 train --epochs %d --samples %d` "
                 "through /bin/sh, with and without `unset DDPRUN_FLIGHT_RECORDER DDPRUN_HEARTBEAT_SOCKET`, "
                 "interleaved, %d runs each; wall seconds per run, median (min..max). Final digests: %s." % (
                     args.epochs, args.samples, args.repeat, ", ".join(digests) or "-"))
        L.append("")
        rows = [["with (flight recorder + heartbeats)", "%d/%d" % (len(w), args.repeat), med_range(w, 3),
                 " ".join("%.2f" % x for x in w) or "-"],
                ["without (both unset)", "%d/%d" % (len(wo), args.repeat), med_range(wo, 3),
                 " ".join("%.2f" % x for x in wo) or "-"]]
        L += md_table(["variant", "ok runs", "wall s", "each run s"], rows)
        L.append("")
        ratio = statistics.median(w) / statistics.median(wo) if w and wo else None
        L += md_table(["median with / median without", "difference s"],
                      [[fmt(ratio, 3), fmt(statistics.median(w) - statistics.median(wo), 3) if w and wo else "-"]])
        L.append("")
    if failures:
        L.append("failed runs: " + ", ".join(failures))
    text = "\n".join(L)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print("wrote %s" % args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
