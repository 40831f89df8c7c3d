#!/usr/bin/env python3
"""A real one-node Slurm cluster under a temporary folder, for tests (DESIGN.md section 5).

    with SlurmCluster() as cluster:          # munged, slurmctld, slurmd; ready in about a second
        subprocess.run(["srun", "-N1", "hostname"], env=cluster.env())

Debian's munge, slurmctld, slurmd and slurm-client, run as root (SlurmUser=root) with everything
under one temporary folder: slurm.conf (SLURM_CONF), a munge key and socket of its own
(AuthInfo=socket=...), state, spool and logs; ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
no accounting; free loopback ports for SlurmctldPort and SlurmdPort. stop() (or leaving the
`with`) ends every process of this cluster, the daemons and any slurmstepd they left, found by the
SLURM_CONF path that only this cluster's processes carry, and removes the folder.

`python3 scripts/slurm_cluster.py` starts one, prints the SLURM_CONF to export, and stops it on
Ctrl-C.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ports  # noqa: E402

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "sinfo", "scontrol")
READY_TIMEOUT_S = 30  # safety bound: a one-node cluster is ready in about a second here


def missing():
    """Why no cluster can start here, or None."""
    absent = [name for name in DAEMONS + CLIENTS if not shutil.which(name)]
    if absent:
        return "not installed: %s (Debian: apt-get install munge slurmctld slurmd slurm-client)" % " ".join(absent)
    if os.geteuid() != 0:
        return "slurmd must run as root (SlurmUser=root) and this is uid %d" % os.geteuid()
    return None


def _free_port():
    return ports.free_port()  # below the ephemeral range: ports.py says why


def _processes_with(needle):
    """Pids of live processes whose environment holds `needle` (bytes, NAME=VALUE)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            pass
    return pids


class SlurmCluster:
    """`node_name`: the node's Slurm name (default: this host's short name); slurmd runs as it
    (slurmd -N), reached at 127.0.0.1 (NodeAddr), so a name that does not resolve works too.

    Several nodes: `nodes` is [(name, address, prefix)], `controller` is (address, prefix); a
    prefix is the command that puts a daemon on its host (nsenter into a network namespace, say).
    Clients (sinfo here, srun in tests) must then run under the first node's prefix, since only
    the hosts' addresses reach each other."""

    def __init__(self, node_name=None, nodes=None, controller=None):
        self.nodes = nodes or [(node_name or socket.gethostname().split(".")[0], "127.0.0.1", [])]
        self.node_name = self.nodes[0][0]
        self.ctl_addr, self.ctl_prefix = controller or ("127.0.0.1", [])
        self.client_prefix = list(self.nodes[0][2])
        self.dir = None
        self.procs = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def conf(self):
        return os.path.join(self.dir, "slurm.conf")

    def env(self, base=None):
        """`base` (default: this process's environment) without any other job's SLURM_*, with this
        cluster's SLURM_CONF."""
        env = {k: v for k, v in (base if base is not None else os.environ).items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.conf
        return env

    def log(self, name):
        path = os.path.join(self.dir, "log", name)
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def start(self):
        # A port taken between the choice and slurmctld's bind fails the start: choose again.
        for attempt in range(3):
            try:
                return self._start_once()
            except RuntimeError as e:
                if "Address already in use" not in str(e) or attempt == 2:
                    raise

    def _start_once(self):
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        self.dir = tempfile.mkdtemp(prefix="ddprun_slurm_")
        # munged refuses a socket folder others can write; slurmd and srun reach the socket
        # through every folder above it, so all of them must be world-executable.
        os.chmod(self.dir, 0o755)
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o755)
        munge_dir = os.path.join(self.dir, "munge")
        socket_path = os.path.join(munge_dir, "munge.socket.2")
        key = os.path.join(munge_dir, "munge.key")
        subprocess.run(["mungekey", "--create", "--keyfile=" + key], check=True, capture_output=True, timeout=30)
        os.chmod(key, 0o600)
        with open(self.conf, "w") as f:
            f.write(self._config(socket_path))
        try:
            self._spawn("munged", ["munged", "-F", "-f", "--socket=" + socket_path, "--key-file=" + key,
                                   "--log-file=" + os.path.join(self.dir, "log", "munged.log"),
                                   "--pid-file=" + os.path.join(munge_dir, "munged.pid"),
                                   "--seed-file=" + os.path.join(munge_dir, "munged.seed")])
            self._wait_for(lambda: os.path.exists(socket_path), "munged's socket")
            self._spawn("slurmctld", list(self.ctl_prefix) + ["slurmctld", "-D", "-c"])
            for name, _, prefix in self.nodes:
                if len(self.nodes) > 1:
                    os.makedirs(os.path.join(self.dir, "spool", name), mode=0o755)
                self._spawn("slurmd" if len(self.nodes) == 1 else "slurmd." + name,
                            list(prefix) + ["slurmd", "-D", "-N", name])
            self._wait_for(self._node_idle, "node(s) %s idle in sinfo" % ",".join(n for n, _, _ in self.nodes))
        except BaseException:
            self.stop()
            raise

    def _config(self, socket_path):
        d = self.dir
        return "\n".join([
            "ClusterName=ddprun-test",
            # slurmctld runs only where this names the host it is on.
            "SlurmctldHost=%s(%s)" % (socket.gethostname().split(".")[0], self.ctl_addr),
            "SlurmctldPort=%d" % _free_port(),
            "SlurmdPort=%d" % _free_port(),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % socket_path,
            "StateSaveLocation=%s/state" % d,
            # %n: the node's name, so that several slurmd on one machine keep their files apart.
            "SlurmdSpoolDir=%s/spool%s" % (d, "/%n" if len(self.nodes) > 1 else ""),
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd%s.pid" % (d, ".%n" if len(self.nodes) > 1 else ""),
            "SlurmctldLogFile=%s/log/slurmctld.log" % d,
            "SlurmdLogFile=%s/log/slurmd%s.log" % (d, ".%n" if len(self.nodes) > 1 else ""),
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2",
        ] + ["NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN" % (name, addr, os.cpu_count() or 1)
             for name, addr, _ in self.nodes] + [
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _spawn(self, name, argv):
        out = open(os.path.join(self.dir, "log", name + ".out"), "wb")
        try:
            self.procs.append(subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                               stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True))
            self.procs[-1].log_name = name
        finally:
            out.close()

    def _node_idle(self):
        p = subprocess.run(self.client_prefix + ["sinfo", "-h", "-N", "-o", "%T"], env=self.env(),
                           capture_output=True, text=True, timeout=30)
        return p.returncode == 0 and p.stdout.split() == ["idle"] * len(self.nodes)

    def _wait_for(self, ready, what):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError("%s exited with %s before %s:\n%s" % (
                        proc.log_name, proc.returncode, what, self.log(proc.log_name + ".out")[-2000:]))
            if time.monotonic() > deadline:
                raise RuntimeError("no %s after %d s" % (what, READY_TIMEOUT_S))
            time.sleep(0.1)

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs = []
        if self.dir:
            # What slurmd left (slurmstepd, a job's tasks) carries this cluster's SLURM_CONF.
            for pid in _processes_with(("SLURM_CONF=" + self.conf).encode()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            shutil.rmtree(self.dir, True)
            self.dir = None


def main():
    with SlurmCluster() as cluster:
        print("export SLURM_CONF=%s    # Ctrl-C stops the cluster" % cluster.conf, flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    sys.exit(main())
