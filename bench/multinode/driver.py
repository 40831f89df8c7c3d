"""The driver that every case of the multi-node bench runs in: its processes and temporary
folders, the agents' command lines, the spawn loop and the workers' stamps, and the report."""
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

from multinode.common import (GIB, SH, TORCHRUN, dpkg_version, git_rev, loadavg, mem_available, shell_quote, tail,
                              torch_version, wait_for)
from multinode.procs import Procs


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
        line = " ".join(shell_quote(a) for a in argv)
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
