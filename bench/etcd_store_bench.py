#!/usr/bin/python3
"""A job's store bootstrap on the etcd backend: N ranks set their address and wait for every
rank's, on ddp::EtcdStore against a 3-member etcd cluster on loopback (scripts/etcd_cluster.py).
Time from the start to the last rank through, median (min-max) of the repetitions.

Usage: bench/etcd_store_bench.py [--build DIR] [--ranks 4,8,16] [--reps 5]
       bench/etcd_store_bench.py --smoke   (4 ranks, 1 repetition: does it still run? ctest)
Needs ddprun-etcd-store-bench (bench/CMakeLists.txt) in DIR/bin and etcd-server.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from etcd_cluster import EtcdCluster, etcd_available  # noqa: E402

import benchlib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("DDPRUN_BUILD_DIR", os.path.join(HERE, "..", "build")))
    ap.add_argument("--ranks", default="4,8,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.reps = "4", 1
    exe = os.path.join(args.build, "bin", "ddprun-etcd-store-bench")
    if not os.access(exe, os.X_OK):
        benchlib.skip("%s not built (cmake --build %s --target ddprun-etcd-store-bench)" % (exe, args.build))
    why = etcd_available()
    if why:
        benchlib.skip(why)
    rows = []
    with EtcdCluster(size=3) as cluster:
        for n in [int(x) for x in args.ranks.split(",")]:
            out = subprocess.run([exe, "--endpoints", ",".join(cluster.endpoints), "--ranks", str(n),
                                  "--reps", str(args.reps)], capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                sys.exit("ddprun-etcd-store-bench failed (%d): %s" % (out.returncode, out.stderr.strip()))
            secs = [json.loads(line)["seconds"] for line in out.stdout.splitlines() if line.startswith("{")]
            print(out.stdout, end="")
            rows.append([str(n), "%.1f (%.1f-%.1f)" % (statistics.median(secs) * 1e3, min(secs) * 1e3,
                                                       max(secs) * 1e3), str(len(secs))])
    print()
    print("\n".join(benchlib.md_table(["ranks", "bootstrap ms, median (min-max)", "repetitions"], rows)))


if __name__ == "__main__":
    main()
