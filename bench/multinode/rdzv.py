"""Case `rdzv`: N agents against one rendezvous, from the first agent's spawn to all N workers
running, beside the floors of starting N processes at all; memory per agent and one agent's CPU
against the processes on the host first."""
import json
import os
import shutil
import signal
import subprocess
import time
import uuid

from benchlib import free_port
from multinode.common import (GIB, MIB, SH, TORCHRUN, StepTimeout, children_cpu, fmt_mib, fmt_s, kernel_mem,
                              loadavg, log, mem_available, proc_cmdline, proc_comm, proc_cpu_seconds, proc_hwm,
                              proc_mem, tail)


def run(bench):
    a = bench.args
    bench.report.append("## 1. Rendezvous at scale\n")
    log("memory per agent (N=8, workers kept alive)")
    mems = {"ddprun": measure_memory(bench, "ddprun")}
    if os.path.exists(TORCHRUN) and a.torch_sizes:
        mems["torchrun"] = measure_memory(bench, "torchrun")
    # The fit check: the larger of Pss and the drop of MemAvailable, per agent (+ its worker).
    budget = min(a.mem_budget_gib * GIB, mem_available() - 3 * GIB)
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    pids_free = pid_max - len([d for d in os.listdir("/proc") if d.isdigit()])

    def per_agent(kind):
        # PSS of the agent's processes and its worker, plus their kernel stacks and page
        # tables, with 25% to spare. (MemAvailable's drop is shown too, but other work on the
        # machine moves it by more than 8 agents do.)
        m = mems.get(kind, {})
        return 1.25 * (m.get("pss_per_agent", 0) + m.get("worker_pss", 0) + m.get("kernel_per_agent", 0))

    def fits(kind, n):
        m = mems.get(kind, {})
        need = per_agent(kind) * n
        tasks = (m.get("threads_per_agent", 10) + 2) * n
        if need > budget:
            return "needs ~%.1f GiB (%.1f MiB/agent x %d) > budget %.1f GiB" % (
                need / GIB, per_agent(kind) / MIB, n, budget / GIB)
        if tasks > 0.8 * pids_free:
            return "needs ~%d threads/pids > 80%% of the %d free pids (kernel.pid_max)" % (tasks, pids_free)
        return None

    bench.report.append("Memory per agent, N=8 agents with sleeping workers (PSS/RSS summed over the "
                        "launcher's own processes per node: agent, watchdog, torchrun's workers' "
                        "parents; the worker itself is separate):\n")
    bench.report.append("| launcher | PSS/agent MiB | RSS/agent MiB | kernel stacks+page tables/agent MiB | "
                        "MemAvailable drop/agent MiB | processes/agent | threads/agent | worker PSS MiB | daemon RSS MiB |")
    bench.report.append("|---|---|---|---|---|---|---|---|---|")
    for k, m in mems.items():
        bench.report.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            k, fmt_mib(m.get("pss_per_agent")), fmt_mib(m.get("rss_per_agent")),
            fmt_mib(m.get("kernel_per_agent")), fmt_mib(m.get("avail_drop_per_agent")),
            "%.1f" % m["procs_per_agent"] if "procs_per_agent" in m else "-",
            "%.1f" % m["threads_per_agent"] if "threads_per_agent" in m else "-",
            fmt_mib(m.get("worker_pss")), fmt_mib(m.get("daemon_rss")) if k == "ddprun" else "(in agent 0)"))
        if m.get("note"):
            bench.report.append("\n%s: %s" % (k, m["note"]))
    bench.report.append("\nFit check: 1.25 x (PSS + worker PSS + kernel) per agent = %s MiB (ddprun), %s MiB "
                        "(torchrun), against a budget of %.1f GiB (min of --mem-budget-gib %.0f and "
                        "MemAvailable - 3 GiB); %d free pids. Each step also stops itself if "
                        "MemAvailable falls below %.1f GiB.\n" % (
                           fmt_mib(per_agent("ddprun")), fmt_mib(per_agent("torchrun")) if "torchrun" in mems else "-",
                           budget / GIB, a.mem_budget_gib, pids_free, a.min_free_gib))

    log("agent CPU probe")
    probe = agent_cpu_probe(bench, a.crowd)
    bench.report.append("CPU of one agent's whole life (`ddprun --standalone --nproc_per_node=1 --no_python "
                        "/bin/true`, mean of 10, agent + watchdog + worker) against the number of "
                        "processes on the host (extra ones are sleeping `sleep` processes):\n")
    bench.report.append("| processes on the host | `ddprun --version` CPU ms | `ddprun-multinode --version` CPU ms "
                        "| one agent's life CPU ms | wall ms |")
    bench.report.append("|---|---|---|---|---|")
    for nprocs, ver, ver_mn, cpu, wall in probe:
        bench.report.append("| %d | %.1f | %.1f | %.1f | %.0f |" % (nprocs, ver * 1000, ver_mn * 1000, cpu * 1000,
                                                                    wall * 1000))
    bench.report.append("")

    rows = []
    skipped = []
    for n in a.sizes:
        why = fits("ddprun", n)
        if why:
            skipped.append("ddprun N=%d skipped: %s" % (n, why))
            log(skipped[-1])
            continue
        for kind in [k for k in ("sh", "version", "standalone", "ddprun") if k in a.kinds]:
            log("rdzv %s N=%d (load %s)" % (kind, n, loadavg()))
            r = run_case(bench, kind, n, timeout=max(a.step_timeout, 0.3 * n))
            r["load"] = loadavg()
            rows.append(r)
            log("  -> %s" % json.dumps({k: v for k, v in r.items() if k not in ("note",)}))
            if r.get("note"):
                log("  note: " + r["note"])
        if rows and rows[-1]["kind"] == "ddprun" and not rows[-1]["ok"] and not bench.mem_valve:
            # Is it the 2.5 s gRPC keepalive (heartbeat_timeout / 2) under CPU starvation?
            log("rdzv ddprun N=%d again with heartbeat_timeout=60 (load %s)" % (n, loadavg()))
            r = run_case(bench, "ddprun_hb", n, timeout=max(a.step_timeout, 0.3 * n))
            r["load"] = loadavg()
            rows.append(r)
            log("  -> %s" % json.dumps(r))
    for n in a.torch_sizes:
        why = fits("torchrun", n)
        if why:
            skipped.append("torchrun N=%d skipped: %s" % (n, why))
            continue
        log("rdzv torchrun N=%d (load %s)" % (n, loadavg()))
        r = run_case(bench, "torchrun", n, timeout=max(a.step_timeout, 60 + 10 * n))
        r["load"] = loadavg()
        rows.append(r)
        log("  -> %s" % json.dumps({k: v for k, v in r.items() if k not in ("note",)}))

    bench.report.append("Time from spawning the first agent (t0: the mtime of a file written just before "
                        "the tight posix_spawn loop) to every worker running (each worker writes a "
                        "file; its mtime is the time; same kernel clock as t0). Launcher workers then "
                        "hold (sleep), as training workers would, so the start is timed without early "
                        "exits in the way; then every agent gets SIGTERM and `teardown` is the time "
                        "until all have exited. The sh and `ddprun-multinode --version` floors just exit "
                        "(`all exited`); a multi-node agent is ddprun, which execs ddprun-multinode. "
                        "`spawn loop`: how long the loop took to spawn all N. CPU: user+system seconds "
                        "of all agents with their watchdogs and workers, until all workers ran / in "
                        "total with the teardown; with 2 cores, CPU/2 is a floor for wall time. "
                        "`steady`: CPU milliseconds per second over %.0f s once every worker runs "
                        "(agents only heartbeat), of all agents / of the daemon.\n" % bench.args.steady_seconds)
    bench.report.append("| N | what | ok | spawn loop s | first worker s | **all workers s** | all exited s | "
                        "teardown s | CPU agents until up / total s | CPU daemon up / total s | steady CPU ms/s "
                        "agents / daemon | daemon peak RSS MiB | peak MemAvailable drop MiB | load |")
    bench.report.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    names = {"sh": "floor: N bare sh workers", "version": "floor: N `ddprun-multinode --version` (exit)",
             "standalone": "floor: N `ddprun --standalone`",
             "ddprun": "**ddprun + ddprun-rdzv**", "ddprun_hb": "ddprun, `heartbeat_timeout=60`",
             "torchrun": "torchrun c10d"}
    for r in sorted(rows, key=lambda r: (r["n"], ["sh", "version", "standalone", "ddprun", "ddprun_hb", "torchrun"].index(r["kind"]))):
        bench.report.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["n"], names[r["kind"]], "yes" if r["ok"] else "**no**", fmt_s(r.get("spawn_loop_s")),
            fmt_s(r.get("first_worker_s")), fmt_s(r.get("all_workers_s")), fmt_s(r.get("all_exited_s")),
            fmt_s(r.get("teardown_s")),
            "%s / %s" % (fmt_s(r.get("agents_cpu_up_s")), fmt_s(r.get("agents_cpu_s"))) if "agents_cpu_up_s" in r
            else fmt_s(r.get("agents_cpu_s")),
            "%s / %s" % (fmt_s(r.get("daemon_cpu_up_s")), fmt_s(r.get("daemon_cpu_s"))) if "daemon_cpu_s" in r else "-",
            "%.0f / %s" % (r["steady_agents_ms"], "%.1f" % r["steady_daemon_ms"] if "steady_daemon_ms" in r else "-")
            if "steady_agents_ms" in r else "-",
            fmt_mib(r.get("daemon_rss")) if r["kind"].startswith("ddprun") else "-", fmt_mib(r.get("peak_mem_drop")),
            r.get("load", "")))
    for r in rows:
        if r.get("note"):
            bench.report.append("\n- %s N=%d: %s" % (r["kind"], r["n"], r["note"]))
    for s in skipped:
        bench.report.append("\n- " + s)
    # Ratios ddprun vs torchrun at common sizes, and the 1024 target.
    by = {(r["kind"], r["n"]): r for r in rows}
    ratios = []
    for n in a.torch_sizes:
        dd, tr = by.get(("ddprun", n)), by.get(("torchrun", n))
        if dd and tr and dd.get("all_workers_s") and tr.get("all_workers_s"):
            ratios.append("N=%d: torchrun/ddprun = %.1fx" % (n, tr["all_workers_s"] / dd["all_workers_s"]))
    if ratios:
        bench.report.append("\nRatios (all workers running): " + "; ".join(ratios) + ".")
    big = max([r["n"] for r in rows if r["kind"] == "ddprun"] or [0])
    r = by.get(("ddprun", big))
    if r:
        t = r.get("all_workers_s")
        met = bool(r["ok"] and t is not None and t < 2.0)
        hb = by.get(("ddprun_hb", big))
        bench.verdicts.append("Rendezvous: %d agents -> all workers running in %s s%s (target: 1024 in < 2 s): %s%s" % (
            big, fmt_s(t) if r["ok"] else "- (failed: %s)" % (r.get("note", "")[:160]),
            "; with heartbeat_timeout=60: %s s" % fmt_s(hb.get("all_workers_s")) if hb else "",
            "met" if met and big >= 1024 else "NOT met",
            "" if big >= 1024 else " (largest N run: %d)" % big))
    bench.report.append("")


def run_case(bench, kind, n, timeout):
    try:
        return _run_case(bench, kind, n, timeout)
    except StepTimeout as e:
        return {"kind": kind, "n": n, "ok": False, "note": str(e)}


def _run_case(bench, kind, n, timeout):
    """kind: sh | version | standalone | ddprun | ddprun_hb | torchrun. Returns a result dict.

    Launcher workers stamp their file and then hold (sleep), as training workers run on, so
    that the start is measured without the exits of early workers in the way. Once every
    worker runs (or the step fails), every agent gets SIGTERM and the teardown is timed."""
    d = bench.newdir("%s-%d" % (kind, n))
    run_id = "mnb-%s-%d-%s" % (kind, n, uuid.uuid4().hex[:6])
    bench.step_env(d)
    daemon_pid = None
    res = {"kind": kind, "n": n, "ok": False}
    worker = bench.stamp_worker(exit_after=False)
    try:
        if kind in ("ddprun", "ddprun_hb"):
            daemon_pid, port = bench.start_daemon(d)
            conf = "is_host=0" if kind == "ddprun" else "is_host=0,heartbeat_timeout=60"
            argv = bench.ddprun_agent_argv(n, port, run_id, worker, conf=conf)
            bench.note_cmd(kind, bench.ddprun_agent_argv("N", "PORT", "RUN_ID", worker, conf=conf))
            argvs = [argv] * n
        elif kind == "torchrun":
            argvs = [bench.torchrun_argv(n, free_port(), run_id, worker)] * n
            bench.note_cmd(kind, bench.torchrun_argv("N", "PORT", "RUN_ID", worker))
        elif kind == "standalone":
            argvs = [[bench.ddprun, "--standalone", "--nproc_per_node=1", "--no_python", SH, "-c", worker]] * n
            bench.note_cmd(kind, argvs[0])
        elif kind == "sh":  # the floor of starting N processes at all
            argvs = [[SH, "-c", 'echo x > "$MNB_DIR/w.%d"' % i] for i in range(n)]
            bench.note_cmd("sh floor", [SH, "-c", 'echo x > "$MNB_DIR/w.I"'])
        else:  # version: the floor of loading the ddprun binary N times
            argvs = [[bench.multinode, "--version"]] * n
            bench.note_cmd("binary floor", argvs[0])
        holds = kind not in ("sh", "version")
        want = 0 if kind == "version" else n
        cpu0 = children_cpu()
        avail0 = mem_available()
        bench.wait_exit = not holds
        t0, spawn_s, pids = bench.spawn_many(argvs, d)
        m_spawned = time.monotonic()
        stamps, exited_at = bench.await_stamps(d, want, pids, timeout)
        res["spawn_loop_s"] = spawn_s
        res["workers"] = len(stamps)
        res["peak_mem_drop"] = max(0, avail0 - bench.min_avail)
        if stamps:
            res["first_worker_s"] = (min(stamps.values()) - t0) / 1e9
            res["all_workers_s"] = (max(stamps.values()) - t0) / 1e9
        if daemon_pid:
            res["daemon_cpu_up_s"] = proc_cpu_seconds(daemon_pid)
        if holds:
            # CPU spent by the agents, their watchdogs and workers (live ones, and what was
            # reaped) until every worker ran.
            res["agents_cpu_up_s"] = sum(proc_cpu_seconds(p) or 0 for p in bench.procs.marked()
                                         if p != daemon_pid) + children_cpu() - cpu0
            died = [i for i, p in enumerate(pids) if not bench.procs.alive(p)]
            res["failed_agents"] = len(died)
            res["ok"] = len(stamps) == want and not died
            if res["ok"] and bench.args.steady_seconds > 0:
                # Steady state: every worker runs, agents only heartbeat. CPU per second of
                # the daemon and of all agents together.
                def cpu_now():
                    agents = sum(proc_cpu_seconds(p) or 0 for p in bench.procs.marked() if p != daemon_pid)
                    return agents, (proc_cpu_seconds(daemon_pid) or 0) if daemon_pid else 0
                time.sleep(1.0)
                a0, d0 = cpu_now()
                m0 = time.monotonic()
                time.sleep(bench.args.steady_seconds)
                a1, d1 = cpu_now()
                dt = time.monotonic() - m0
                res["steady_agents_ms"] = (a1 - a0) / dt * 1000
                if daemon_pid:
                    res["steady_daemon_ms"] = (d1 - d0) / dt * 1000
            # Teardown: SIGTERM to every agent, until all have exited.
            m_term = time.monotonic()
            for p in pids:
                # Only children not reaped yet: a reaped pid may belong to someone else now.
                if bench.procs.alive(p):
                    bench.procs.kill(p, signal.SIGTERM)
            end = m_term + max(60.0, 0.2 * n)
            while time.monotonic() < end and any(bench.procs.alive(p) for p in pids):
                time.sleep(0.05)
            if not any(bench.procs.alive(p) for p in pids):
                res["teardown_s"] = time.monotonic() - m_term
        else:
            if exited_at is not None:
                res["all_exited_s"] = exited_at - m_spawned + spawn_s
            codes = [bench.procs.exit_code(p) for p in pids]
            died = [i for i, c in enumerate(codes) if c != 0]
            res["failed_agents"] = len(died)
            res["ok"] = len(stamps) == want and exited_at is not None and not died
        if daemon_pid:
            res["daemon_rss"] = proc_hwm(daemon_pid)
            res["daemon_cpu_s"] = proc_cpu_seconds(daemon_pid)
        bench.cleanup_step()
        res["agents_cpu_s"] = children_cpu() - cpu0 - (res.get("daemon_cpu_s") or 0)
        if bench.mem_valve:
            res["ok"] = False
            res["note"] = "stopped: MemAvailable fell below %.1f GiB" % bench.args.min_free_gib
        elif not res["ok"]:
            bad = died[:1] or [0]
            res["note"] = "workers %d/%d, agents gone before all workers ran: %d; log of #%d: %s" % (
                len(stamps), want, res["failed_agents"], bad[0],
                tail(os.path.join(d, "log.%d" % bad[0]), 4).strip().replace("\n", " | ")[-300:])
    finally:
        bench.cleanup_step()
        bench.step_env(None)
        shutil.rmtree(d, ignore_errors=True)
    return res


def measure_memory(bench, kind, n=8):
    """Keeps n agents with sleeping workers up; returns per-agent Pss/Rss of the launcher's own
    processes (everything but the worker), threads, and the daemon's."""
    d = bench.newdir("mem-%s" % kind)
    bench.step_env(d)
    run_id = "mnb-mem-%s-%s" % (kind, uuid.uuid4().hex[:6])
    out = {"kind": kind, "n": n}
    try:
        avail0 = mem_available()
        kern0 = kernel_mem()
        daemon_pid = None
        if kind == "ddprun":
            daemon_pid, port = bench.start_daemon(d)
            argv = bench.ddprun_agent_argv(n, port, run_id, bench.stamp_worker(exit_after=False))
        else:
            argv = bench.torchrun_argv(n, free_port(), run_id, bench.stamp_worker(exit_after=False))
        _, _, pids = bench.spawn_many([argv] * n, d)
        bench.wait_exit = False
        stamps, _ = bench.await_stamps(d, n, pids, 120 if kind == "torchrun" else 30)
        if len(stamps) < n:
            out["note"] = "only %d/%d workers started" % (len(stamps), n)
            return out
        time.sleep(1.0)  # let the agents settle
        pss = rss = threads = 0
        worker_pss = 0
        procs_per_agent = 0
        for p in bench.procs.marked():
            if p == daemon_pid:
                continue
            m = proc_mem(p)
            if not m:
                continue
            cmd = proc_cmdline(p)
            if proc_comm(p) in ("sh", "sleep") and "torchrun" not in cmd and "ddprun" not in cmd:
                worker_pss += m[0]
                continue
            pss += m[0]
            rss += m[1]
            threads += m[2]
            procs_per_agent += 1
        out["pss_per_agent"] = pss / n
        out["rss_per_agent"] = rss / n
        out["threads_per_agent"] = threads / n
        out["procs_per_agent"] = procs_per_agent / n
        out["worker_pss"] = worker_pss / n
        out["avail_drop_per_agent"] = max(0, avail0 - mem_available()) / n
        out["kernel_per_agent"] = max(0, kernel_mem() - kern0) / n
        if daemon_pid:
            m = proc_mem(daemon_pid)
            out["daemon_rss"] = m[1] if m else None
    finally:
        bench.cleanup_step()
        bench.step_env(None)
        shutil.rmtree(d, ignore_errors=True)
    return out


def agent_cpu_probe(bench, crowd):
    """CPU of one agent's whole life (ddprun --standalone running /bin/true), with the machine's
    usual processes and with `crowd` more sleeping processes: the agent's cost per process
    present on the host, which N co-located agents multiply."""
    def cpu_of(argv, reps=10):
        c0 = children_cpu()
        m0 = time.monotonic()
        for _ in range(reps):
            subprocess.run(argv, env=bench.procs.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
        return (children_cpu() - c0) / reps, (time.monotonic() - m0) / reps

    agent = [bench.ddprun, "--standalone", "--nproc_per_node=1", "--no_python", "/bin/true"]
    bench.note_cmd("agent CPU probe", agent)
    bench.note_cmd("binary load probe", [bench.ddprun, "--version"])
    bench.note_cmd("binary load probe", [bench.multinode, "--version"])
    rows = []
    d = bench.newdir("probe")
    bench.step_env(d)
    try:
        for extra in (0, crowd):
            if extra:
                for i in range(extra):
                    bench.procs.spawn(["/bin/sleep", "600"], "/dev/null")
                time.sleep(0.5)
            nprocs = len([x for x in os.listdir("/proc") if x.isdigit()])
            ver = cpu_of([bench.ddprun, "--version"])[0]
            ver_mn = cpu_of([bench.multinode, "--version"])[0]
            cpu, wall = cpu_of(agent)
            rows.append((nprocs, ver, ver_mn, cpu, wall))
    finally:
        bench.cleanup_step()
        bench.step_env(None)
        shutil.rmtree(d, ignore_errors=True)
    return rows
