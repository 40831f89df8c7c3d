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
import ctypes
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import benchlib
from benchlib import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCHRUN = "/usr/bin/torchrun"
SH = "/bin/sh"
GIB = 1 << 30
MIB = 1 << 20


class Aborted(Exception):
    pass


class StepTimeout(Exception):
    pass


def log(msg):
    print("[mnb %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- process hygiene

class Procs:
    """Everything the driver starts: spawned with posix_spawn (the cheapest way Python has to
    start a process), each in its own process group, all carrying MARK in their environment so
    that their descendants are found wherever they were reparented. The driver is a child
    subreaper, so orphans come back to it and are reaped."""

    def __init__(self):
        self.mark = uuid.uuid4().hex
        # Without the runner's SLURM_*: inside a Slurm job ddprun would take the step's settings and torchrun would not.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["DDPRUN_MNB_MARK"] = self.mark
        self.env.pop("PYTHONPATH", None)
        self.children = {}  # pid -> (name, exit status or None)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except OSError:
            pass

    def spawn(self, argv, log_path, env=None, fifo_child=False):
        e = dict(self.env)
        if env:
            e.update(env)
        fa = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
              (os.POSIX_SPAWN_OPEN, 1, log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
              (os.POSIX_SPAWN_DUP2, 1, 2)]
        kw = {"scheduler": (os.SCHED_FIFO, os.sched_param(1))} if fifo_child else {}
        pid = os.posix_spawn(argv[0], argv, e, file_actions=fa, setpgroup=0, **kw)
        self.children[pid] = [os.path.basename(argv[0]), None]
        return pid

    def reap(self):
        """Reaps every exited child (ours and adopted orphans) without blocking."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children[pid][1] = os.waitstatus_to_exitcode(status)

    def alive(self, pid):
        self.reap()
        return pid in self.children and self.children[pid][1] is None

    def exit_code(self, pid):
        self.reap()
        return self.children.get(pid, [None, None])[1]

    def is_marked(self, pid):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                return ("DDPRUN_MNB_MARK=" + self.mark).encode() in f.read()
        except OSError:
            return False

    def marked(self):
        """Pids of live processes carrying our mark (excluding ourselves)."""
        me = os.getpid()
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me and self.is_marked(int(d))]

    def kill(self, pid, sig):
        """Signals pid only if it is still ours: an unreaped child of the driver, or a process that
        carries our mark, checked through a pidfd so that a pid reused meanwhile is never hit."""
        ours_child = pid in self.children and self.children[pid][1] is None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            if ours_child or self.is_marked(pid):
                signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)

    def kill_all(self):
        """SIGKILLs everything carrying our mark, then reaps; repeats until nothing is left."""
        # A zombie's environ reads empty, so the dead drop out of marked(); our own children are
        # reaped here, adopted orphans too (the driver is a subreaper).
        for _ in range(100):
            self.reap()
            pids = set(self.marked()) | {p for p, v in self.children.items() if v[1] is None}
            if not pids:
                break
            for pid in pids:
                self.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        self.reap()
        self.children = {}

    def descendants(self, root):
        """Every living process below `root` (not root itself)."""
        return benchlib.descendants(root)[1:]


def _port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _set_fifo(on):
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(2))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (OSError, AttributeError):
        return False


def _set_nice(pid, value):
    try:
        os.setpriority(os.PRIO_PROCESS, pid, value)
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- helpers

def proc_mem(pid):
    """(Pss, Rss, threads) in bytes/count of one process, or None when gone."""
    try:
        pss = rss = 0
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
        threads = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
        return pss, rss, threads
    except (OSError, ValueError):
        return None


def proc_hwm(pid):
    """Peak RSS (VmHWM) in bytes, or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def proc_comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_cpu_seconds(pid):
    """CPU seconds of a live process's threads, from schedstat (ns): /proc/PID/stat's tick
    sampling misses processes that run in short bursts. Threads that already exited are not
    counted; None when the process is gone."""
    total = 0
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for t in tasks:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def kernel_mem():
    """KernelStack + PageTables, bytes: what a process costs the kernel beyond its pages."""
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(("KernelStack:", "PageTables:")):
                total += int(line.split()[1]) * 1024
    return total


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for(pred, timeout, interval=0.02, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise StepTimeout("timed out after %.0f s waiting for %s" % (timeout, what))


def fmt_s(x):
    return "-" if x is None else ("%.3f" % x)


def fmt_mib(x):
    return "-" if x is None else ("%.1f" % (x / MIB))


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------- the bench

class Bench:
    def __init__(self, args):
        self.args = args
        self.procs = Procs()
        self.tmp = tempfile.mkdtemp(prefix="ddprun-mnb-")
        self.bindir = os.path.join(args.build_dir, "bin")
        self.ddprun = os.path.join(self.bindir, "ddprun")
        self.multinode = os.path.join(self.bindir, "ddprun-multinode")
        self.rdzv = os.path.join(self.bindir, "ddprun-rdzv")
        # $DDPRUN_STORE_BENCH: where ctest's build put it (bench/CMakeLists.txt).
        self.store_bench = os.environ.get("DDPRUN_STORE_BENCH") or os.path.join(self.bindir, "ddprun-store-bench")
        self.tcpstore_bench = os.path.join(self.bindir, "tcpstore-bench")
        self.seq = 0
        self.report = []       # markdown lines
        self.commands = []     # exact command lines used, for the report
        self.verdicts = []
        self.wait_exit = True
        self.mem_valve = False

    # -- plumbing

    def newdir(self, name):
        self.seq += 1
        d = os.path.join(self.tmp, "%03d-%s" % (self.seq, name))
        os.makedirs(d)
        return d

    def step_env(self, d):
        """MNB_DIR for the workers' stamps, and TMPDIR, so that the run folders of agents that the
        driver SIGKILLs (ddprun_*, torchelastic_*) go away with the step's folder."""
        for k in ("MNB_DIR", "TMPDIR"):
            if d:
                self.procs.env[k] = d
            else:
                self.procs.env.pop(k, None)

    def note_cmd(self, label, argv):
        line = " ".join(_q(a) for a in argv)
        if (label, line) not in self.commands:
            self.commands.append((label, line))

    def start_daemon(self, d):
        logp = os.path.join(d, "rdzv.log")
        pid = self.procs.spawn([self.rdzv, "--port", "0", "--log_level", "warning"], logp)
        self.note_cmd("daemon", [self.rdzv, "--port", "0"])
        m = wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", tail(logp, 5)), 15,
                     what="ddprun-rdzv to listen")
        return pid, int(m.group(1))

    def cleanup_step(self):
        self.procs.kill_all()

    # -- worker scripts

    @staticmethod
    def stamp_worker(exit_after=True):
        # The file's mtime is the moment the worker ran. No "$$" in scripts: torchrun passes its
        # arguments through string.Template, which turns "$$" into "$"; `read` is a builtin, so
        # /proc/self/stat is the shell's own.
        s = 'read p _ < /proc/self/stat; echo "$RANK $GROUP_WORLD_SIZE ${DDPRUN_ROUND:-x}" > "$MNB_DIR/w.$RANK.$p"'
        return s if exit_after else s + "; exec sleep 300"

    def ddprun_agent_argv(self, n, port, run_id, script, extra=(), conf="is_host=0"):
        return [self.ddprun, "--nnodes=%s" % n, "--nproc_per_node=1", "--rdzv_backend=grpc",
                "--rdzv_endpoint=127.0.0.1:%s" % port, "--rdzv_conf", conf,
                "--rdzv_id=%s" % run_id] + list(extra) + ["--no_python", SH, "-c", script]

    def torchrun_argv(self, n, port, run_id, script, extra=()):
        return [TORCHRUN, "--nnodes=%s" % n, "--rdzv_backend=c10d",
                "--rdzv_endpoint=127.0.0.1:%s" % port, "--rdzv_id=%s" % run_id,
                "--nproc_per_node=1", "--redirects", "9:1", "--tee", "9:1",
                "--monitor_interval=0.1"] + list(extra) + ["--no_python", SH, "-c", script]

    # -- spawning N of something, timing until N stamp files exist

    def spawn_many(self, argvs, d, envs=None, first=0):
        """Spawns all argvs in a tight loop; returns (t0 wall ns, spawn loop seconds, pids)."""
        pids = []
        # t0 is the mtime of a file written just before the loop: the same kernel clock as the
        # workers' stamps, so its coarseness (one tick) cancels out.
        t0_path = os.path.join(d, "t0")
        with open(t0_path, "w") as f:
            f.write("t0")
        t0 = os.stat(t0_path).st_mtime_ns
        m0 = time.monotonic()
        # The loop runs as SCHED_FIFO 2, so that the agents it already started do not starve it (on
        # a cluster, agents start in parallel on their hosts). Each child execs as SCHED_FIFO 1 (so
        # that the exec the loop waits for is not starved either) and is made SCHED_OTHER, nice 0,
        # as soon as posix_spawn returns. Without the privilege: nice -10, children put back to 0.
        fifo = _set_fifo(True)
        boosted = not fifo and _set_nice(0, -10)
        try:
            for i, argv in enumerate(argvs):
                pid = self.procs.spawn(argv, os.path.join(d, "log.%d" % (first + i)),
                                       env=envs[i] if envs else None, fifo_child=fifo)
                if fifo:
                    try:
                        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                    except OSError:
                        pass
                if boosted:
                    _set_nice(pid, 0)
                pids.append(pid)
        finally:
            if fifo:
                _set_fifo(False)
            if boosted:
                _set_nice(0, 0)
        return t0, time.monotonic() - m0, pids

    def await_stamps(self, d, n, pids, timeout, stamp_prefix="w."):
        """Waits for n stamp files or for every spawned process to have exited; returns the
        files' mtimes (ns) and the time (monotonic s) when all pids had exited (None if not)."""
        end = time.monotonic() + timeout
        stamps = {}
        all_exited_at = None
        self.min_avail = mem_available()
        self.mem_valve = False
        first_gone = None
        while time.monotonic() < end:
            avail = mem_available()
            self.min_avail = min(self.min_avail, avail)
            if avail < self.args.min_free_gib * GIB:
                self.mem_valve = True  # stop before the machine runs out of memory
                break
            for e in os.scandir(d):
                if e.name.startswith(stamp_prefix) and e.name not in stamps:
                    try:
                        stamps[e.name] = e.stat().st_mtime_ns
                    except OSError:
                        pass
            self.procs.reap()
            live = [p for p in pids if self.procs.children.get(p, [0, 0])[1] is None]
            if not live and all_exited_at is None:
                all_exited_at = time.monotonic()
            if len(stamps) >= n and (all_exited_at is not None or not self.wait_exit):
                break
            if all_exited_at is not None and len(stamps) < n:
                # Everyone is gone but workers are missing: give late files a moment, then stop.
                if time.monotonic() - all_exited_at > 1.0:
                    break
            if not self.wait_exit and len(stamps) < n and len(live) < len(pids):
                # An agent is gone before every worker ran: with --nnodes=N the round can never
                # fill up, and the others would wait for join_timeout. Stop 2 s later.
                first_gone = first_gone or time.monotonic()
                if time.monotonic() - first_gone > 2.0:
                    break
            time.sleep(0.05)
        return stamps, all_exited_at

    def run_rdzv_case(self, kind, n, timeout):
        try:
            return self._run_rdzv_case(kind, n, timeout)
        except StepTimeout as e:
            return {"kind": kind, "n": n, "ok": False, "note": str(e)}

    def _run_rdzv_case(self, kind, n, timeout):
        """kind: sh | version | standalone | ddprun | ddprun_hb | torchrun. Returns a result dict.

        Launcher workers stamp their file and then hold (sleep), as training workers run on, so
        that the start is measured without the exits of early workers in the way. Once every
        worker runs (or the step fails), every agent gets SIGTERM and the teardown is timed."""
        d = self.newdir("%s-%d" % (kind, n))
        run_id = "mnb-%s-%d-%s" % (kind, n, uuid.uuid4().hex[:6])
        self.step_env(d)
        daemon_pid = None
        res = {"kind": kind, "n": n, "ok": False}
        worker = self.stamp_worker(exit_after=False)
        try:
            if kind in ("ddprun", "ddprun_hb"):
                daemon_pid, port = self.start_daemon(d)
                conf = "is_host=0" if kind == "ddprun" else "is_host=0,heartbeat_timeout=60"
                argv = self.ddprun_agent_argv(n, port, run_id, worker, conf=conf)
                self.note_cmd(kind, self.ddprun_agent_argv("N", "PORT", "RUN_ID", worker, conf=conf))
                argvs = [argv] * n
            elif kind == "torchrun":
                argvs = [self.torchrun_argv(n, free_port(), run_id, worker)] * n
                self.note_cmd(kind, self.torchrun_argv("N", "PORT", "RUN_ID", worker))
            elif kind == "standalone":
                argvs = [[self.ddprun, "--standalone", "--nproc_per_node=1", "--no_python", SH, "-c", worker]] * n
                self.note_cmd(kind, argvs[0])
            elif kind == "sh":  # the floor of starting N processes at all
                argvs = [[SH, "-c", 'echo x > "$MNB_DIR/w.%d"' % i] for i in range(n)]
                self.note_cmd("sh floor", [SH, "-c", 'echo x > "$MNB_DIR/w.I"'])
            else:  # version: the floor of loading the ddprun binary N times
                argvs = [[self.multinode, "--version"]] * n
                self.note_cmd("binary floor", argvs[0])
            holds = kind not in ("sh", "version")
            want = 0 if kind == "version" else n
            cpu0 = children_cpu()
            avail0 = mem_available()
            self.wait_exit = not holds
            t0, spawn_s, pids = self.spawn_many(argvs, d)
            m_spawned = time.monotonic()
            stamps, exited_at = self.await_stamps(d, want, pids, timeout)
            res["spawn_loop_s"] = spawn_s
            res["workers"] = len(stamps)
            res["peak_mem_drop"] = max(0, avail0 - self.min_avail)
            if stamps:
                res["first_worker_s"] = (min(stamps.values()) - t0) / 1e9
                res["all_workers_s"] = (max(stamps.values()) - t0) / 1e9
            if daemon_pid:
                res["daemon_cpu_up_s"] = proc_cpu_seconds(daemon_pid)
            if holds:
                # CPU spent by the agents, their watchdogs and workers (live ones, and what was
                # reaped) until every worker ran.
                res["agents_cpu_up_s"] = sum(proc_cpu_seconds(p) or 0 for p in self.procs.marked()
                                             if p != daemon_pid) + children_cpu() - cpu0
                died = [i for i, p in enumerate(pids) if not self.procs.alive(p)]
                res["failed_agents"] = len(died)
                res["ok"] = len(stamps) == want and not died
                if res["ok"] and self.args.steady_seconds > 0:
                    # Steady state: every worker runs, agents only heartbeat. CPU per second of
                    # the daemon and of all agents together.
                    def cpu_now():
                        agents = sum(proc_cpu_seconds(p) or 0 for p in self.procs.marked() if p != daemon_pid)
                        return agents, (proc_cpu_seconds(daemon_pid) or 0) if daemon_pid else 0
                    time.sleep(1.0)
                    a0, d0 = cpu_now()
                    m0 = time.monotonic()
                    time.sleep(self.args.steady_seconds)
                    a1, d1 = cpu_now()
                    dt = time.monotonic() - m0
                    res["steady_agents_ms"] = (a1 - a0) / dt * 1000
                    if daemon_pid:
                        res["steady_daemon_ms"] = (d1 - d0) / dt * 1000
                # Teardown: SIGTERM to every agent, until all have exited.
                m_term = time.monotonic()
                for p in pids:
                    # Only children not reaped yet: a reaped pid may belong to someone else now.
                    if self.procs.alive(p):
                        self.procs.kill(p, signal.SIGTERM)
                end = m_term + max(60.0, 0.2 * n)
                while time.monotonic() < end and any(self.procs.alive(p) for p in pids):
                    time.sleep(0.05)
                if not any(self.procs.alive(p) for p in pids):
                    res["teardown_s"] = time.monotonic() - m_term
            else:
                if exited_at is not None:
                    res["all_exited_s"] = exited_at - m_spawned + spawn_s
                codes = [self.procs.exit_code(p) for p in pids]
                died = [i for i, c in enumerate(codes) if c != 0]
                res["failed_agents"] = len(died)
                res["ok"] = len(stamps) == want and exited_at is not None and not died
            if daemon_pid:
                res["daemon_rss"] = proc_hwm(daemon_pid)
                res["daemon_cpu_s"] = proc_cpu_seconds(daemon_pid)
            self.cleanup_step()
            res["agents_cpu_s"] = children_cpu() - cpu0 - (res.get("daemon_cpu_s") or 0)
            if self.mem_valve:
                res["ok"] = False
                res["note"] = "stopped: MemAvailable fell below %.1f GiB" % self.args.min_free_gib
            elif not res["ok"]:
                bad = died[:1] or [0]
                res["note"] = "workers %d/%d, agents gone before all workers ran: %d; log of #%d: %s" % (
                    len(stamps), want, res["failed_agents"], bad[0],
                    tail(os.path.join(d, "log.%d" % bad[0]), 4).strip().replace("\n", " | ")[-300:])
        finally:
            self.cleanup_step()
            self.step_env(None)
            shutil.rmtree(d, ignore_errors=True)
        return res

    # -- memory per agent

    def measure_memory(self, kind, n=8):
        """Keeps n agents with sleeping workers up; returns per-agent Pss/Rss of the launcher's own
        processes (everything but the worker), threads, and the daemon's."""
        d = self.newdir("mem-%s" % kind)
        self.step_env(d)
        run_id = "mnb-mem-%s-%s" % (kind, uuid.uuid4().hex[:6])
        out = {"kind": kind, "n": n}
        try:
            avail0 = mem_available()
            kern0 = kernel_mem()
            daemon_pid = None
            if kind == "ddprun":
                daemon_pid, port = self.start_daemon(d)
                argv = self.ddprun_agent_argv(n, port, run_id, self.stamp_worker(exit_after=False))
            else:
                argv = self.torchrun_argv(n, free_port(), run_id, self.stamp_worker(exit_after=False))
            _, _, pids = self.spawn_many([argv] * n, d)
            self.wait_exit = False
            stamps, _ = self.await_stamps(d, n, pids, 120 if kind == "torchrun" else 30)
            if len(stamps) < n:
                out["note"] = "only %d/%d workers started" % (len(stamps), n)
                return out
            time.sleep(1.0)  # let the agents settle
            pss = rss = threads = 0
            worker_pss = 0
            procs_per_agent = 0
            for p in self.procs.marked():
                if p == daemon_pid:
                    continue
                m = proc_mem(p)
                if not m:
                    continue
                cmd = proc_cmdline(p)
                if proc_comm(p) in ("sh", "sleep") and "torchrun" not in cmd and "ddprun" not in cmd:
                    worker_pss += m[0]
                    continue
                pss += m[0]
                rss += m[1]
                threads += m[2]
                procs_per_agent += 1
            out["pss_per_agent"] = pss / n
            out["rss_per_agent"] = rss / n
            out["threads_per_agent"] = threads / n
            out["procs_per_agent"] = procs_per_agent / n
            out["worker_pss"] = worker_pss / n
            out["avail_drop_per_agent"] = max(0, avail0 - mem_available()) / n
            out["kernel_per_agent"] = max(0, kernel_mem() - kern0) / n
            if daemon_pid:
                m = proc_mem(daemon_pid)
                out["daemon_rss"] = m[1] if m else None
        finally:
            self.cleanup_step()
            self.step_env(None)
            shutil.rmtree(d, ignore_errors=True)
        return out

    def agent_cpu_probe(self, crowd):
        """CPU of one agent's whole life (ddprun --standalone running /bin/true), with the machine's
        usual processes and with `crowd` more sleeping processes: the agent's cost per process
        present on the host, which N co-located agents multiply."""
        def cpu_of(argv, reps=10):
            c0 = children_cpu()
            m0 = time.monotonic()
            for _ in range(reps):
                subprocess.run(argv, env=self.procs.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=60)
            return (children_cpu() - c0) / reps, (time.monotonic() - m0) / reps

        agent = [self.ddprun, "--standalone", "--nproc_per_node=1", "--no_python", "/bin/true"]
        self.note_cmd("agent CPU probe", agent)
        self.note_cmd("binary load probe", [self.ddprun, "--version"])
        self.note_cmd("binary load probe", [self.multinode, "--version"])
        rows = []
        d = self.newdir("probe")
        self.step_env(d)
        try:
            for extra in (0, crowd):
                if extra:
                    for i in range(extra):
                        self.procs.spawn(["/bin/sleep", "600"], "/dev/null")
                    time.sleep(0.5)
                nprocs = len([x for x in os.listdir("/proc") if x.isdigit()])
                ver = cpu_of([self.ddprun, "--version"])[0]
                ver_mn = cpu_of([self.multinode, "--version"])[0]
                cpu, wall = cpu_of(agent)
                rows.append((nprocs, ver, ver_mn, cpu, wall))
        finally:
            self.cleanup_step()
            self.step_env(None)
            shutil.rmtree(d, ignore_errors=True)
        return rows

    def bench_rdzv(self):
        a = self.args
        self.report.append("## 1. Rendezvous at scale\n")
        log("memory per agent (N=8, workers kept alive)")
        mems = {"ddprun": self.measure_memory("ddprun")}
        if os.path.exists(TORCHRUN) and a.torch_sizes:
            mems["torchrun"] = self.measure_memory("torchrun")
        # The fit check: the larger of Pss and the drop of MemAvailable, per agent (+ its worker).
        budget = min(a.mem_budget_gib * GIB, mem_available() - 3 * GIB)
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
        pids_free = pid_max - len([d for d in os.listdir("/proc") if d.isdigit()])

        def per_agent(kind):
            # PSS of the agent's processes and its worker, plus their kernel stacks and page
            # tables, with 25% to spare. (MemAvailable's drop is shown too, but other work on the
            # machine moves it by more than 8 agents do.)
            m = mems.get(kind, {})
            return 1.25 * (m.get("pss_per_agent", 0) + m.get("worker_pss", 0) + m.get("kernel_per_agent", 0))

        def fits(kind, n):
            m = mems.get(kind, {})
            need = per_agent(kind) * n
            tasks = (m.get("threads_per_agent", 10) + 2) * n
            if need > budget:
                return "needs ~%.1f GiB (%.1f MiB/agent x %d) > budget %.1f GiB" % (
                    need / GIB, per_agent(kind) / MIB, n, budget / GIB)
            if tasks > 0.8 * pids_free:
                return "needs ~%d threads/pids > 80%% of the %d free pids (kernel.pid_max)" % (tasks, pids_free)
            return None

        self.report.append("Memory per agent, N=8 agents with sleeping workers (PSS/RSS summed over the "
                           "launcher's own processes per node: agent, watchdog, torchrun's workers' "
                           "parents; the worker itself is separate):\n")
        self.report.append("| launcher | PSS/agent MiB | RSS/agent MiB | kernel stacks+page tables/agent MiB | "
                           "MemAvailable drop/agent MiB | processes/agent | threads/agent | worker PSS MiB | daemon RSS MiB |")
        self.report.append("|---|---|---|---|---|---|---|---|---|")
        for k, m in mems.items():
            self.report.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                k, fmt_mib(m.get("pss_per_agent")), fmt_mib(m.get("rss_per_agent")),
                fmt_mib(m.get("kernel_per_agent")), fmt_mib(m.get("avail_drop_per_agent")),
                "%.1f" % m["procs_per_agent"] if "procs_per_agent" in m else "-",
                "%.1f" % m["threads_per_agent"] if "threads_per_agent" in m else "-",
                fmt_mib(m.get("worker_pss")), fmt_mib(m.get("daemon_rss")) if k == "ddprun" else "(in agent 0)"))
            if m.get("note"):
                self.report.append("\n%s: %s" % (k, m["note"]))
        self.report.append("\nFit check: 1.25 x (PSS + worker PSS + kernel) per agent = %s MiB (ddprun), %s MiB "
                           "(torchrun), against a budget of %.1f GiB (min of --mem-budget-gib %.0f and "
                           "MemAvailable - 3 GiB); %d free pids. Each step also stops itself if "
                           "MemAvailable falls below %.1f GiB.\n" % (
                               fmt_mib(per_agent("ddprun")), fmt_mib(per_agent("torchrun")) if "torchrun" in mems else "-",
                               budget / GIB, a.mem_budget_gib, pids_free, a.min_free_gib))

        log("agent CPU probe")
        probe = self.agent_cpu_probe(a.crowd)
        self.report.append("CPU of one agent's whole life (`ddprun --standalone --nproc_per_node=1 --no_python "
                           "/bin/true`, mean of 10, agent + watchdog + worker) against the number of "
                           "processes on the host (extra ones are sleeping `sleep` processes):\n")
        self.report.append("| processes on the host | `ddprun --version` CPU ms | `ddprun-multinode --version` CPU ms "
                           "| one agent's life CPU ms | wall ms |")
        self.report.append("|---|---|---|---|---|")
        for nprocs, ver, ver_mn, cpu, wall in probe:
            self.report.append("| %d | %.1f | %.1f | %.1f | %.0f |" % (nprocs, ver * 1000, ver_mn * 1000, cpu * 1000,
                                                                      wall * 1000))
        self.report.append("")
        self.probe = probe

        rows = []
        skipped = []
        for n in a.sizes:
            why = fits("ddprun", n)
            if why:
                skipped.append("ddprun N=%d skipped: %s" % (n, why))
                log(skipped[-1])
                continue
            for kind in [k for k in ("sh", "version", "standalone", "ddprun") if k in a.kinds]:
                log("rdzv %s N=%d (load %s)" % (kind, n, loadavg()))
                r = self.run_rdzv_case(kind, n, timeout=max(a.step_timeout, 0.3 * n))
                r["load"] = loadavg()
                rows.append(r)
                log("  -> %s" % json.dumps({k: v for k, v in r.items() if k not in ("note",)}))
                if r.get("note"):
                    log("  note: " + r["note"])
            if rows and rows[-1]["kind"] == "ddprun" and not rows[-1]["ok"] and not self.mem_valve:
                # Is it the 2.5 s gRPC keepalive (heartbeat_timeout / 2) under CPU starvation?
                log("rdzv ddprun N=%d again with heartbeat_timeout=60 (load %s)" % (n, loadavg()))
                r = self.run_rdzv_case("ddprun_hb", n, timeout=max(a.step_timeout, 0.3 * n))
                r["load"] = loadavg()
                rows.append(r)
                log("  -> %s" % json.dumps(r))
        for n in a.torch_sizes:
            why = fits("torchrun", n)
            if why:
                skipped.append("torchrun N=%d skipped: %s" % (n, why))
                continue
            log("rdzv torchrun N=%d (load %s)" % (n, loadavg()))
            r = self.run_rdzv_case("torchrun", n, timeout=max(a.step_timeout, 60 + 10 * n))
            r["load"] = loadavg()
            rows.append(r)
            log("  -> %s" % json.dumps({k: v for k, v in r.items() if k not in ("note",)}))

        self.report.append("Time from spawning the first agent (t0: the mtime of a file written just before "
                           "the tight posix_spawn loop) to every worker running (each worker writes a "
                           "file; its mtime is the time; same kernel clock as t0). Launcher workers then "
                           "hold (sleep), as training workers would, so the start is timed without early "
                           "exits in the way; then every agent gets SIGTERM and `teardown` is the time "
                           "until all have exited. The sh and `ddprun-multinode --version` floors just exit "
                           "(`all exited`); a multi-node agent is ddprun, which execs ddprun-multinode. "
                           "`spawn loop`: how long the loop took to spawn all N. CPU: user+system seconds "
                           "of all agents with their watchdogs and workers, until all workers ran / in "
                           "total with the teardown; with 2 cores, CPU/2 is a floor for wall time. "
                           "`steady`: CPU milliseconds per second over %.0f s once every worker runs "
                           "(agents only heartbeat), of all agents / of the daemon.\n" % self.args.steady_seconds)
        self.report.append("| N | what | ok | spawn loop s | first worker s | **all workers s** | all exited s | "
                           "teardown s | CPU agents until up / total s | CPU daemon up / total s | steady CPU ms/s "
                           "agents / daemon | daemon peak RSS MiB | peak MemAvailable drop MiB | load |")
        self.report.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        names = {"sh": "floor: N bare sh workers", "version": "floor: N `ddprun-multinode --version` (exit)",
                 "standalone": "floor: N `ddprun --standalone`",
                 "ddprun": "**ddprun + ddprun-rdzv**", "ddprun_hb": "ddprun, `heartbeat_timeout=60`",
                 "torchrun": "torchrun c10d"}
        for r in sorted(rows, key=lambda r: (r["n"], ["sh", "version", "standalone", "ddprun", "ddprun_hb", "torchrun"].index(r["kind"]))):
            self.report.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["n"], names[r["kind"]], "yes" if r["ok"] else "**no**", fmt_s(r.get("spawn_loop_s")),
                fmt_s(r.get("first_worker_s")), fmt_s(r.get("all_workers_s")), fmt_s(r.get("all_exited_s")),
                fmt_s(r.get("teardown_s")),
                "%s / %s" % (fmt_s(r.get("agents_cpu_up_s")), fmt_s(r.get("agents_cpu_s"))) if "agents_cpu_up_s" in r
                else fmt_s(r.get("agents_cpu_s")),
                "%s / %s" % (fmt_s(r.get("daemon_cpu_up_s")), fmt_s(r.get("daemon_cpu_s"))) if "daemon_cpu_s" in r else "-",
                "%.0f / %s" % (r["steady_agents_ms"], "%.1f" % r["steady_daemon_ms"] if "steady_daemon_ms" in r else "-")
                if "steady_agents_ms" in r else "-",
                fmt_mib(r.get("daemon_rss")) if r["kind"].startswith("ddprun") else "-", fmt_mib(r.get("peak_mem_drop")),
                r.get("load", "")))
        for r in rows:
            if r.get("note"):
                self.report.append("\n- %s N=%d: %s" % (r["kind"], r["n"], r["note"]))
        for s in skipped:
            self.report.append("\n- " + s)
        # Ratios ddprun vs torchrun at common sizes, and the 1024 target.
        by = {(r["kind"], r["n"]): r for r in rows}
        ratios = []
        for n in a.torch_sizes:
            dd, tr = by.get(("ddprun", n)), by.get(("torchrun", n))
            if dd and tr and dd.get("all_workers_s") and tr.get("all_workers_s"):
                ratios.append("N=%d: torchrun/ddprun = %.1fx" % (n, tr["all_workers_s"] / dd["all_workers_s"]))
        if ratios:
            self.report.append("\nRatios (all workers running): " + "; ".join(ratios) + ".")
        big = max([r["n"] for r in rows if r["kind"] == "ddprun"] or [0])
        r = by.get(("ddprun", big))
        if r:
            t = r.get("all_workers_s")
            met = bool(r["ok"] and t is not None and t < 2.0)
            hb = by.get(("ddprun_hb", big))
            self.verdicts.append("Rendezvous: %d agents -> all workers running in %s s%s (target: 1024 in < 2 s): %s%s" % (
                big, fmt_s(t) if r["ok"] else "- (failed: %s)" % (r.get("note", "")[:160]),
                "; with heartbeat_timeout=60: %s s" % fmt_s(hb.get("all_workers_s")) if hb else "",
                "met" if met and big >= 1024 else "NOT met",
                "" if big >= 1024 else " (largest N run: %d)" % big))
        self.report.append("")

    # -- failure propagation

    def node_worker(self, peer_aware):
        # Stamps n<node>.<pid> with "round group_world_size restart_count"; a peer-aware worker
        # also publishes its pid under its round's key and exits 1 as soon as a peer of the same
        # round is gone, as a collective would fail.
        key = '${GROUP_WORLD_SIZE}_${TORCHELASTIC_RESTART_COUNT}_${DDPRUN_ROUND:-x}'
        s = ('read p _ < /proc/self/stat; '
             'echo "${DDPRUN_ROUND:-x} $GROUP_WORLD_SIZE $TORCHELASTIC_RESTART_COUNT" > "$MNB_DIR/n$MNB_NODE.$p"; ')
        if not peer_aware:
            return s + "exec sleep 300"
        return s + ('k=%s; echo $p > "$MNB_DIR/live.$k.$MNB_NODE"; '
                    'while sleep 0.1; do for f in "$MNB_DIR"/live.$k.*; do '
                    'read p < "$f" && kill -0 "$p" 2>/dev/null || exit 1; done; done' % key)

    def run_failure_case(self, kind, variant, bound):
        d = self.newdir("fail-%s-%s" % (kind, variant))
        self.step_env(d)
        run_id = "mnb-fail-%s-%s" % (kind, uuid.uuid4().hex[:6])
        res = {"kind": kind, "variant": variant, "ok": False}
        script = self.node_worker(variant == "node")
        try:
            extra = ["--max_restarts=3"]
            if kind == "ddprun":
                _, port = self.start_daemon(d)
                argv = self.ddprun_agent_argv("2:3", port, run_id, script, extra)
            else:
                port = free_port()
                argv = self.torchrun_argv("2:3", port, run_id, script, extra)
            shown = (self.ddprun_agent_argv if kind == "ddprun" else self.torchrun_argv)("2:3", "PORT", "RUN_ID", script, extra)
            self.note_cmd("%s failure (%s), env MNB_NODE=0|1|2" % (kind, variant), shown)
            envs = [{"MNB_NODE": str(i)} for i in range(3)]
            if kind == "torchrun":
                # torchrun's store lives in whichever agent binds the port first, and dies with it;
                # node 0 is started first and made the host, so that the victim (node 2) is not.
                _, _, pids = self.spawn_many([argv], d, envs=envs[:1])
                wait_for(lambda: _port_open(port), 120, interval=0.05, what="torchrun's store on node 0")
                _, _, more = self.spawn_many([argv] * 2, d, envs=envs[1:], first=1)
                pids += more
            else:
                _, _, pids = self.spawn_many([argv] * 3, d, envs=envs)

            def files():
                # Reap first: the killed node's processes come back to the driver (a subreaper),
                # and a zombie would still pass the peers' `kill -0`.
                self.procs.reap()
                out = []
                for e in os.scandir(d):
                    if e.name.startswith("n") and "." in e.name and e.name[1:].split(".")[0].isdigit():
                        node, pid = e.name[1:].split(".", 1)
                        try:
                            out.append((int(node), int(pid), e.stat().st_mtime_ns, open(e.path).read().split()))
                        except (OSError, ValueError):
                            pass
                return out

            first = wait_for(lambda: len({f[0] for f in files()}) == 3 and files(), 120 if kind == "torchrun" else 30,
                             interval=0.05, what="3 workers in the first round")
            time.sleep(1.0)  # a settled round
            victim = 0 if variant == "host" else 2  # "host": torchrun's store host, node 0
            survivors = [i for i in range(3) if i != victim]
            victim_worker = [f[1] for f in files() if f[0] == victim]
            if variant == "node":
                # Only processes that carry our mark: never a pid that was reused meanwhile.
                ours = set(self.procs.marked())
                targets = [pids[victim]] + [p for p in self.procs.descendants(pids[victim]) if p in ours]
            else:
                targets = [pids[victim]]
            kill_path = os.path.join(d, "kill")  # its mtime: the stamps' clock
            with open(kill_path, "w") as f:
                f.write("kill")
            t_kill = os.stat(kill_path).st_mtime_ns
            for p in targets:
                self.procs.kill(p, signal.SIGKILL)
            res["first_round"] = next((f[3][0] for f in first if f[3]), "?")

            gone = {}

            def survivors_restarted():
                new = {}
                for node, pid, mt, content in files():
                    if node != victim and mt > t_kill:
                        new.setdefault(node, (mt, content))
                for i in survivors:
                    if i not in gone and not self.procs.alive(pids[i]):
                        gone[i] = (time.time_ns() - t_kill) / 1e9
                if len(new) == 2:
                    return new
                if len(gone) == 2:
                    return "gone"
                return None

            try:
                new = wait_for(survivors_restarted, bound, interval=0.02, what="survivors' next round")
                if new == "gone":
                    res["latency_s"] = None
                    res["note"] = "no new round: both survivors' agents exited (codes %s) %.1f s after the kill" % (
                        ", ".join(str(self.procs.exit_code(pids[i])) for i in survivors), max(gone.values()))
                else:
                    res["latency_s"] = (max(v[0] for v in new.values()) - t_kill) / 1e9
                    res["next_round"] = " / ".join(
                        "round %s, world %s, restarts %s" % tuple(v[1][:3]) for v in list(new.values())[:1])
                    res["ok"] = True
            except StepTimeout:
                res["latency_s"] = None
                res["note"] = "no new round within %d s%s" % (bound, "; the survivors' workers of the first round "
                                                              "kept running" if variant == "agent" else "")
            # Did the killed agent's worker outlive it? (variant agent only: nobody killed it)
            if variant in ("agent", "host"):
                time.sleep(0.5)
                self.procs.reap()  # an orphan killed by the watchdog comes back to us as a zombie
                res["orphan_worker"] = any(proc_state(p) not in (None, "Z") for p in victim_worker)
            res["survivor_agents_alive"] = sum(1 for i in survivors if self.procs.alive(pids[i]))
        finally:
            self.cleanup_step()
            self.step_env(None)
            shutil.rmtree(d, ignore_errors=True)
        return res

    def bench_failure(self):
        a = self.args
        self.report.append("## 2. Failure propagation\n")
        self.report.append("3 agents, `--nnodes=2:3 --max_restarts=3`, one trivial worker each. Once the round "
                           "has run 1 s, node 2 is killed with SIGKILL; the time is from the kill to both "
                           "survivors' workers running again (their stamp files' mtimes). "
                           "`agent`: only the agent process is killed, workers just sleep. "
                           "`node`: the agent and every descendant are killed at once (a host dies), and "
                           "each worker polls its round's peers every 0.1 s and exits 1 when one is gone, "
                           "as a collective would fail (so up to ~0.1 s of the figure is that polling). "
                           "torchrun's store lives in one agent (node 0, started first so that it wins the "
                           "port); `agent` and `node` kill node 2. `host` (torchrun only) kills node 0's "
                           "agent, the one holding the store. ddprun's store and rendezvous live in "
                           "ddprun-rdzv, which no node failure takes down.\n")
        rows = []
        for kind in ("ddprun", "torchrun"):
            if kind == "torchrun" and not os.path.exists(TORCHRUN):
                continue
            for variant in ("agent", "node") + (("host",) if kind == "torchrun" else ()):
                reps = a.fail_reps if kind == "ddprun" else a.torch_fail_reps
                bound = a.ddprun_fail_bound if kind == "ddprun" else a.torch_fail_bound
                for i in range(reps):
                    log("failure %s/%s rep %d (load %s)" % (kind, variant, i + 1, loadavg()))
                    try:
                        r = self.run_failure_case(kind, variant, bound)
                    except StepTimeout as e:
                        r = {"kind": kind, "variant": variant, "ok": False, "latency_s": None, "note": str(e)}
                    r["load"] = loadavg()
                    log("  -> %s" % json.dumps(r))
                    rows.append(r)
        self.report.append("| launcher | variant | reps | kill -> survivors running, s (each) | median s | "
                           "next round | killed agent's worker left running | load |")
        self.report.append("|---|---|---|---|---|---|---|---|")
        for kind in ("ddprun", "torchrun"):
            for variant in ("agent", "node", "host"):
                rs = [r for r in rows if r["kind"] == kind and r["variant"] == variant]
                if not rs:
                    continue
                each = ", ".join(fmt_s(r.get("latency_s")) if r.get("latency_s") is not None
                                 else "none (see below)" for r in rs)
                orphan = "-" if variant == "node" else ("yes" if any(r.get("orphan_worker") for r in rs) else "no")
                self.report.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                    "**ddprun**" if kind == "ddprun" else "torchrun c10d", variant, len(rs), each,
                    fmt_s(median([r.get("latency_s") for r in rs])),
                    next((r["next_round"] for r in rs if r.get("next_round")), "-"), orphan, rs[-1]["load"]))
        for r in rows:
            if r.get("note"):
                self.report.append("\n- %s/%s: %s" % (r["kind"], r["variant"], r["note"]))
        dd = [r.get("latency_s") for r in rows if r["kind"] == "ddprun" and r["variant"] == "agent"]
        if dd:
            ok = all(x is not None and x < 1.0 for x in dd)
            worst = None if any(x is None for x in dd) else max(dd)
            self.verdicts.append("Failure propagation (kill -9 of an agent, default settings): ddprun median %s s, "
                                 "worst %s s (target < 1 s): %s" % (fmt_s(median(dd)), fmt_s(worst) if worst is not None
                                                                    else "none", "met" if ok else "NOT met"))
        self.report.append("")

    # -- store

    def bench_store(self):
        a = self.args
        self.report.append("## 3. Store operations per second\n")
        have_dd = os.path.exists(self.store_bench)
        have_tcp = os.path.exists(self.tcpstore_bench)
        if not have_dd:
            self.report.append("ddprun-store-bench not built (DDPRUN_BUILD_BENCH=OFF); skipped.\n")
            return
        d = self.newdir("store")
        self.step_env(d)
        results, boot_results = [], []
        tcp_pid = tport = None
        try:
            daemon_pid, port = self.start_daemon(d)
            run_id = "mnb-store-%s" % uuid.uuid4().hex[:6]
            script = ('echo "$DDPRUN_ROUND $TORCHELASTIC_RUN_ID $DDPRUN_STORE_ADDR" > "$MNB_DIR/info.tmp" && '
                      'mv "$MNB_DIR/info.tmp" "$MNB_DIR/info"; exec sleep 3600')
            argv = self.ddprun_agent_argv(1, port, run_id, script)
            self.note_cmd("store job", self.ddprun_agent_argv(1, "PORT", "RUN_ID", script))
            self.procs.spawn(argv, os.path.join(d, "agent.log"))
            info = os.path.join(d, "info")
            wait_for(lambda: os.path.exists(info), 30, what="the store job's worker")
            rnd, rid, addr = open(info).read().split()
            if have_tcp:
                tport = free_port()
                targv = [self.tcpstore_bench, "--serve", str(tport)]
                self.note_cmd("tcpstore server", [self.tcpstore_bench, "--serve", "PORT"])
                tlog = os.path.join(d, "tcpstore.log")
                tcp_pid = self.procs.spawn(targv, tlog)
                wait_for(lambda: "listening" in tail(tlog, 3), 30, what="the TCPStore server")
            def run_one(backend, op, c, tag):
                if backend == "ddprun":
                    cmd = [self.store_bench, "--port", str(port), "--run_id", rid, "--round", rnd]
                    shown = [self.store_bench, "--port", "PORT", "--run_id", "RUN_ID", "--round", "ROUND"]
                else:
                    cmd = [self.tcpstore_bench, "--port", str(tport)]
                    shown = [self.tcpstore_bench, "--port", "PORT"]
                tail_args = ["--clients", str(c), "--seconds", str(a.store_seconds), "--tag", tag, "--ops", op]
                if op == "bootstrap":
                    self.note_cmd("store bootstrap %s (C = %s)" % (backend, ",".join(map(str, a.store_bootstrap_clients))),
                                  shown + ["--clients", "C", "--tag", "TAG", "--ops", "bootstrap"])
                else:
                    self.note_cmd("store %s (C = 1, 8, 64; OP = set, get, add, compare_set)" % backend,
                                  shown + ["--clients", "C", "--seconds", str(a.store_seconds),
                                           "--tag", "TAG", "--ops", "OP"])
                server = daemon_pid if backend == "ddprun" else tcp_pid
                s0, c0 = proc_cpu_seconds(server), children_cpu()
                out = subprocess.run(cmd + tail_args, env=self.procs.env, capture_output=True,
                                     text=True, timeout=60 + 4 * a.store_seconds)
                s1, c1 = proc_cpu_seconds(server), children_cpu()
                for line in out.stdout.splitlines():
                    if line.startswith("{"):
                        j = json.loads(line)
                        j["load"] = loadavg()
                        if j["ops"] and s0 is not None and s1 is not None:
                            # CPU per op; includes connecting and setup, a small share.
                            j["server_us"] = (s1 - s0) / j["ops"] * 1e6
                            j["client_us"] = (c1 - c0) / j["ops"] * 1e6
                        (boot_results if op == "bootstrap" else results).append(j)
                        log("  %s" % line)
                if out.returncode != 0:
                    log("  rc %d: %s" % (out.returncode, out.stderr[-500:]))

            backends = ("ddprun", "tcpstore") if have_tcp else ("ddprun",)
            # Interleaved (rep, clients, op, backend) so that drift in the machine's load hits both.
            for rep in range(a.store_reps):
                for c in a.store_clients:
                    log("store reps %d/%d clients=%d (load %s)" % (rep + 1, a.store_reps, c, loadavg()))
                    for op in ("set", "get", "add", "compare_set"):
                        for backend in backends:
                            run_one(backend, op, c, "r%dc%d" % (rep, c))
            for rep in range(a.store_bootstrap_reps):
                for c in a.store_bootstrap_clients:
                    log("store bootstrap %d/%d ranks=%d (load %s)" % (rep + 1, a.store_bootstrap_reps, c, loadavg()))
                    # Alternate which backend goes first.
                    for backend in (backends if rep % 2 == 0 else tuple(reversed(backends))):
                        run_one(backend, "bootstrap", c, "b%dc%d" % (rep, c))
        finally:
            self.cleanup_step()
            self.step_env(None)
            shutil.rmtree(d, ignore_errors=True)

        self.report.append("Each client is its own process with its own connection (as each worker of a job "
                           "has), on its own key; all start together and run for %.1f s; median of %d runs "
                           "(range in brackets), ddprun and TCPStore runs interleaved. ddprun: "
                           "StoreClient (one connection per client, in the store's own framing unless DDPRUN_STORE_TRANSPORT=grpc "
                           "asks for the gRPC Session stream: %s) -> ddprun-rdzv, in the current round of a "
                           "running 1-node job. TCPStore: c10d::TCPStore client (libtorch %s) -> a "
                           "TCPStore server in its own process. Same C++ loop (bench/store_bench.cc) for "
                           "both; 32-byte values. p50/p99 are per-call latencies (log-bucketed, +-5%%). "
                           "Protocol differences: TCPStore's set is one-way (the client writes the request "
                           "and returns; no reply), so its set rate is how fast a client fills its socket; "
                           "its get is two round trips (WAIT, then GET). Every ddprun call is one request and "
                           "one response on the client's stream. CPU us/op: the server's CPU and all clients' CPU over the "
                           "run, divided by the operations.\n"
                           % (a.store_seconds, a.store_reps,
                              "the Session stream" if os.environ.get("DDPRUN_STORE_TRANSPORT") == "grpc"
                              else "the store's own framing in this run",
                              torch_version() or "?"))
        self.report.append("| op | clients | ddprun ops/s | TCPStore ops/s | ddprun/TCPStore | ddprun p50/p99 us | "
                           "TCPStore p50/p99 us | CPU us/op server+clients, ddprun | same, TCPStore | errors |")
        self.report.append("|---|---|---|---|---|---|---|---|---|---|")
        # Per (backend, op, clients): the repetition with the median rate.
        groups = {}
        for r in results:
            groups.setdefault((r["backend"], r["op"], r["clients"]), []).append(r)
        by = {}
        for k, rs in groups.items():
            rs = sorted(rs, key=lambda r: r["ops_per_s"])
            by[k] = dict(rs[len(rs) // 2])
            by[k]["errors"] = sum(r["errors"] for r in rs)
            by[k]["error"] = next((r["error"] for r in rs if r["error"]), "")
            by[k]["range"] = (rs[0]["ops_per_s"], rs[-1]["ops_per_s"])
        slower = []
        for op in ("set", "get", "add", "compare_set"):
            for c in a.store_clients:
                dd, tc = by.get(("ddprun", op, c)), by.get(("tcpstore", op, c))
                ratio = (dd["ops_per_s"] / tc["ops_per_s"]) if dd and tc and tc["ops_per_s"] else None
                if ratio is not None and ratio < 1.0:
                    slower.append("%s@%d (%.2fx)" % (op, c, ratio))
                errs = ", ".join("%s: %d %s" % (r["backend"], r["errors"], r["error"][:80])
                                 for r in (dd, tc) if r and (r["errors"] or r["error"])) or "0"
                self.report.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    op, c, _rate(dd), _rate(tc),
                    "%.2fx" % ratio if ratio is not None else "-",
                    "%.0f / %.0f" % (dd["p50_us"], dd["p99_us"]) if dd else "-",
                    "%.0f / %.0f" % (tc["p50_us"], tc["p99_us"]) if tc else "-", _cpu(dd), _cpu(tc), errs))
        if results:
            self.verdicts.append("Store at least as fast as TCPStore at every client count: %s" % (
                "met" if not slower and have_tcp else ("NOT met: slower at " + ", ".join(slower) if slower else "not compared")))
        self.report.append("")
        if boot_results:
            self.report_bootstrap(boot_results, have_tcp)

    def report_bootstrap(self, boot_results, have_tcp):
        a = self.args
        self.report.append("### Store bootstrap of a job's ranks\n")
        self.report.append("What a starting job does with its store, once: C ranks (processes) start together; "
                           "each connects, sets its 64-byte address, gets every peer's address (a get that "
                           "waits for the key: C x (C - 1) gets in all, as gloo's full-mesh connect), then "
                           "meets the others at a barrier (add; the last to arrive sets `done`; every rank "
                           "gets it). Time: from the common start to the last rank through the barrier; "
                           "median of %d runs (range), backends alternating which goes first. Same servers "
                           "as above; `ddprun-store-bench --ops bootstrap` / `tcpstore-bench --ops bootstrap`.\n"
                           % a.store_bootstrap_reps)
        self.report.append("| ranks | store calls | ddprun s | TCPStore s | TCPStore/ddprun time | ddprun p50/p99 us | "
                           "TCPStore p50/p99 us | errors |")
        self.report.append("|---|---|---|---|---|---|---|---|")
        groups = {}
        for r in boot_results:
            groups.setdefault((r["backend"], r["clients"]), []).append(r)
        slower = []
        for c in a.store_bootstrap_clients:
            row = {}
            for backend in ("ddprun", "tcpstore"):
                rs = [r for r in groups.get((backend, c), []) if r["seconds"] > 0 and not r["error"]]
                if rs:
                    rs.sort(key=lambda r: r["seconds"])
                    row[backend] = (rs[len(rs) // 2], rs[0]["seconds"], rs[-1]["seconds"])
            errs = ", ".join("%s: %s" % (r["backend"], r["error"][:80])
                             for r in groups.get(("ddprun", c), []) + groups.get(("tcpstore", c), [])
                             if r["error"]) or "0"
            dd, tc = row.get("ddprun"), row.get("tcpstore")
            ratio = tc[0]["seconds"] / dd[0]["seconds"] if dd and tc else None
            if ratio is not None and ratio < 1.0:
                slower.append("%d ranks (%.2fx)" % (c, ratio))
            cell = lambda x: "%.3f [%.3f-%.3f]" % (x[0]["seconds"], x[1], x[2]) if x else "-"
            lat = lambda x: "%.0f / %.0f" % (x[0]["p50_us"], x[0]["p99_us"]) if x else "-"
            calls = (dd or tc)[0]["ops"] if (dd or tc) else 0
            self.report.append("| %d | %d | %s | %s | %s | %s | %s | %s |" % (
                c, calls, cell(dd), cell(tc), "%.2fx" % ratio if ratio is not None else "-", lat(dd), lat(tc), errs))
        self.verdicts.append("Store bootstrap of a job's ranks at least as fast as with TCPStore: %s" % (
            "met" if not slower and have_tcp else ("NOT met: slower at " + ", ".join(slower) if slower else "not compared")))
        self.report.append("")

    # -- report

    def header(self):
        h = ["# Multi-node benchmarks (bench/multinode_bench.py)\n"]
        h.append("- Date: %s" % datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))
        cpu = "?"
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
        h.append("- Machine: %s, %d cores (%s), %.1f GiB RAM, kernel %s" % (
            platform.node(), os.cpu_count(), cpu, mem / GIB, platform.release()))
        h.append("- Load average at start: %s (the cores are shared with other work; see the load column)" % loadavg())
        ver = subprocess.run([self.ddprun, "--version"], capture_output=True, text=True).stdout.strip()
        h.append("- ddprun: %s (%s, build dir %s); gRPC %s" % (ver, git_rev(), self.args.build_dir, dpkg_version("libgrpc++1.51") or "?"))
        h.append("- torchrun: %s (PyTorch %s, /usr/bin/python3 %s)" % (TORCHRUN, torch_version() or "?", platform.python_version()))
        h.append("- Mode: %s; command: `%s`\n" % ("--smoke" if self.args.smoke else "--quick" if self.args.quick else "full",
                                                 " ".join(sys.argv)))
        return h

    def render(self):
        lines = self.header()
        if self.verdicts:
            lines.append("## Targets\n")
            lines += ["- " + v for v in self.verdicts]
            lines.append("")
        lines += self.report
        lines.append("## Exact commands\n")
        lines.append("Agents are started with os.posix_spawn in a tight loop, each with stdout/stderr to "
                     "its own file; MNB_DIR and TMPDIR are the step's fresh temporary directory.\n")
        lines.append("```")
        for label, cmd in self.commands:
            lines.append("# %s\n%s" % (label, cmd))
        lines.append("```")
        return "\n".join(lines) + "\n"

    def close(self):
        self.procs.kill_all()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _cpu(r):
    if not r or r.get("server_us") is None:
        return "-"
    return "%.0f + %.0f" % (r["server_us"], r["client_us"])


def _rate(r):
    if not r:
        return "-"
    lo, hi = r.get("range", (r["ops_per_s"], r["ops_per_s"]))
    return "%.0f [%.0f-%.0f]" % (r["ops_per_s"], lo, hi) if lo != hi else "%.0f" % r["ops_per_s"]


def _q(s):
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def git_rev():
    try:
        return "git " + subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip() + " + working tree"
    except (OSError, subprocess.SubprocessError):
        return "git ?"


def dpkg_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


_TORCH = []


def torch_version():
    if not _TORCH:
        try:
            _TORCH.append(subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                                         capture_output=True, text=True, timeout=60).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            _TORCH.append("")
    return _TORCH[0]


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
        if "rdzv" in only:
            bench.bench_rdzv()
        if "failure" in only:
            bench.bench_failure()
        if "store" in only:
            bench.bench_store()
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
