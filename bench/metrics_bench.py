#!/usr/bin/env python3
"""The metrics port under load: a scrape of a ddprun-rdzv that holds a 10,000-node job (the load
generator, bench/rdzv_capacity.cc), and what scraping costs the heartbeats.

Each repetition runs the same generator scenario twice, interleaved, against a fresh daemon:
  off   ddprun-rdzv without a metrics port
  on    ddprun-rdzv --metrics_port 0, scraped once a second (as a Prometheus would, but 15x as
        often as its default) for the whole run
and reports, per mode, the generator's steady-phase daemon CPU per heartbeat (its own figure,
steady_daemon_us_per_heartbeat) and, for "on", every scrape's wall time with the job's node count
at that scrape (the sum of ddprun_nodes). The ratio on/off of the heartbeat cost is the
"heartbeat cost unchanged" figure; the scrapes taken while 10,000 nodes were held are the "under
100 ms" figure.

  bench/metrics_bench.py --build build --nodes 10000 --reps 3 --report /tmp/metrics.md
  bench/metrics_bench.py --smoke      (100 nodes, once, 2 s of heartbeats: does it still run?)

Stdlib only; every child bounded in time.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import benchlib
from benchlib import raise_nofile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_daemon(rdzv, log_path, metrics):
    extra = ["--log_level", "warning", "--connection_guard", "off"]
    if metrics:
        extra += ["--metrics_port", "0"]
    proc, port = benchlib.start_rdzv(rdzv, log_path, extra)
    metrics_addr = None
    if metrics:
        line = proc.stdout.readline()
        m = re.search(r"metrics on (\S+:\d+)", line)
        if not m:
            benchlib.stop(proc)
            raise RuntimeError("no metrics address: %r" % line)
        metrics_addr = m.group(1)
    return proc, port, metrics_addr


class Scraper(threading.Thread):
    """GET /metrics every `interval` s until stopped; records (seconds, nodes, bytes) per scrape."""

    def __init__(self, addr, interval):
        super().__init__(daemon=True)
        self.addr, self.interval = addr, interval
        self.samples, self.errors = [], 0
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen("http://%s/metrics" % self.addr, timeout=10) as r:
                    body = r.read().decode()
                took = time.monotonic() - t0
                nodes = sum(float(l.rsplit(" ", 1)[1]) for l in body.splitlines() if l.startswith("ddprun_nodes{"))
                self.samples.append((took, int(nodes), len(body)))
            except OSError:
                self.errors += 1
            self.stopping.wait(max(0.0, self.interval - (time.monotonic() - t0)))


def run_mode(build, mode, nodes, steady, workdir, rep):
    rdzv = os.path.join(build, "bin", "ddprun-rdzv")
    gen = os.environ.get("DDPRUN_RDZV_CAPACITY") or os.path.join(build, "bin", "ddprun-rdzv-capacity")
    proc, port, maddr = start_daemon(rdzv, os.path.join(workdir, "%s-%d.log" % (mode, rep)), mode == "on")
    scraper = Scraper(maddr, 1.0) if maddr else None
    try:
        if scraper:
            scraper.start()
        timeout_s = 240 + steady
        cmd = [gen, "--address", "127.0.0.1:%d" % port, "--daemon_pid", str(proc.pid), "--jobs", "1", "--nodes",
               str(nodes), "--heartbeat_timeout_ms", "5000", "--timeout_s", str(timeout_s), "--steady_seconds",
               str(steady)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout_s + 30,
                             preexec_fn=raise_nofile)
    finally:
        if scraper:
            scraper.stopping.set()
            scraper.join(15)
        benchlib.stop(proc)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError("%s: no result (exit %d): %s" % (mode, out.returncode, out.stderr[-2000:]))
    r = json.loads(lines[-1])
    result = {"mode": mode, "rep": rep, "nodes": nodes, "rc": out.returncode,
              "us_per_heartbeat": r.get("steady_daemon_us_per_heartbeat"),
              "daemon_cpu_per_s": r.get("steady_daemon_cpu_per_s"), "join_s": r.get("join_s")}
    if scraper:
        full = [s for s in scraper.samples if s[1] >= nodes]
        result.update(scrapes=len(scraper.samples), scrape_errors=scraper.errors, full_scrapes=len(full),
                      full_scrape_ms=[round(s[0] * 1000, 2) for s in full],
                      scrape_bytes=max((s[2] for s in full), default=0))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--steady", type=float, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--report", default="")
    args = ap.parse_args()
    if args.smoke:
        args.nodes, args.steady, args.reps = 100, 2, 1
    results = []
    with tempfile.TemporaryDirectory(prefix="ddprun-metrics-bench-") as workdir:
        for rep in range(args.reps):
            for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                r = run_mode(args.build, mode, args.nodes, args.steady, workdir, rep)
                print(json.dumps(r), flush=True)
                results.append(r)
                time.sleep(2)
    off = [r["us_per_heartbeat"] for r in results if r["mode"] == "off" and r["us_per_heartbeat"]]
    on = [r["us_per_heartbeat"] for r in results if r["mode"] == "on" and r["us_per_heartbeat"]]
    scrapes = [ms for r in results if r["mode"] == "on" for ms in r["full_scrape_ms"]]
    lines = ["| figure | value |", "|---|---|",
             "| nodes held | %d |" % args.nodes,
             "| daemon CPU per heartbeat, no metrics port (median of %d) | %.1f us |" % (len(off), statistics.median(off)) if off else "| off | - |",
             "| daemon CPU per heartbeat, scraped every second (median of %d) | %.1f us |" % (len(on), statistics.median(on)) if on else "| on | - |",
             "| ratio on/off | %.2fx |" % (statistics.median(on) / statistics.median(off)) if on and off else "| ratio | - |",
             "| scrapes while every node was held | %d |" % len(scrapes),
             "| scrape time, median / max | %.1f ms / %.1f ms |" % (statistics.median(scrapes), max(scrapes)) if scrapes else "| scrape time | - |",
             "| scrape size | %d bytes |" % max((r.get("scrape_bytes", 0) for r in results), default=0)]
    text = "\n".join(lines)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
