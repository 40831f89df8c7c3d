#!/usr/bin/python3
"""How many etcd requests a job of N nodes costs with --rdzv_backend=etcd (docs/etcd.md: O(N)).

Starts a 3-member etcd cluster (scripts/etcd_cluster.py), runs N agents of one /bin/true worker
each on this machine, and counts the gRPC requests the members handled (unary calls, plus
messages received on Watch and LeaseKeepAlive streams) from etcd's /metrics, before and after.
Usage: bench/etcd_rdzv_requests.py [N ...]   (DDPRUN_BIN: folder of ddprun, default build/bin)
       bench/etcd_rdzv_requests.py --smoke   (N = 2 only: does it still run? ctest)
"""
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from etcd_cluster import EtcdCluster, etcd_available  # noqa: E402

import benchlib  # noqa: E402

DDPRUN = os.path.join(os.environ.get("DDPRUN_BIN", os.path.join(HERE, "..", "build", "bin")), "ddprun")
LINE = re.compile(r'^grpc_server_(handled_total|msg_received_total)\{([^}]*)\} ([0-9.e+]+)$')


def requests(cluster):
    total = {}
    for ep in cluster.endpoints:
        with urllib.request.urlopen("http://%s/metrics" % ep, timeout=5) as r:
            for line in r.read().decode().splitlines():
                m = LINE.match(line)
                if not m:
                    continue
                labels = dict(kv.split("=", 1) for kv in m.group(2).split(","))
                method = labels["grpc_method"].strip('"')
                streaming = labels["grpc_type"].strip('"') != "unary"
                # Unary: one per call (handled). Streams: one per message the client sent.
                if (m.group(1) == "handled_total") != streaming:
                    total[method] = total.get(method, 0) + int(float(m.group(3)))
    return total


def run_job(cluster, n):
    run_id = "bench_" + uuid.uuid4().hex[:8]
    args = ["--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_backend=etcd",
            "--rdzv_endpoint=" + ",".join(cluster.endpoints), "--rdzv_id=" + run_id, "--local_addr=127.0.0.1",
            "--rdzv_conf=heartbeat_timeout=5", "--no_python", "/bin/true"]
    start = time.monotonic()
    procs = [subprocess.Popen([DDPRUN] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    rcs = [p.wait(timeout=120) for p in procs]
    return rcs, time.monotonic() - start


def main():
    argv = sys.argv[1:]
    smoke = "--smoke" in argv
    sizes = [2] if smoke else [int(a) for a in argv] or [2, 4, 8]
    if not os.access(DDPRUN, os.X_OK):
        sys.exit("missing %s (DDPRUN_BIN: the folder of ddprun)" % DDPRUN)
    reason = etcd_available()
    if reason:
        benchlib.skip("etcd_rdzv_requests: " + reason)
    with EtcdCluster(size=3) as cluster:
        header = ["nodes", "etcd requests (whole job)", "per node", "wall s", "by method"]
        print("\n".join(benchlib.md_table(header, [])), flush=True)
        for n in sizes:
            before = requests(cluster)
            rcs, wall = run_job(cluster, n)
            after = requests(cluster)
            diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            diff = {k: v for k, v in diff.items() if v}
            total = sum(diff.values())
            assert rcs == [0] * n, rcs
            row = [n, total, "%.1f" % (total / n), "%.2f" % wall, ", ".join("%s %d" % kv for kv in sorted(diff.items()))]
            print(benchlib.md_table(header, [row])[-1], flush=True)


if __name__ == "__main__":
    main()
