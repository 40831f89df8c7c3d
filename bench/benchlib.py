#!/usr/bin/python3
"""What the bench scripts share: a free port, /proc readers (RSS and CPU of a pid or a process
tree), a ddprun-rdzv daemon's start and stop, the machine's description, markdown tables, and the
smoke-test runner that ctest uses (bench/CMakeLists.txt):

  python3 bench/benchlib.py smoke -- python3 bench/x.py --smoke [args]

runs the command (bounded), passes its output through, and fails unless it exited 0 and its
output parses: every line that starts with "{" is a JSON object, every markdown table has as many
cells in each row as in its header, and there is at least one of either. Exit 77 (SKIPPED) passes
through. Never a speed: a smoke test only proves that the tool still runs against today's ddprun.

Scripts run as `python3 bench/x.py`, so `import benchlib` finds this file next to them. Stdlib only.
"""
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SKIP = 77  # ctest's SKIP_RETURN_CODE for the bench tests


def skip(reason):
    """Ends a script that cannot run here at all (a smoke test then reads as skipped)."""
    print("SKIPPED: %s" % reason, flush=True)
    sys.exit(SKIP)


# ---- ports ----

def free_port(host="127.0.0.1"):
    """A port free on `host` now, picked as the tests pick theirs (scripts/ports.py: above the
    kernel's ephemeral range where it leaves room, and reserved against the other tests and benches
    of this machine for as long as this process lives). The kernel's own pick (bind to port 0) comes
    from the range every outgoing connection draws from: under ctest -j2 a test beside this bench
    can take it before the bench's server binds it, and an agent that then finds its endpoint taken
    joins whatever listens there and waits (a CI run of recovery_lost_node_bench's smoke hung so)."""
    if os.path.join(ROOT, "scripts") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import ports  # scripts/ports.py, stdlib only
    return ports.free_port(host)


# ---- /proc ----

def proc_status(pid):
    """/proc/PID/status as {field: first word} ('VmRSS' -> '1234'), {} when the pid is gone."""
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def rss_kb(pid):
    """VmRSS of one process in KiB; 0 when it is gone (or a zombie, which has no memory lines)."""
    try:
        return int(proc_status(pid).get("VmRSS", "0 kB").split()[0])
    except (ValueError, IndexError):
        return 0


def cpu_s(pid):
    """utime + stime of one process (every thread), in seconds; 0.0 when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def descendants(root):
    """`root` and every living process below it (one pass over /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_rss_kb(root):
    """Sum of VmRSS over `root` and its descendants, in KiB."""
    return sum(rss_kb(p) for p in descendants(root))


def loadavg():
    """The 1-minute load average (0.0 if unreadable)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def raise_nofile():
    """Soft open-file limit up to the hard one (a daemon holds one fd per agent); returns the hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ---- ddprun-rdzv ----

def start_rdzv(rdzv, log_path, extra=(), wrap=(), bound_s=20):
    """Starts `ddprun-rdzv --port 0 EXTRA` (stderr to log_path) and returns (proc, port) once it
    says where it listens. `wrap` goes before it (e.g. prlimit). Raises RuntimeError when it does not
    start within bound_s."""
    argv = list(wrap) + [rdzv, "--port", "0"] + list(extra)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=raise_nofile)
    deadline = time.monotonic() + bound_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "listening on" in line or not line:
            break
    m = re.search(r"listening on (\S+):(\d+)", line)
    if not m:
        stop(proc)
        tail = ""
        try:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-1000:]
        except OSError:
            pass
        raise RuntimeError("ddprun-rdzv did not start: %r %s" % (line, tail))
    return proc, int(m.group(2))


def kill_sessions(procs, bound_s=10):
    """SIGKILLs each process's session (process group: what it started too) and reaps them."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            pass


def stop(proc, bound_s=20):
    """SIGTERM, then SIGKILL after bound_s; returns the exit status."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=10)


# ---- the machine ----

def machine():
    """{nproc, affinity, cpu, mem_gib, kernel, nofile_hard}: what every report states."""
    model = "?"
    mem = 0.0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) / 1024 / 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": model, "mem_gib": mem,
            "kernel": platform.release(), "nofile_hard": resource.getrlimit(resource.RLIMIT_NOFILE)[1]}


def machine_text():
    m = machine()
    return "%d cores (%s), %.1f GiB, kernel %s, open-file hard limit %d" % (
        m["nproc"], m["cpu"], m["mem_gib"], m["kernel"], m["nofile_hard"])


def git_rev():
    """Short HEAD, and whether the tree had uncommitted changes (the tree is shared and often dirty)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


# ---- markdown ----

def md_table(header, rows):
    """Lines of a markdown table; cells are str()-ed, a '|' inside a cell is escaped."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    out = [line(header), "|" + "---|" * len(header)]
    out += [line(r) for r in rows]
    return out


def _cells(line):
    # Split on '|' not escaped; the outer pipes give an empty first and last field.
    parts = re.split(r"(?<!\\)\|", line.strip())
    return parts[1:-1]


def check_output(text):
    """Problems with a tool's output (empty list: it parses), and how many records it holds."""
    problems, records = [], 0
    header = None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("{"):
            try:
                if not isinstance(json.loads(s), dict):
                    problems.append("line %d: JSON but not an object" % n)
                records += 1
            except ValueError as e:
                problems.append("line %d: not JSON (%s): %s" % (n, e, s[:200]))
            header = None
            continue
        if s.startswith("|") and s.endswith("|"):
            cells = _cells(s)
            if header is None:
                header = len(cells)
            elif re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", s):
                if len(cells) != header:
                    problems.append("line %d: separator of %d columns under a header of %d" % (n, len(cells), header))
            elif len(cells) != header:
                problems.append("line %d: %d cells in a table of %d columns: %s" % (n, len(cells), header, s[:200]))
            else:
                records += 1
            continue
        header = None
    return problems, records


def smoke_main(argv):
    """The ctest runner (see the module's doc)."""
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        sys.exit("usage: benchlib.py smoke -- COMMAND...")
    bound = float(os.environ.get("BENCH_SMOKE_BOUND_S", "280"))
    started = time.monotonic()
    print("+ " + " ".join(argv), flush=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        print(out)
        print("FAILED: still running after %.0f s" % bound)
        return 1
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the script left behind
        except (ProcessLookupError, PermissionError):
            pass
    print(out, end="" if out.endswith("\n") else "\n")
    took = time.monotonic() - started
    if proc.returncode == SKIP:
        if "SKIPPED:" not in out:
            print("SKIPPED: (exit 77 without a reason)")
        return SKIP
    if proc.returncode != 0:
        print("FAILED: exit %d after %.1f s" % (proc.returncode, took))
        return 1
    problems, records = check_output(out)
    for p in problems:
        print("FAILED: output: " + p)
    if problems:
        return 1
    if records == 0:
        print("FAILED: no JSON object and no markdown table row in the output")
        return 1
    print("smoke: ok, %d records parsed, %.1f s" % (records, took))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "smoke":
        sys.exit(smoke_main(sys.argv[2:]))
    sys.exit("usage: benchlib.py smoke -- COMMAND...")
