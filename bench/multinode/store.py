"""Case `store`: set/get/add/compare_set per second against ddprun's store and PyTorch's TCPStore
(the same C++ loop, bench/store_bench.cc), then a job's store bootstrap of C ranks."""
import json
import os
import shutil
import subprocess
import uuid

from benchlib import free_port
from multinode.common import children_cpu, loadavg, log, proc_cpu_seconds, tail, torch_version, wait_for


def run(bench):
    a = bench.args
    bench.report.append("## 3. Store operations per second\n")
    have_dd = os.path.exists(bench.store_bench)
    have_tcp = os.path.exists(bench.tcpstore_bench)
    if not have_dd:
        bench.report.append("ddprun-store-bench not built (DDPRUN_BUILD_BENCH=OFF); skipped.\n")
        return
    d = bench.newdir("store")
    bench.step_env(d)
    results, boot_results = [], []
    tcp_pid = tport = None
    try:
        daemon_pid, port = bench.start_daemon(d)
        run_id = "mnb-store-%s" % uuid.uuid4().hex[:6]
        script = ('echo "$DDPRUN_ROUND $TORCHELASTIC_RUN_ID $DDPRUN_STORE_ADDR" > "$MNB_DIR/info.tmp" && '
                  'mv "$MNB_DIR/info.tmp" "$MNB_DIR/info"; exec sleep 3600')
        argv = bench.ddprun_agent_argv(1, port, run_id, script)
        bench.note_cmd("store job", bench.ddprun_agent_argv(1, "PORT", "RUN_ID", script))
        bench.procs.spawn(argv, os.path.join(d, "agent.log"))
        info = os.path.join(d, "info")
        wait_for(lambda: os.path.exists(info), 30, what="the store job's worker")
        rnd, rid, addr = open(info).read().split()
        if have_tcp:
            tport = free_port()
            targv = [bench.tcpstore_bench, "--serve", str(tport)]
            bench.note_cmd("tcpstore server", [bench.tcpstore_bench, "--serve", "PORT"])
            tlog = os.path.join(d, "tcpstore.log")
            tcp_pid = bench.procs.spawn(targv, tlog)
            wait_for(lambda: "listening" in tail(tlog, 3), 30, what="the TCPStore server")
        def run_one(backend, op, c, tag):
            if backend == "ddprun":
                cmd = [bench.store_bench, "--port", str(port), "--run_id", rid, "--round", rnd]
                shown = [bench.store_bench, "--port", "PORT", "--run_id", "RUN_ID", "--round", "ROUND"]
            else:
                cmd = [bench.tcpstore_bench, "--port", str(tport)]
                shown = [bench.tcpstore_bench, "--port", "PORT"]
            tail_args = ["--clients", str(c), "--seconds", str(a.store_seconds), "--tag", tag, "--ops", op]
            if op == "bootstrap":
                bench.note_cmd("store bootstrap %s (C = %s)" % (backend, ",".join(map(str, a.store_bootstrap_clients))),
                               shown + ["--clients", "C", "--tag", "TAG", "--ops", "bootstrap"])
            else:
                bench.note_cmd("store %s (C = 1, 8, 64; OP = set, get, add, compare_set)" % backend,
                               shown + ["--clients", "C", "--seconds", str(a.store_seconds),
                                        "--tag", "TAG", "--ops", "OP"])
            server = daemon_pid if backend == "ddprun" else tcp_pid
            s0, c0 = proc_cpu_seconds(server), children_cpu()
            out = subprocess.run(cmd + tail_args, env=bench.procs.env, capture_output=True,
                                 text=True, timeout=60 + 4 * a.store_seconds)
            s1, c1 = proc_cpu_seconds(server), children_cpu()
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    j = json.loads(line)
                    j["load"] = loadavg()
                    if j["ops"] and s0 is not None and s1 is not None:
                        # CPU per op; includes connecting and setup, a small share.
                        j["server_us"] = (s1 - s0) / j["ops"] * 1e6
                        j["client_us"] = (c1 - c0) / j["ops"] * 1e6
                    (boot_results if op == "bootstrap" else results).append(j)
                    log("  %s" % line)
            if out.returncode != 0:
                log("  rc %d: %s" % (out.returncode, out.stderr[-500:]))

        backends = ("ddprun", "tcpstore") if have_tcp else ("ddprun",)
        # Interleaved (rep, clients, op, backend) so that drift in the machine's load hits both.
        for rep in range(a.store_reps):
            for c in a.store_clients:
                log("store reps %d/%d clients=%d (load %s)" % (rep + 1, a.store_reps, c, loadavg()))
                for op in ("set", "get", "add", "compare_set"):
                    for backend in backends:
                        run_one(backend, op, c, "r%dc%d" % (rep, c))
        for rep in range(a.store_bootstrap_reps):
            for c in a.store_bootstrap_clients:
                log("store bootstrap %d/%d ranks=%d (load %s)" % (rep + 1, a.store_bootstrap_reps, c, loadavg()))
                # Alternate which backend goes first.
                for backend in (backends if rep % 2 == 0 else tuple(reversed(backends))):
                    run_one(backend, "bootstrap", c, "b%dc%d" % (rep, c))
    finally:
        bench.cleanup_step()
        bench.step_env(None)
        shutil.rmtree(d, ignore_errors=True)

    bench.report.append("Each client is its own process with its own connection (as each worker of a job "
                        "has), on its own key; all start together and run for %.1f s; median of %d runs "
                        "(range in brackets), ddprun and TCPStore runs interleaved. ddprun: "
                        "StoreClient (one connection per client, in the store's own framing unless DDPRUN_STORE_TRANSPORT=grpc "
                        "asks for the gRPC Session stream: %s) -> ddprun-rdzv, in the current round of a "
                        "running 1-node job. TCPStore: c10d::TCPStore client (libtorch %s) -> a "
                        "TCPStore server in its own process. Same C++ loop (bench/store_bench.cc) for "
                        "both; 32-byte values. p50/p99 are per-call latencies (log-bucketed, +-5%%). "
                        "Protocol differences: TCPStore's set is one-way (the client writes the request "
                        "and returns; no reply), so its set rate is how fast a client fills its socket; "
                        "its get is two round trips (WAIT, then GET). Every ddprun call is one request and "
                        "one response on the client's stream. CPU us/op: the server's CPU and all clients' CPU over the "
                        "run, divided by the operations.\n"
                        % (a.store_seconds, a.store_reps,
                           "the Session stream" if os.environ.get("DDPRUN_STORE_TRANSPORT") == "grpc"
                           else "the store's own framing in this run",
                           torch_version() or "?"))
    bench.report.append("| op | clients | ddprun ops/s | TCPStore ops/s | ddprun/TCPStore | ddprun p50/p99 us | "
                        "TCPStore p50/p99 us | CPU us/op server+clients, ddprun | same, TCPStore | errors |")
    bench.report.append("|---|---|---|---|---|---|---|---|---|---|")
    # Per (backend, op, clients): the repetition with the median rate.
    groups = {}
    for r in results:
        groups.setdefault((r["backend"], r["op"], r["clients"]), []).append(r)
    by = {}
    for k, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["ops_per_s"])
        by[k] = dict(rs[len(rs) // 2])
        by[k]["errors"] = sum(r["errors"] for r in rs)
        by[k]["error"] = next((r["error"] for r in rs if r["error"]), "")
        by[k]["range"] = (rs[0]["ops_per_s"], rs[-1]["ops_per_s"])
    slower = []
    for op in ("set", "get", "add", "compare_set"):
        for c in a.store_clients:
            dd, tc = by.get(("ddprun", op, c)), by.get(("tcpstore", op, c))
            ratio = (dd["ops_per_s"] / tc["ops_per_s"]) if dd and tc and tc["ops_per_s"] else None
            if ratio is not None and ratio < 1.0:
                slower.append("%s@%d (%.2fx)" % (op, c, ratio))
            errs = ", ".join("%s: %d %s" % (r["backend"], r["errors"], r["error"][:80])
                             for r in (dd, tc) if r and (r["errors"] or r["error"])) or "0"
            bench.report.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                op, c, _rate(dd), _rate(tc),
                "%.2fx" % ratio if ratio is not None else "-",
                "%.0f / %.0f" % (dd["p50_us"], dd["p99_us"]) if dd else "-",
                "%.0f / %.0f" % (tc["p50_us"], tc["p99_us"]) if tc else "-", _cpu(dd), _cpu(tc), errs))
    if results:
        bench.verdicts.append("Store at least as fast as TCPStore at every client count: %s" % (
            "met" if not slower and have_tcp else ("NOT met: slower at " + ", ".join(slower) if slower else "not compared")))
    bench.report.append("")
    if boot_results:
        report_bootstrap(bench, boot_results, have_tcp)


def report_bootstrap(bench, boot_results, have_tcp):
    a = bench.args
    bench.report.append("### Store bootstrap of a job's ranks\n")
    bench.report.append("What a starting job does with its store, once: C ranks (processes) start together; "
                        "each connects, sets its 64-byte address, gets every peer's address (a get that "
                        "waits for the key: C x (C - 1) gets in all, as gloo's full-mesh connect), then "
                        "meets the others at a barrier (add; the last to arrive sets `done`; every rank "
                        "gets it). Time: from the common start to the last rank through the barrier; "
                        "median of %d runs (range), backends alternating which goes first. Same servers "
                        "as above; `ddprun-store-bench --ops bootstrap` / `tcpstore-bench --ops bootstrap`.\n"
                        % a.store_bootstrap_reps)
    bench.report.append("| ranks | store calls | ddprun s | TCPStore s | TCPStore/ddprun time | ddprun p50/p99 us | "
                        "TCPStore p50/p99 us | errors |")
    bench.report.append("|---|---|---|---|---|---|---|---|")
    groups = {}
    for r in boot_results:
        groups.setdefault((r["backend"], r["clients"]), []).append(r)
    slower = []
    for c in a.store_bootstrap_clients:
        row = {}
        for backend in ("ddprun", "tcpstore"):
            rs = [r for r in groups.get((backend, c), []) if r["seconds"] > 0 and not r["error"]]
            if rs:
                rs.sort(key=lambda r: r["seconds"])
                row[backend] = (rs[len(rs) // 2], rs[0]["seconds"], rs[-1]["seconds"])
        errs = ", ".join("%s: %s" % (r["backend"], r["error"][:80])
                         for r in groups.get(("ddprun", c), []) + groups.get(("tcpstore", c), [])
                         if r["error"]) or "0"
        dd, tc = row.get("ddprun"), row.get("tcpstore")
        ratio = tc[0]["seconds"] / dd[0]["seconds"] if dd and tc else None
        if ratio is not None and ratio < 1.0:
            slower.append("%d ranks (%.2fx)" % (c, ratio))
        cell = lambda x: "%.3f [%.3f-%.3f]" % (x[0]["seconds"], x[1], x[2]) if x else "-"
        lat = lambda x: "%.0f / %.0f" % (x[0]["p50_us"], x[0]["p99_us"]) if x else "-"
        calls = (dd or tc)[0]["ops"] if (dd or tc) else 0
        bench.report.append("| %d | %d | %s | %s | %s | %s | %s | %s |" % (
            c, calls, cell(dd), cell(tc), "%.2fx" % ratio if ratio is not None else "-", lat(dd), lat(tc), errs))
    bench.verdicts.append("Store bootstrap of a job's ranks at least as fast as with TCPStore: %s" % (
        "met" if not slower and have_tcp else ("NOT met: slower at " + ", ".join(slower) if slower else "not compared")))
    bench.report.append("")


def _cpu(r):
    if not r or r.get("server_us") is None:
        return "-"
    return "%.0f + %.0f" % (r["server_us"], r["client_us"])


def _rate(r):
    if not r:
        return "-"
    lo, hi = r.get("range", (r["ops_per_s"], r["ops_per_s"]))
    return "%.0f [%.0f-%.0f]" % (r["ops_per_s"], lo, hi) if lo != hi else "%.0f" % r["ops_per_s"]
