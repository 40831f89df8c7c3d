#!/usr/bin/env python3
"""Rendezvous capacity: many simulated agents against one real ddprun-rdzv, on loopback.

For every scenario and repetition this starts a fresh `ddprun-rdzv --port 0` (its log in a file),
runs `ddprun-rdzv-capacity` (bench/rdzv_capacity.cc: one process, one connection and Session
stream per simulated agent) against it with the daemon's pid, so that the generator reads the
daemon's CPU seconds and RSS from /proc at its phase boundaries, then stops the daemon. Writes a
markdown report (median and min-max of the repetitions), the raw results as JSON, and a plot of
join time and daemon CPU vs. nodes (bench/capacity.svg, SVG written here: no matplotlib needed).

Scenarios (min = max = nodes per job, heartbeat_timeout 5 s, agents heartbeat every 1.25 s):
  job-N      one job of N nodes (1000, 4000, 10000): join, then the workers' store bootstrap
             (N <= 4000: one more connection per agent), then 20 s of heartbeats only
  jobs-1000x8  1000 jobs of 8 nodes joining at once, interleaved

Build first (the bench targets are on by default, DDPRUN_BUILD_BENCH):
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build build-bench -- ddprun-rdzv ddprun-rdzv-capacity
  bench/rdzv_capacity.py --build build-bench --report /tmp/capacity.md --plot bench/capacity.svg
  bench/rdzv_capacity.py --smoke   (20 agents and 4 jobs of 3, once: does it still run?)

Stdlib only. Every child is bounded in time; the script never waits on one without a limit.
"""
import argparse
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib
from benchlib import loadavg, raise_nofile, rss_kb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCENARIOS = {
    "job-1000": dict(jobs=1, nodes=1000, store=True, steady=20),
    "job-4000": dict(jobs=1, nodes=4000, store=True, steady=20),
    "job-10000": dict(jobs=1, nodes=10000, store=False, steady=20),
    "jobs-1000x8": dict(jobs=1000, nodes=8, store=False, steady=0),
}
# --smoke (ctest "bench: rdzv_capacity.py smoke"): seconds, every phase of the generator once.
SMOKE = {
    "smoke-job-20": dict(jobs=1, nodes=20, store=True, steady=1),
    "smoke-jobs-4x3": dict(jobs=4, nodes=3, store=False, steady=0),
}
QUICK = {
    "job-1000": dict(jobs=1, nodes=1000, store=True, steady=5),
    "job-4000": dict(jobs=1, nodes=4000, store=True, steady=5),
    "jobs-100x8": dict(jobs=100, nodes=8, store=False, steady=0),
}

LOG_TIME = re.compile(r"^\[ddprun \w (\d\d):(\d\d):(\d\d)\.(\d\d\d)\]")


def log_times(log_path, anchor_ms):
    """Epoch ms of the first and last 'joined' line, and the count of heartbeat drops."""
    anchor = datetime.datetime.fromtimestamp(anchor_ms / 1000.0)
    joined = []
    drops = 0
    with open(log_path, errors="replace") as f:
        for line in f:
            if "no heartbeat for" in line:
                drops += 1
            if not line.rstrip().endswith("workers)") or " joined " not in line:
                continue
            m = LOG_TIME.match(line)
            if not m:
                continue
            h, mi, s, ms = (int(x) for x in m.groups())
            t = anchor.replace(hour=h, minute=mi, second=s, microsecond=ms * 1000)
            # The log has the time of day only: take the day that puts it nearest the anchor.
            best = min((t + datetime.timedelta(days=d) for d in (-1, 0, 1)), key=lambda x: abs((x - anchor).total_seconds()))
            joined.append(best.timestamp() * 1000.0)
    return (min(joined) if joined else None, max(joined) if joined else None, len(joined), drops)


def gen_command(gen, port, pid, spec, timeout_s):
    cmd = [gen, "--address", f"127.0.0.1:{port}", "--daemon_pid", str(pid), "--jobs", str(spec["jobs"]),
           "--nodes", str(spec["nodes"]), "--heartbeat_timeout_ms", "5000", "--timeout_s", str(timeout_s)]
    if spec["store"]:
        cmd.append("--store")
    if spec["steady"]:
        cmd += ["--steady_seconds", str(spec["steady"])]
    return cmd


def generator(build):
    # $DDPRUN_RDZV_CAPACITY: where ctest's build put it (bench/CMakeLists.txt).
    return os.environ.get("DDPRUN_RDZV_CAPACITY") or os.path.join(build, "bin", "ddprun-rdzv-capacity")


def run_one(build, name, spec, rep, log_level, workdir, guard="off"):
    rdzv = os.path.join(build, "bin", "ddprun-rdzv")
    gen = generator(build)
    log_path = os.path.join(workdir, f"{name}-{rep}.log")
    load_before = loadavg()
    proc, port = benchlib.start_rdzv(rdzv, log_path, ["--log_level", log_level, "--connection_guard", guard])
    try:
        time.sleep(0.3)
        idle_rss = rss_kb(proc.pid)
        timeout_s = 240 + spec["steady"]
        cmd = gen_command(gen, port, proc.pid, spec, timeout_s)
        started = time.monotonic()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout_s + 30,
                             preexec_fn=raise_nofile)
        wall = time.monotonic() - started
    finally:
        benchlib.stop(proc)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"{name}: no result (exit {out.returncode}): {out.stderr[-2000:]}")
    r = json.loads(lines[-1])
    r.update(scenario=name, rep=rep, rc=out.returncode, daemon_idle_rss_kb=idle_rss, load_before=load_before,
             load_after=loadavg(), run_wall_s=round(wall, 2), command=" ".join(cmd[:1] + ["--address", "127.0.0.1:PORT",
                                                                                         "--daemon_pid", "PID"] + cmd[5:]))
    if "first_join_epoch_ms" in r:
        first, last, count, drops = log_times(log_path, r["first_join_epoch_ms"])
        r["log_joined_lines"] = count
        r["log_heartbeat_drops"] = drops
        if last is not None:
            # When the daemon had handled every Join (its log line), relative to the first Join sent.
            r["daemon_last_join_logged_s"] = round((last - r["first_join_epoch_ms"]) / 1000.0, 4)
            r["daemon_last_join_to_all_assigned_s"] = round((r["all_assigned_epoch_ms"] - last) / 1000.0, 4)
    return r


# ---- report ----

def med(rs, key, scale=1.0):
    vals = [r[key] * scale for r in rs if key in r and r[key] is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)


def fmt(stat, digits=2, spread=True):
    if stat is None:
        return "-"
    m, lo, hi = stat
    if not spread or lo == hi:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def report(results, args, machine, commit, started, finished):
    by = {}
    for r in results:
        by.setdefault(r["scenario"], []).append(r)
    order = [n for n in dict.fromkeys(list(SCENARIOS) + list(QUICK) + list(SMOKE)) if n in by]
    mb = 1 / 1024.0
    out = []
    out.append(f"Runs: {started} to {finished} (UTC), tree {commit}, {args.reps} repetitions each, "
               f"median (min-max), connection guard {args.guard}. Machine: {machine}.")
    loads = [r["load_before"] for r in results] + [r["load_after"] for r in results]
    out.append(f"1-minute load average before/after the runs: {min(loads):.2f}-{max(loads):.2f} "
               f"(median {statistics.median(loads):.2f}); the generator and the daemon share the 2 cores.")
    out.append("")
    out.append("Join (min = max = nodes per job; connections and Session streams already open):")
    out.append("")
    out.append("| scenario | agents | first Join -> all assigned (s) | last Join sent -> all assigned (s) | "
               "daemon had handled every Join at (s) | daemon CPU in the join (s) | daemon CPU per agent (us) | "
               "generator CPU in the join (s) | daemon RSS after the join (MiB) | per job, its last Join -> its nodes assigned p50 / max (s) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in order:
        rs = by[n]
        agents = rs[0]["agents"]
        per = [dict(x=r["join_daemon_cpu_s"] * 1e6 / agents) for r in rs]
        out.append(f"| {n} | {agents} | {fmt(med(rs, 'first_join_to_all_assigned_s'), 3)} | "
                   f"{fmt(med(rs, 'last_join_sent_to_all_assigned_s'), 3)} | {fmt(med(rs, 'daemon_last_join_logged_s'), 3)} | "
                   f"{fmt(med(rs, 'join_daemon_cpu_s'))} | {fmt(med(per, 'x'), 0)} | {fmt(med(rs, 'join_gen_cpu_s'))} | "
                   f"{fmt(med(rs, 'join_daemon_hwm_kb', mb), 0)} | "
                   f"{fmt(med(rs, 'job_close_p50_s'), 3, False)} / {fmt(med(rs, 'job_close_max_s'), 3, False)} |")
    out.append("")
    out.append("Connections (before the join; real agents connect and join in one go):")
    out.append("")
    out.append("| scenario | connections | connect + open streams (s) | daemon CPU (s) | generator CPU (s) | "
               "daemon RSS idle / connected / with streams (MiB) | daemon RSS per agent (KiB) |")
    out.append("|---|---|---|---|---|---|---|")
    for n in order:
        rs = by[n]
        agents = rs[0]["agents"]
        per = [dict(x=(r["join_daemon_hwm_kb"] - r["daemon_idle_rss_kb"]) / agents) for r in rs]
        out.append(f"| {n} | {agents} | {fmt(med(rs, 'connect_wall_s'))} | {fmt(med(rs, 'connect_daemon_cpu_s'))} | "
                   f"{fmt(med(rs, 'connect_gen_cpu_s'))} | {fmt(med(rs, 'daemon_idle_rss_kb', mb), 0, False)} / "
                   f"{fmt(med(rs, 'connect_daemon_rss_before_streams_kb', mb), 0, False)} / "
                   f"{fmt(med(rs, 'connect_daemon_rss_kb', mb), 0, False)} | {fmt(med(per, 'x'), 1, False)} |")
    steady = [n for n in order if any("steady_daemon_cpu_per_s" in r for r in by[n])]
    if steady:
        out.append("")
        out.append("Heartbeats (steady state: every agent heartbeats every 1.25 s, keepalive pings every 2.5 s as "
                   "ddprun's agents; heartbeat_timeout 5 s):")
        out.append("")
        out.append("| scenario | window (s) | heartbeats/s | daemon CPU per second | daemon CPU per heartbeat (us) | "
                   "generator CPU per second | nodes dropped (daemon log) | agents told anything |")
        out.append("|---|---|---|---|---|---|---|---|")
        for n in steady:
            rs = by[n]
            out.append(f"| {n} | {fmt(med(rs, 'steady_wall_s'), 1, False)} | {fmt(med(rs, 'steady_heartbeats_per_s'), 0)} | "
                       f"{fmt(med(rs, 'steady_daemon_cpu_per_s'), 3)} | {fmt(med(rs, 'steady_daemon_us_per_heartbeat'), 1)} | "
                       f"{fmt(med(rs, 'steady_gen_cpu_per_s'), 3)} | "
                       f"{sum(r.get('log_heartbeat_drops', 0) for r in rs)} | {sum(r.get('steady_disturbed', 0) for r in rs)} |")
    store = [n for n in order if any("store_all_done_s" in r for r in by[n])]
    if store:
        out.append("")
        out.append("Store (the workers' bootstrap: one more connection and Store Session stream per node; from a common "
                   "start each sets its key, then gets its neighbour's, waiting for it):")
        out.append("")
        out.append("| scenario | workers | connect + open streams (s) | start -> every get answered (s) | set p50 / p99 (ms) | "
                   "get p50 / p99 (ms) | daemon CPU (s) | generator CPU (s) | daemon RSS after (MiB) |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for n in store:
            rs = by[n]
            out.append(f"| {n} | {rs[0]['store_clients']} | {fmt(med(rs, 'store_connect_wall_s'))} | "
                       f"{fmt(med(rs, 'store_all_done_s'), 3)} | {fmt(med(rs, 'store_set_p50_s', 1000), 1, False)} / "
                       f"{fmt(med(rs, 'store_set_p99_s', 1000), 1, False)} | {fmt(med(rs, 'store_get_p50_s', 1000), 1, False)} / "
                       f"{fmt(med(rs, 'store_get_p99_s', 1000), 1, False)} | {fmt(med(rs, 'store_daemon_cpu_s'))} | "
                       f"{fmt(med(rs, 'store_gen_cpu_s'))} | {fmt(med(rs, 'store_daemon_rss_kb', mb), 0)} |")
    out.append("")
    out.append("Daemon peak RSS over the whole run (VmHWM at the end, MiB): " + ", ".join(
        f"{n} {fmt(med(by[n], 'daemon_hwm_kb', mb), 0)}" for n in order) + ".")
    failed = [r for r in results if r.get("error") or r.get("rc")]
    out.append("")
    out.append("Failed runs: " + ("none" if not failed else "; ".join(
        f"{r['scenario']}#{r['rep']}: rc {r.get('rc')} {r.get('error')}" for r in failed)) + ".")
    out.append("")
    out.append("Exact commands (PORT and PID: the daemon's, one fresh daemon per run):")
    out.append("")
    out.append("```")
    out.append(f"{os.path.join(args.build, 'bin', 'ddprun-rdzv')} --port 0 --log_level {args.log_level} "
               f"--connection_guard {args.guard} 2>LOG")
    for n in order:
        out.append(by[n][0]["command"])
    out.append("```")
    return "\n".join(out) + "\n"


# ---- plot (SVG by hand) ----

def svg_plot(results, path):
    job = {}
    for r in results:
        if r["scenario"].startswith("job-"):
            job.setdefault(r["agents"], []).append(r)
    xs = sorted(job)
    if len(xs) < 2:
        return False
    W, H = 980, 400
    # (title, y label, series, goal line or None)
    panels = [
        ("Join: one job of N nodes", "seconds", [
            ("first Join -> all assigned (wall)", "first_join_to_all_assigned_s", "#1f77b4"),
            ("daemon CPU in the join", "join_daemon_cpu_s", "#d62728"),
            ("generator CPU in the join", "join_gen_cpu_s", "#7f7f7f"),
        ], (2.0, "goal: 10,000 nodes in 2 s")),
        ("Steady state: heartbeats only", "CPU seconds per second", [
            ("daemon", "steady_daemon_cpu_per_s", "#d62728"),
            ("generator", "steady_gen_cpu_per_s", "#7f7f7f"),
        ], None),
    ]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
             f'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']
    pw, ph, top, left0 = 400, 270, 40, 70
    xmax = max(xs) * 1.05
    for p, (title, ylabel, series, goal) in enumerate(panels):
        x0 = left0 + p * (pw + 90)
        vals = []
        for _, key, _ in series:
            first = [r[key] for r in job[xs[0]] if key in r]
            if first:  # the linear reference's end
                vals.append(statistics.median(first) / xs[0] * xs[-1])
            for x in xs:
                vals += [r[key] for r in job[x] if key in r]
        if not vals:
            continue
        if goal:
            vals.append(goal[0])
        ymax = max(vals) * 1.15 or 1
        def X(v):
            return x0 + v / xmax * pw
        def Y(v):
            return top + ph - v / ymax * ph
        parts.append(f'<text x="{x0 + pw / 2}" y="{top - 18}" text-anchor="middle" font-size="14">{title}</text>')
        parts.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        for i in range(6):
            yv = ymax * i / 5
            parts.append(f'<line x1="{x0}" y1="{Y(yv):.1f}" x2="{x0 + pw}" y2="{Y(yv):.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{x0 - 6}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
        for x in [0] + xs:
            parts.append(f'<line x1="{X(x):.1f}" y1="{top + ph}" x2="{X(x):.1f}" y2="{top + ph + 5}" stroke="#444"/>')
            parts.append(f'<text x="{X(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{x}</text>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{top + ph + 36}" text-anchor="middle">nodes (agents)</text>')
        parts.append(f'<text x="{x0 - 50}" y="{top + ph / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 {x0 - 50} {top + ph / 2})">{ylabel}</text>')
        if goal:
            parts.append(f'<line x1="{x0}" y1="{Y(goal[0]):.1f}" x2="{x0 + pw}" y2="{Y(goal[0]):.1f}" stroke="black" '
                         f'stroke-dasharray="8 3"/>')
            parts.append(f'<text x="{x0 + pw - 6}" y="{Y(goal[0]) - 5:.1f}" text-anchor="end">{goal[1]}</text>')
        ly = top + 14
        for label, key, color in series:
            pts = []
            for x in xs:
                v = [r[key] for r in job[x] if key in r]
                if not v:
                    continue
                m = statistics.median(v)
                pts.append((x, m))
                parts.append(f'<line x1="{X(x):.1f}" y1="{Y(min(v)):.1f}" x2="{X(x):.1f}" y2="{Y(max(v)):.1f}" '
                             f'stroke="{color}" stroke-width="2"/>')
                parts.append(f'<circle cx="{X(x):.1f}" cy="{Y(m):.1f}" r="3.5" fill="{color}"/>')
            if not pts:
                continue
            parts.append('<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>'.format(
                color, " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)))
            # Linear through the smallest point: a curve above it grows faster than linearly.
            x1, y1 = pts[0]
            parts.append(f'<line x1="{X(0):.1f}" y1="{Y(0):.1f}" x2="{X(xs[-1]):.1f}" y2="{Y(y1 / x1 * xs[-1]):.1f}" '
                         f'stroke="{color}" stroke-dasharray="4 4" stroke-width="1"/>')
            parts.append(f'<rect x="{x0 + 10}" y="{ly - 9}" width="12" height="3" fill="{color}"/>')
            parts.append(f'<text x="{x0 + 28}" y="{ly}">{label}</text>')
            ly += 16
        parts.append(f'<text x="{x0 + 10}" y="{ly}" fill="#555">dashed: linear from the smallest N; bars: min-max of the runs</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--quick", action="store_true", help="small scenarios, 5 s of heartbeats")
    ap.add_argument("--smoke", action="store_true", help="tiny scenarios once, 1 s of heartbeats: does it still run?")
    ap.add_argument("--log_level", default="info", help="the daemon's (info, as deployed)")
    ap.add_argument("--guard", choices=("off", "on"), default="off",
                    help="the daemon's --connection_guard (on by default in ddprun). Since issue #37 off relays "
                         "too (three descriptors per agent): 10,000 agents need a limit of about 31,000; the "
                         "unrelayed figures of bench/RESULTS_MULTINODE.md are of the old off (docs/rendezvous.md)")
    ap.add_argument("--report", default="", help="markdown file to write (default: stdout only)")
    ap.add_argument("--json", default="", help="raw results, one JSON object per run")
    ap.add_argument("--plot", default="", help="SVG file to write")
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between runs")
    ap.add_argument("--from_json", default="", help="run nothing: report and plot the results of an earlier --json")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            results = [json.loads(line) for line in f if line.strip()]
        ok = [r for r in results if "join_daemon_cpu_s" in r]
        text = report(ok, args, results[0].get("machine", "see the report"), results[0].get("commit", "unknown"),
                      results[0].get("started", "?"), results[0].get("finished", "?")) if ok else "no result\n"
        print(text)
        if args.report:
            with open(args.report, "w") as f:
                f.write(text)
        if args.plot and ok:
            svg_plot(ok, args.plot)
        return 0 if ok else 1
    if not 1 <= args.reps <= 10:
        ap.error("--reps must be 1-10")
    if args.smoke:
        args.reps, args.pause = 1, 0.2
    for exe in (os.path.join(args.build, "bin", "ddprun-rdzv"), generator(args.build)):
        if not os.access(exe, os.X_OK):
            sys.exit(f"missing {exe}: build it first (see --help)")
    scenarios = SMOKE if args.smoke else QUICK if args.quick else SCENARIOS
    names = [n for n in scenarios if not args.only or n in args.only.split(",")]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # The generator holds a descriptor per connection; the daemon three with the guard.
    per_connection = 3 if args.guard == "on" else 1
    need = max(scenarios[n]["jobs"] * scenarios[n]["nodes"] * (2 if scenarios[n]["store"] else 1) for n in names)
    need = need * per_connection + 256
    if hard < need:
        sys.exit(f"open-file hard limit {hard} is under {need}: raise it (ulimit -Hn) first")
    commit = benchlib.git_rev()
    started = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")
    results = []
    with tempfile.TemporaryDirectory(prefix="rdzv-capacity-") as workdir:
        for rep in range(args.reps):
            for name in names:
                try:
                    r = run_one(args.build, name, scenarios[name], rep, args.log_level, workdir, args.guard)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    r = dict(scenario=name, rep=rep, rc=-1, error=str(e)[:500], agents=0,
                             load_before=loadavg(), load_after=loadavg())
                results.append(r)
                brief = {k: r.get(k) for k in ("scenario", "rep", "first_join_to_all_assigned_s", "join_daemon_cpu_s",
                                                "join_daemon_hwm_kb", "steady_daemon_cpu_per_s", "store_all_done_s",
                                                "load_before", "error")}
                print(json.dumps(brief), flush=True)
                time.sleep(args.pause)
    finished = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")
    machine = benchlib.machine_text()
    for r in results:
        r.update(machine=machine, commit=commit, started=started, finished=finished)
    ok = [r for r in results if "join_daemon_cpu_s" in r]
    text = report(ok, args, machine, commit, started, finished) if ok else "no successful run\n"
    failed = [r for r in results if r not in ok]
    # A run that joined but then failed (rc or error set: a later phase) fails the whole too.
    broken = [r for r in results if r.get("rc") or r.get("error")]
    if failed:
        text += "\nRuns without results: " + "; ".join(f"{r['scenario']}#{r['rep']}: {r.get('error')}" for r in failed) + "\n"
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    if args.plot and ok:
        svg_plot(ok, args.plot)
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
