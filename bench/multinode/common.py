"""What the multi-node bench's cases share: constants, /proc readers, waiting, formatting, and
the versions the report's header names."""
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/
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


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


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

def shell_quote(s):
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
