#!/usr/bin/python3
"""A real etcd cluster on loopback for tests (DESIGN.md section 5): N members of Debian's
etcd-server (3.4, v3 API), distinct free client and peer ports, data under a temp dir.

As a library:
    with EtcdCluster(size=3) as cluster:
        cluster.endpoints            # ["127.0.0.1:P0", ...]
        cluster.kill(cluster.leader())   # SIGKILL the leader; cluster.stop(i) / cont(i) for SIGSTOP
As a process (for C++ tests): `etcd_cluster.py serve [--size 3] [--ttl SECONDS]` prints one line
    READY pid=<own pid> endpoints=h:p,h:p,h:p pids=1,2,3 dir=/tmp/...
and holds the cluster until SIGTERM/SIGINT, stdin's end, or --ttl (a safety bound) passes.

Everything it starts is killed by PID and its temp dir removed on exit; members also get
PR_SET_PDEATHSIG, so a fixture killed with SIGKILL leaves no member behind.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ports  # noqa: E402

ETCD = os.environ.get("DDPRUN_ETCD_BIN", "/usr/bin/etcd")
START_BOUND_S = 30.0  # safety bound for a cluster to become healthy; it takes ~1-2 s here


def etcd_available():
    """None when etcd can run here, else the reason (a test reports it as skipped)."""
    if not os.access(ETCD, os.X_OK):
        return f"{ETCD} not found (apt-get install etcd-server; scripts/install_deps.sh)"
    return None


def _free_ports(count):
    # Below the ephemeral range (ports.py says why); another process may still take one before
    # etcd binds it (the start then fails and says so), a race the tests accept.
    return ports.free_ports(count)


def _pdeathsig(sig):
    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def set_it():
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG

    return set_it


def _open(url, data=None, timeout=1.0, certs=None):
    """urlopen, with the cluster's CA and client certificate when it speaks TLS."""
    if certs is None:
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="POST" if data is not None else "GET")
        return urllib.request.urlopen(req, timeout=timeout)
    import ssl
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.load_cert_chain(certs["client_cert"], certs["client_key"])
    req = urllib.request.Request(url.replace("http://", "https://", 1), data=data,
                                 headers={"Content-Type": "application/json"}, method="POST" if data is not None else "GET")
    return urllib.request.urlopen(req, timeout=timeout, context=ctx)


def _post_json(endpoint, path, body, timeout=1.0, certs=None):
    with _open(f"http://{endpoint}{path}", json.dumps(body).encode(), timeout, certs) as r:
        return json.loads(r.read().decode())


def _make_certs(folder):
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate (openssl), for
    tests only. Returns dict(ca=..., server_cert=..., server_key=..., client_cert=..., client_key=...)."""
    p = lambda name: os.path.join(folder, name)  # noqa: E731
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, timeout=60)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ddprun-test-ca",
        "-keyout", p("ca.key"), "-out", p("ca.pem"))
    for who, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth"),
                     ("client", "extendedKeyUsage=clientAuth")):
        with open(p(who + ".ext"), "w") as f:
            f.write(ext)
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=ddprun-test-" + who,
            "-keyout", p(who + ".key"), "-out", p(who + ".csr"))
        run("openssl", "x509", "-req", "-in", p(who + ".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
            "-CAcreateserial", "-days", "2", "-extfile", p(who + ".ext"), "-out", p(who + ".pem"))
    return dict(ca=p("ca.pem"), server_cert=p("server.pem"), server_key=p("server.key"),
                client_cert=p("client.pem"), client_key=p("client.key"))


class EtcdCluster:
    def __init__(self, size=3, base_dir=None, tls=False, enable_v2=False):
        """tls: clients must speak TLS with a client certificate signed by the cluster's own CA
        (self.certs names the files; the peers talk plain HTTP on loopback). enable_v2: also serve
        etcd's v2 API, which torch's own etcd rendezvous speaks (the benchmark's peer)."""
        self.size = size
        self.tls = tls
        self.enable_v2 = enable_v2
        self.certs = None
        self.dir = tempfile.mkdtemp(prefix="ddprun-etcd-", dir=base_dir)
        ports = _free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        self.endpoints = [f"127.0.0.1:{p}" for p in self.client_ports]
        self.procs = [None] * size
        self.stopped = set()
        self._member_ids = [None] * size

    # -- lifecycle --------------------------------------------------------------------------
    def start(self):
        try:
            if self.tls:
                self.certs = _make_certs(self.dir)
            initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.peer_ports))
            token = "ddprun-test-" + os.path.basename(self.dir)
            for i in range(self.size):
                self._start_member(i, initial, token)
            self.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def _start_member(self, i, initial, token):
        c, p = self.client_ports[i], self.peer_ports[i]
        log = open(os.path.join(self.dir, f"m{i}.log"), "wb")
        scheme = "https" if self.tls else "http"
        cmd = [ETCD, "--name", f"m{i}", "--data-dir", os.path.join(self.dir, f"m{i}.data"),
               "--listen-client-urls", f"{scheme}://127.0.0.1:{c}", "--advertise-client-urls", f"{scheme}://127.0.0.1:{c}",
               "--listen-peer-urls", f"http://127.0.0.1:{p}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
               "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", token,
               # Fast elections on loopback (defaults: 100 ms heartbeat, 1 s election).
               "--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.enable_v2:
            cmd += ["--enable-v2=true"]
        if self.tls:
            cmd += ["--cert-file", self.certs["server_cert"], "--key-file", self.certs["server_key"],
                    "--trusted-ca-file", self.certs["ca"], "--client-cert-auth"]
        self.procs[i] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_pdeathsig(signal.SIGKILL))
        log.close()

    def wait_healthy(self, members=None, bound_s=START_BOUND_S):
        """Waits until every live member (or those named) answers /health with true."""
        members = self.alive() if members is None else members
        deadline = time.monotonic() + bound_s
        pending = set(members)
        while pending:
            for i in list(pending):
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"etcd member m{i} exited with {self.procs[i].returncode}: {self.log_tail(i)}")
                try:
                    with _open(f"http://{self.endpoints[i]}/health", timeout=1.0, certs=self.certs) as r:
                        if json.loads(r.read().decode()).get("health") == "true":
                            pending.discard(i)
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"etcd members {sorted(pending)} not healthy within {bound_s}s (safety bound)")
            if pending:
                time.sleep(0.05)

    def close(self):
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            if p.poll() is None:
                p.kill()  # SIGKILL works on a stopped process too
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.procs[i] = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- faults ------------------------------------------------------------------------------
    def alive(self):
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None and i not in self.stopped]

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait(timeout=10)
        self.stopped.discard(i)

    def stop(self, i):
        """SIGSTOP, then waits (bounded) until every thread of the member is stopped: kill() only
        queues the stop, and a thread running on another CPU may still answer a request sent
        right after it."""
        pid = self.procs[i].pid
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(i)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = []
            for task in os.listdir("/proc/%d/task" % pid) if os.path.isdir("/proc/%d/task" % pid) else []:
                try:
                    with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except (OSError, IndexError):
                    pass
            if all(s in ("T", "t") for s in states):
                return
            time.sleep(0.005)

    def cont(self, i):
        os.kill(self.procs[i].pid, signal.SIGCONT)
        self.stopped.discard(i)

    def status(self, i):
        """The v3 Maintenance/Status of member i (JSON gateway): member_id and leader, as ints."""
        s = _post_json(self.endpoints[i], "/v3/maintenance/status", {}, certs=self.certs)
        return int(s["header"]["member_id"]), int(s.get("leader", 0))

    def leader(self, bound_s=START_BOUND_S):
        """Index of the member that leads now, as the live members agree; waits for an election."""
        deadline = time.monotonic() + bound_s
        while True:
            ids, leaders = {}, set()
            for i in self.alive():
                try:
                    mid, lead = self.status(i)
                    ids[mid] = i
                    leaders.add(lead)
                except OSError:
                    pass
            if len(leaders) == 1:
                lead = leaders.pop()
                if lead in ids:
                    return ids[lead]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no agreed etcd leader within {bound_s}s (safety bound)")
            time.sleep(0.05)

    def keys(self, prefix="/"):
        """Every key under prefix (v3 JSON gateway, base64 on the wire), from any live member."""
        import base64
        end = bytearray(prefix.encode())
        end[-1] += 1
        body = {"key": base64.b64encode(prefix.encode()).decode(), "range_end": base64.b64encode(bytes(end)).decode(),
                "keys_only": True}
        for i in self.alive():
            try:
                r = _post_json(self.endpoints[i], "/v3/kv/range", body, timeout=5.0, certs=self.certs)
                return sorted(base64.b64decode(kv["key"]).decode(errors="replace") for kv in r.get("kvs", []))
            except OSError:
                continue
        raise RuntimeError("no etcd member answered a range request")

    def get(self, key):
        """The value of key (str), or None."""
        import base64
        body = {"key": base64.b64encode(key.encode()).decode()}
        for i in self.alive():
            try:
                r = _post_json(self.endpoints[i], "/v3/kv/range", body, timeout=5.0, certs=self.certs)
                kvs = r.get("kvs", [])
                return base64.b64decode(kvs[0]["value"]).decode(errors="replace") if kvs else None
            except OSError:
                continue
        raise RuntimeError("no etcd member answered a range request")

    def compact(self):
        """Writes one key (/etcd-cluster-compaction) and compacts the key space up to that write
        through a live member: a watch that must resume from an earlier revision is told it was
        compacted. Returns the revision."""
        import base64
        body = {"key": base64.b64encode(b"/etcd-cluster-compaction").decode(), "value": base64.b64encode(b"x").decode()}
        for i in self.alive():
            try:
                rev = int(_post_json(self.endpoints[i], "/v3/kv/put", body, timeout=5.0, certs=self.certs)["header"]["revision"])
                _post_json(self.endpoints[i], "/v3/kv/compaction", {"revision": rev}, timeout=5.0, certs=self.certs)
                return rev
            except OSError:
                continue
        raise RuntimeError("no etcd member answered a compaction")

    def revoke_lease(self, lease_id):
        """Revokes a lease (and with it every key on it) through a live member."""
        for i in self.alive():
            try:
                _post_json(self.endpoints[i], "/v3/lease/revoke", {"ID": int(lease_id)}, timeout=5.0, certs=self.certs)
                return
            except OSError:
                continue
        raise RuntimeError("no etcd member answered a lease revocation")

    def log_tail(self, i, n=2000):
        try:
            with open(os.path.join(self.dir, f"m{i}.log"), "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""


def _serve(args):
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    # The C++ test that started us ends: so do we (and with us every member).
    _pdeathsig(signal.SIGTERM)()
    with EtcdCluster(size=args.size) as cluster:
        pids = ",".join(str(p.pid) for p in cluster.procs)
        print(f"READY pid={os.getpid()} endpoints={','.join(cluster.endpoints)} pids={pids} dir={cluster.dir}",
              flush=True)

        if args.stdin_eof:
            def watch_stdin():
                try:
                    sys.stdin.buffer.read()
                except OSError:
                    pass
                done.set()

            threading.Thread(target=watch_stdin, daemon=True).start()
        done.wait(args.ttl)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start a cluster, print READY, hold it")
    s.add_argument("--size", type=int, default=3)
    s.add_argument("--ttl", type=float, default=300.0, help="safety bound: stop after this many seconds")
    s.add_argument("--stdin_eof", action="store_true", help="stop when stdin ends")
    args = ap.parse_args()
    reason = etcd_available()
    if reason:
        print(f"SKIP {reason}", flush=True)
        return 77
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
