"""Process hygiene of the multi-node bench: every process the driver starts, found and killed
again wherever it was reparented."""
import ctypes
import os
import signal
import time
import uuid

import benchlib


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
