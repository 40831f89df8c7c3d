#!/usr/bin/python3
"""ddprun's TCPStore adapter (store/tcpstore/) against torch's own TCPStore server, both driven by
the same torch's real client (issue #35's bench; results in bench/RESULTS_MULTINODE.md).

  python3 bench/tcpstore_bench.py [--python PY] [--reps 3] [--clients 1,8,64] [--ops 2000]
                                  [--bootstrap 8,64,256] [--modes set,get,...] [--smoke]

--python is the interpreter whose torch provides the client and the peer server: Debian's torch
1.13 (/usr/bin/python3: its legacy server) or the torch 2.x tier's venv (its libuv server, torch
2.x's default). A 1.13 client cannot talk to a 2.x server, so each version is its own run.
ddprun's side is test-bin/tcpstore_server (a store core and the adapter; the same code the
rendezvous will host). The client threads of one process each hold their own TCPStore connection
(torch's client releases the GIL inside every call).

Measured, per server, interleaved (A B, then B A, ...), the median of --reps:
  - set, get, add, compare_set: operations per second over all clients, each client doing --ops;
  - bootstrap: what init_process_group's store does for N ranks: rank 0 sets a 128-byte key (the
    NCCL id's size) and every other rank gets it (torch's get waits for it); the time from the
    start barrier until the last rank has it.
Output: one JSON line per measurement, then a markdown table of the ratios (ddprun / torch for
rates, torch / ddprun for times: above 1 is ddprun faster) and of where the CPU went: the server
process's (every thread's schedstat, over the driver's whole run: its connects and closes too) and
the clients' (getrusage over the measured window), per operation or per bootstrap. The share of the
wall a server's CPU takes bounds what a faster server can gain on that row.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import benchlib

DRIVER = r'''
import datetime, json, resource, sys, threading, time
import torch.distributed as dist

port, mode, clients, ops = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
stores = [dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=120)) for _ in range(clients)]
barrier = threading.Barrier(clients + 1)
done = [None] * clients
value = b"v" * 64

def run(i):
    s = stores[i]
    key = "%s/%d" % (mode, i)
    if mode == "get":
        s.set(key, value)
    barrier.wait()
    if mode == "bootstrap":
        if i == 0:
            s.set("bootstrap/id", b"n" * 128)
        else:
            s.get("bootstrap/id")
    elif mode == "set":
        for _ in range(ops):
            s.set(key, value)
    elif mode == "get":
        for _ in range(ops):
            s.get(key)
    elif mode == "add":
        for _ in range(ops):
            s.add(key, 1)
    elif mode == "compare_set":
        s.set(key, "0")
        for n in range(ops):
            s.compare_set(key, str(n), str(n + 1))
    done[i] = time.monotonic()

threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
for t in threads:
    t.start()
barrier.wait()
start = time.monotonic()
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
for t in threads:
    t.join()
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
wall = max(done) - start
cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
print(json.dumps({"wall_s": wall, "client_cpu_s": cpu}))
'''

TORCH_SERVER = r'''
import datetime, sys
import torch
import torch.distributed as dist
kwargs = {}
if not torch.__version__.startswith("1."):
    kwargs["use_libuv"] = True  # torch 2.x's default server, said explicitly
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=300), **kwargs)
print("PORT %d" % s.port, flush=True)
sys.stdin.read()
'''


def start_server(argv):
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit("tcpstore_bench: %s did not start: %r" % (argv[0], line))
    return proc, int(line.split()[1])


def cpu_ns(pid):
    """CPU time so far of every thread of `pid`, in ns (schedstat: finer than /proc/PID/stat's ticks)."""
    total = 0
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, task)) as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended in between
    return total


def stop_server(proc):
    try:
        proc.stdin.close()
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def drive(python, port, mode, clients, ops, server_pid):
    """(wall s, the client process's CPU s over that wall, the server's CPU s over the run)."""
    before = cpu_ns(server_pid)
    out = subprocess.run([python, "-c", DRIVER, str(port), mode, str(clients), str(ops)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("tcpstore_bench: the %s driver failed: %s" % (mode, out.stderr[-2000:]))
    server_cpu = (cpu_ns(server_pid) - before) / 1e9  # includes the clients' connects and closes
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["wall_s"], result["client_cpu_s"], server_cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=os.environ.get("PYTHON_EXEC") or "/usr/bin/python3")
    ap.add_argument("--server", default=os.path.join(os.environ.get("DDPRUN_BUILD_DIR") or
                                                     os.path.join(benchlib.ROOT, "build"), "test-bin", "tcpstore_server"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--bootstrap", default="8,64,256")
    ap.add_argument("--modes", default="set,get,add,compare_set,bootstrap", help="which measurements, comma-separated")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run (ctest -L bench)")
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.clients, args.ops, args.bootstrap = 1, "2", 20, "4"
    if not os.access(args.server, os.X_OK):
        benchlib.skip("%s is not built" % args.server)
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.strip()
    if not version:
        benchlib.skip("no torch for %s: no client and no peer server" % args.python)
    peer = "torch %s %s server" % (version, "legacy" if version.startswith("1.") else "libuv")
    servers = {"ddprun": [args.server], "torch": [args.python, "-c", TORCH_SERVER]}
    modes = args.modes.split(",")
    cases = [(mode, int(n)) for mode in ("set", "get", "add", "compare_set") if mode in modes
             for n in args.clients.split(",")]
    if "bootstrap" in modes:
        cases += [("bootstrap", int(n)) for n in args.bootstrap.split(",")]
    if not cases:
        raise SystemExit("tcpstore_bench: --modes names nothing to measure (set, get, add, compare_set, bootstrap)")
    if version.startswith("1."):
        # torch 1.13's client dies (SIGSEGV) when several threads call compare_set, against its own
        # server too (seen here at 8 threads x 2000 calls): one client only there.
        cases = [(mode, n) for mode, n in cases if mode != "compare_set" or n == 1]
    walls = {}  # (server, mode, clients) -> [wall_s]
    cpus = {}  # (server, mode, clients) -> [(client CPU s, server CPU s)]
    for rep in range(args.reps):
        order = ["ddprun", "torch"] if rep % 2 == 0 else ["torch", "ddprun"]
        for name in order:
            proc, port = start_server(servers[name])
            try:
                for mode, clients in cases:
                    wall, client_cpu, server_cpu = drive(args.python, port, mode, clients, args.ops, proc.pid)
                    walls.setdefault((name, mode, clients), []).append(wall)
                    cpus.setdefault((name, mode, clients), []).append((client_cpu, server_cpu))
                    rate = None if mode == "bootstrap" else clients * args.ops / wall
                    print(json.dumps({"server": name if name == "ddprun" else peer, "rep": rep, "op": mode,
                                      "clients": clients, "wall_s": round(wall, 6),
                                      "ops_per_s": round(rate, 1) if rate else None,
                                      "client_cpu_s": round(client_cpu, 6), "server_cpu_s": round(server_cpu, 6)}),
                          flush=True)
            finally:
                stop_server(proc)
    rows = []
    for mode, clients in cases:
        d = statistics.median(walls["ddprun", mode, clients])
        t = statistics.median(walls["torch", mode, clients])
        # CPU: medians of each side's client and server time, per operation (us) or per bootstrap (ms).
        per, unit = (1e3, "ms") if mode == "bootstrap" else (1e6 / (clients * args.ops), "us")
        cpu = {(name, i): statistics.median(c[i] for c in cpus[name, mode, clients]) * per
               for name in ("ddprun", "torch") for i in (0, 1)}
        cpu_cols = ["%.1f / %.1f %s" % (cpu["ddprun", 1], cpu["torch", 1], unit),
                    "%.1f / %.1f %s" % (cpu["ddprun", 0], cpu["torch", 0], unit)]
        if mode == "bootstrap":
            rows.append([mode, clients, "%.1f ms" % (d * 1e3), "%.1f ms" % (t * 1e3), "%.2fx" % (t / d)] + cpu_cols)
        else:
            n = clients * args.ops
            rows.append([mode, clients, "%.0f/s" % (n / d), "%.0f/s" % (n / t), "%.2fx" % (t / d)] + cpu_cols)
    print("\n%s; client: torch %s; %d reps, median; %s\n" % (peer, version, args.reps, benchlib.machine_text()))
    print("\n".join(benchlib.md_table(["op", "clients", "ddprun", peer, "ddprun / torch",
                                       "server CPU ddprun / torch", "client CPU ddprun / torch"], rows)))

if __name__ == "__main__":
    main()
