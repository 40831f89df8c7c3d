#!/usr/bin/env python3
"""What TLS costs, side by side with plaintext in one run (README "Security"; issue #25):

  rounds    N real agents (ddprun, one `sh` worker that stamps a file) against one ddprun-rdzv,
            started together: time to all N workers running, for a plaintext daemon, a TLS one
            and an mTLS one (every agent with a client certificate), interleaved per rep.
  store     operations per second of the workers' store (bench/store_bench.cc, one connection per
            client process) against a plaintext and a TLS daemon, interleaved, and a job's store
            bootstrap (connect, publish, read every peer, barrier).
  capacity  N agents from one address join at once (the load generator, bench/rdzv_capacity.cc),
            plaintext and TLS, with the guard on (TLS needs it): join time, the daemon's RSS, its
            CPU per heartbeat; --capacity N (0: skipped).

    bench/tls_bench.py [--build build] [--sizes 2,4,8] [--reps 5] [--store_clients 1,8,64]
                       [--capacity 6000] [--smoke] [--label L] [--output bench/RESULTS_TLS.md]

Certificates: tests/support/tls_pki.py (ECDSA P-256). Every process is in its own session and
killed at the end of its case; temporary folders are removed. Not a test (ctest runs --smoke).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import benchlib  # noqa: E402
import tls_pki  # noqa: E402

STAMP = 'echo x > "$STAMP_DIR/$$"; exit 0'
CASE_BOUND_S = 120


def start_daemon(build, workdir, mode, pki, extra=()):
    args = ["--log_level", "warning"] + list(extra)
    if mode != "plain":
        args += ["--tls_cert", pki["server"], "--tls_key", pki["server_key"]]
    if mode == "mtls":
        args += ["--tls_client_ca", pki["ca"]]
    return benchlib.start_rdzv(os.path.join(build, "bin", "ddprun-rdzv"),
                               os.path.join(workdir, "rdzv-%s-%s.log" % (mode, uuid.uuid4().hex[:6])), args)


def conf_for(mode, pki, i):
    conf = ["is_host=0"]
    if mode != "plain":
        conf += ["protocol=https", "cacert=" + pki["ca"]]
    if mode == "mtls":
        client = "client_a" if i % 2 == 0 else "client_b"
        conf += ["cert=" + pki[client], "key=" + pki[client + "_key"]]
    return ",".join(conf)


def one_round(build, port, n, mode, pki, workdir):
    """Seconds from starting n agents to n stamps, or None."""
    d = tempfile.mkdtemp(prefix="tls_round_", dir=workdir)
    env = dict(os.environ, STAMP_DIR=d)
    run_id = "t" + uuid.uuid4().hex[:10]
    argvs = [[os.path.join(build, "bin", "ddprun"), "--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_backend=grpc",
              "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_conf=" + conf_for(mode, pki, i), "--rdzv_id=" + run_id,
              "--local_addr=127.0.0.1", "--no_python", "/bin/sh", "-c", STAMP] for i in range(n)]
    t0 = time.monotonic()
    procs = [subprocess.Popen(a, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(d, "agent%d.err" % i), "wb"), start_new_session=True)
             for i, a in enumerate(argvs)]
    took = None
    while True:
        if len([f for f in os.listdir(d) if f.isdigit()]) >= n:
            took = time.monotonic() - t0
            break
        if time.monotonic() - t0 > CASE_BOUND_S or all(p.poll() is not None for p in procs):
            sys.stderr.write("%s n=%d failed: %s\n" % (mode, n, open(os.path.join(d, "agent0.err"), errors="replace")
                                                         .read()[-400:]))
            break
        time.sleep(0.002)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    benchlib.kill_sessions(procs)
    shutil.rmtree(d, True)
    return took


def bench_rounds(args, pki, workdir):
    modes = ("plain", "tls", "mtls")
    times = {(m, n): [] for m in modes for n in args.sizes}
    for rep in range(args.reps):
        for n in args.sizes:
            for mode in modes:  # interleaved: drift in the machine's load hits all three
                proc, port = start_daemon(args.build, workdir, mode, pki)
                try:
                    t = one_round(args.build, port, n, mode, pki, workdir)
                finally:
                    benchlib.stop(proc)
                if t is not None:
                    times[(mode, n)].append(t)
                print("rounds rep %d n=%d %-5s %s" % (rep, n, mode, "%.1f ms" % (t * 1000) if t else "failed"),
                      flush=True)
    return times


def store_job(args, port, mode, pki, workdir):
    """A 1-node job whose worker sleeps in its round: (its round, run id, process)."""
    d = tempfile.mkdtemp(prefix="tls_store_", dir=workdir)
    info = os.path.join(d, "info")
    script = 'echo "$DDPRUN_ROUND $TORCHELASTIC_RUN_ID" > "%s.tmp" && mv "%s.tmp" "%s"; exec sleep 3600' % (
        info, info, info)
    argv = [os.path.join(args.build, "bin", "ddprun"), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=grpc",
            "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_conf=" + conf_for(mode, pki, 0),
            "--rdzv_id=s" + uuid.uuid4().hex[:8], "--no_python", "/bin/sh", "-c", script]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(d, "agent.err"), "wb"), start_new_session=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(info):
        if time.monotonic() > deadline or proc.poll() is not None:
            benchlib.kill_sessions([proc])
            raise RuntimeError("the store job did not start: " + open(os.path.join(d, "agent.err")).read()[-500:])
        time.sleep(0.02)
    rnd, rid = open(info).read().split()
    return rnd, rid, proc


def bench_store(args, pki, workdir):
    sb = os.path.join(args.build, "bin", "ddprun-store-bench")
    if not os.path.exists(sb):
        return None, "ddprun-store-bench is not built (DDPRUN_BUILD_BENCH=OFF)"
    setups = {}
    results = []
    try:
        for mode in ("plain", "tls"):
            proc, port = start_daemon(args.build, workdir, mode, pki)
            rnd, rid, job = store_job(args, port, mode, pki, workdir)
            setups[mode] = (proc, port, rnd, rid, job)
        for rep in range(args.reps):
            for c in args.store_clients:
                for op in ("set", "get", "add", "compare_set", "bootstrap"):
                    for mode in ("plain", "tls"):
                        proc, port, rnd, rid, job = setups[mode]
                        cmd = [sb, "--port", str(port), "--run_id", rid, "--round", rnd, "--clients", str(c),
                               "--seconds", str(args.store_seconds), "--ops", op, "--tag", "r%d%s" % (rep, mode[0])]
                        if mode == "tls":
                            cmd += ["--tls_ca", pki["ca"]]
                        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                        for line in out.stdout.splitlines():
                            if line.startswith("{"):
                                j = json.loads(line)
                                j.update(mode=mode, rep=rep)
                                results.append(j)
                        if out.returncode != 0:
                            sys.stderr.write("store %s %s c=%d: rc %d %s\n" % (mode, op, c, out.returncode,
                                                                               out.stderr[-300:]))
                print("store rep %d clients=%d done" % (rep, c), flush=True)
    finally:
        for proc, port, rnd, rid, job in setups.values():
            benchlib.kill_sessions([job])
            benchlib.stop(proc)
    return results, None


def bench_capacity(args, pki, workdir):
    gen = os.path.join(args.build, "bin", "ddprun-rdzv-capacity")
    if not os.path.exists(gen):
        return None, "ddprun-rdzv-capacity is not built"
    out = []
    for rep in range(max(1, args.capacity_reps)):
        for mode in ("plain", "tls"):
            proc, port = start_daemon(args.build, workdir, mode, pki, ["--connection_guard", "on"])
            try:
                time.sleep(0.3)
                cmd = [gen, "--address", "127.0.0.1:%d" % port, "--daemon_pid", str(proc.pid), "--jobs", "1",
                       "--nodes", str(args.capacity), "--heartbeat_timeout_ms", "5000", "--timeout_s", "240",
                       "--steady_seconds", "5"]
                if mode == "tls":
                    cmd += ["--tls_ca", pki["ca"]]
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=benchlib.raise_nofile)
            finally:
                benchlib.stop(proc)
            lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
            r = json.loads(lines[-1]) if lines else {"error": res.stderr[-500:]}
            r.update(mode=mode, rep=rep, rc=res.returncode)
            out.append(r)
            print("capacity rep %d %-5s rc %d join %s s, rss %s kB" % (
                rep, mode, res.returncode, r.get("first_join_to_all_assigned_s"), r.get("daemon_hwm_kb")), flush=True)
    return out, None


def med(vals):
    return statistics.median(vals) if vals else None


def fmt_ms(v):
    return "%.1f" % (v * 1000) if v is not None else "-"


def report(args, rounds, store, store_skip, capacity, cap_skip):
    lines = ["", "## TLS against plaintext%s (%s)" % (" [%s]" % args.label if args.label else "",
                                                       time.strftime("%Y-%m-%d %H:%M")), "",
             "Command: `python3 bench/tls_bench.py %s`" % " ".join(sys.argv[1:]), "",
             "Machine: %d CPUs, load before %.2f. ECDSA P-256 certificates, TLS 1.3." % (os.cpu_count(),
                                                                                    benchlib.loadavg()), ""]
    if rounds:
        lines += ["### Round formation (ms, median of %d; min-max)" % args.reps, "",
                  "| nodes | plaintext | TLS | mTLS | TLS / plaintext | mTLS / plaintext |", "|---|---|---|---|---|---|"]
    for n in (args.sizes if rounds else []):
        cells = []
        meds = {}
        for mode in ("plain", "tls", "mtls"):
            v = rounds[(mode, n)]
            meds[mode] = med(v)
            cells.append("%s (%s-%s)" % (fmt_ms(meds[mode]), fmt_ms(min(v) if v else None), fmt_ms(max(v) if v else None)))
        ratio = lambda m: "%.2fx" % (meds[m] / meds["plain"]) if meds[m] and meds["plain"] else "-"
        lines.append("| %d | %s | %s | %s |" % (n, " | ".join(cells), ratio("tls"), ratio("mtls")))
    lines.append("")
    if store is None:
        lines += ["Store: skipped (%s)." % store_skip, ""]
    else:
        lines += ["### Store (operations per second, median of %d; bootstrap: seconds)" % args.reps, "",
                  "| operation | clients | plaintext | TLS | TLS / plaintext |", "|---|---|---|---|---|"]
        for op in ("set", "get", "add", "compare_set", "bootstrap"):
            for c in args.store_clients:
                key = "seconds" if op == "bootstrap" else "ops_per_s"
                vals = {m: med([r.get(key) for r in store if r.get("op") == op and r.get("clients") == c and
                                r.get("mode") == m and r.get(key) is not None]) for m in ("plain", "tls")}
                if vals["plain"] is None or vals["tls"] is None:
                    continue
                ratio = vals["tls"] / vals["plain"] if vals["plain"] else None
                fmtv = (lambda v: "%.4f" % v) if op == "bootstrap" else (lambda v: "%.0f" % v)
                lines.append("| %s | %d | %s | %s | %s |" % (op, c, fmtv(vals["plain"]), fmtv(vals["tls"]),
                                                             "%.2fx" % ratio if ratio else "-"))
        lines.append("")
    if capacity is None:
        lines += ["Capacity: %s." % cap_skip, ""]
    else:
        lines += ["### %d agents from one address join at once, guard on" % args.capacity, "",
                  "| | rc | join (first Join to all assigned) s | daemon peak RSS MB | daemon us per heartbeat | "
                  "connect s | daemon CPU s in connect |",
                  "|---|---|---|---|---|---|---|"]
        for r in capacity:
            lines.append("| %s rep %d | %s | %s | %s | %s | %s | %s |" % (
                r["mode"], r["rep"], r.get("rc"), r.get("first_join_to_all_assigned_s"),
                "%.0f" % (r["daemon_hwm_kb"] / 1024) if r.get("daemon_hwm_kb") else "-",
                r.get("steady_daemon_us_per_heartbeat"), r.get("connect_wall_s"), r.get("connect_daemon_cpu_s")))
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--store_clients", default="1,8,64")
    ap.add_argument("--store_seconds", type=float, default=1.0)
    ap.add_argument("--capacity", type=int, default=0, help="agents for the capacity case (0: skip)")
    ap.add_argument("--capacity_reps", type=int, default=1)
    ap.add_argument("--parts", default="rounds,store,capacity", help="which parts to run")
    ap.add_argument("--smoke", action="store_true", help="2 nodes, 1 rep, 1 store client: does it still run?")
    ap.add_argument("--label", default="")
    ap.add_argument("--output", default="", help="markdown file to append the section to (default: stdout only)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.reps, args.store_clients, args.store_seconds, args.capacity = "2", 1, "1", 0.2, 0
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.store_clients = [int(x) for x in args.store_clients.split(",")]
    workdir = tempfile.mkdtemp(prefix="tls_bench_")
    try:
        pki = tls_pki.make_pki(os.path.join(workdir, "pki"))
        parts = args.parts.split(",")
        rounds = bench_rounds(args, pki, workdir) if "rounds" in parts else {}
        store, store_skip = bench_store(args, pki, workdir) if "store" in parts else (None, "not run (--parts)")
        capacity, cap_skip = (bench_capacity(args, pki, workdir) if args.capacity and "capacity" in parts
                              else (None, "skipped (--capacity 0, or --parts)"))
    finally:
        shutil.rmtree(workdir, True)
    text = report(args, rounds, store, store_skip, capacity, cap_skip)
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            f.write(text)
    failed = [k for k, v in rounds.items() if not v]
    if failed:
        sys.exit("tls_bench: no round formed for %s" % failed)


if __name__ == "__main__":
    main()
