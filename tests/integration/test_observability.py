"""ddprun-rdzv's observability, seen by a real Prometheus server and by `ddprun-rdzv status`.

One 2-node elastic job on loopback: a daemon with a job token and --metrics_port, scraped every
second by Debian's `prometheus` (started under the test's temp dir), and two agents with
--max_restarts=2. Rank 1 exits 3 in the first attempt once Prometheus has seen the first round; then
every worker holds until the test lets it go. While the job runs:

- Prometheus (/api/v1/query): the target is up; a scrape of the first round sees
  ddprun_rounds_formed_total == 1 and sum(ddprun_nodes) == 2; after the failure,
  ddprun_rounds_formed_total reaches 2 (and increase() over a minute shows the new round),
  ddprun_restarts_total{cause="worker_exit"} is 1 and a scrape sees both nodes again.
- The exposition passes `promtool check metrics` without a word; /healthz and /readyz answer 200.
- `ddprun-rdzv status --json` lists both nodes (group ranks 0 and 1, running), round 2, one restart
  of 2 and the last failure (worker_failed, worker_exit, exit code 3, rank 1, round 1); the table
  names both nodes; a wrong token exits 2 ("invalid job token"), an unknown --rdzv_id exits 1.
- docs/grafana/ddprun-dashboard.json: the run_id variable's label_values(ddprun_job_events_total,
  run_id) lists the job; every panel query ($run_id and $__rate_interval filled in) runs as an instant query with status
  "success" and names only metrics the daemon exposes; the job's nodes and rounds panels show data.
Then the job ends with exit status 0, the restart count unchanged, and nothing of it is left.

The daemon labels a job's series run_id="<run id>" (not "job": Prometheus gives that label to the
scrape target), so a plain scrape config keeps it.

Skipped when /usr/bin/prometheus or /usr/bin/promtool is missing. Every wait is a safety timeout,
not a speed claim; the daemon, agents, workers and Prometheus are killed and the temp dir removed
even when the test fails.
"""

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import ddprun_testlib as tl
import multinode_lib as ml
from ddprun_testlib import main

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
DASHBOARD = os.path.join(tl.REPO, "docs", "grafana", "ddprun-dashboard.json")
SCRAPE_JOB = "ddprun-rdzv"
RATE_INTERVAL = "5s"  # stands for Grafana's $__rate_interval: several 1 s scrapes
# What the dashboard must show (histograms through their buckets).
DASHBOARD_METRICS = {
    "ddprun_nodes", "ddprun_rounds_formed_total", "ddprun_restarts_total", "ddprun_failures_total",
    "ddprun_round_formation_seconds_bucket", "ddprun_heartbeat_lag_seconds_bucket", "ddprun_store_operations_total",
    "ddprun_store_operation_seconds_total", "ddprun_connections_open", "ddprun_guard_closed_connections_total",
    "process_resident_memory_bytes", "process_open_fds"}

PROMETHEUS_YML = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: %(job)s
    static_configs:
      - targets: ["127.0.0.1:%(port)d"]
  - job_name: ddprun-agent
    static_configs:
      - targets: [%(agents)s]
"""

# Rank 1 of the first attempt exits 3 when the file "fail" appears; every other start exits 0 when
# "release" appears. Each waits 60 s at most, so that the job runs through many scrapes but ends.
WORKER = """\
#!/bin/sh
n=0
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  while [ ! -e "%(d)s/fail" ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
  exit 3
fi
while [ ! -e "%(d)s/release" ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
exit 0
"""


def http_get(url, timeout=5.0):
    """(status, body) of a GET; HTTP errors are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def metric_names(exposition):
    """Names of the series in a Prometheus text exposition."""
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", exposition, re.M)}


def names_in_expr(expr):
    return set(re.findall(r"\b((?:ddprun|process)_[a-zA-Z0-9_]+)", expr))


def dashboard_targets(dashboard):
    """(panel title, expr) of every panel target, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel] + panel.get("panels", []):
            out += [(p["title"], t["expr"]) for t in p.get("targets", [])]
    return out


class ObservabilityTest(ml.MultiNodeTestCase):

    def setUp(self):
        for tool in (PROMETHEUS, PROMTOOL):
            if not os.access(tool, os.X_OK):
                self.skipTest("%s not found (Debian package prometheus): a real Prometheus server is what this "
                              "test scrapes with" % tool)
        super().setUp()
        self.token = "tok-" + uuid.uuid4().hex
        self.token_path = self.write_file("token", self.token + "\n")
        self.jobs = []  # the agents
        self.procs = []  # the daemon and Prometheus
        # Each agent's own metrics port (ddprun --metrics_port) and --timeline file.
        self.agent_ports = [ml.free_port(), ml.free_port()]
        self.timelines = [self.path("timeline_a.jsonl"), self.path("timeline_b.jsonl")]

    # --- processes -----------------------------------------------------------------------
    def start_daemon(self):
        port = ml.free_port()
        daemon = ml.Daemon(self, port, token_file=self.token_path, extra=["--metrics_port", "0"])
        self.procs.append(daemon)
        found = self.wait_until("the daemon to print its metrics port (on loopback by default)",
                                lambda: re.search(r"metrics on 127\.0\.0\.1:(\d+)", daemon.stdout()))
        self.metrics_port = int(found.group(1))
        return daemon

    def start_prometheus(self):
        folder = self.path("prometheus")
        os.makedirs(folder)
        config = self.write_file("prometheus/prometheus.yml",
                                 PROMETHEUS_YML % {"job": SCRAPE_JOB, "port": self.metrics_port,
                                                   "agents": ", ".join('"127.0.0.1:%d"' % p for p in self.agent_ports)})
        self.prom_port = ml.free_port()
        argv = [PROMETHEUS, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(folder, "data"),
                "--web.listen-address=127.0.0.1:%d" % self.prom_port, "--log.level=warn"]
        prom = ml.Proc(self, argv, name="prometheus")
        self.procs.append(prom)
        self.wait_until("Prometheus to be ready", self.prom_ready)
        self.wait_until("Prometheus to scrape the daemon", lambda: self.values(
            'up{job="%s",instance="127.0.0.1:%d"} == 1' % (SCRAPE_JOB, self.metrics_port)))
        return prom

    def prom_ready(self):
        try:
            return http_get("http://127.0.0.1:%d/-/ready" % self.prom_port, 1)[0] == 200
        except OSError:
            return False

    def start_job(self, port):
        prog = self.write_file("worker.sh", WORKER % {"d": self.tmp}, executable=True)
        conf = "is_host=0,token_file=" + self.token_path
        self.jobs = [self.agent(tag, self.elastic_args(2, port, conf=conf, extra=[
            "--max_restarts=2", "--metrics_port=%d" % self.agent_ports[i], "--timeline=" + self.timelines[i]]) + [prog])
                     for i, tag in enumerate(("a", "b"))]

    # --- waiting and asking ---------------------------------------------------------------
    def wait_until(self, what, probe, timeout=ml.SAFETY_TIMEOUT_S):
        """Polls probe() until it returns something true (returned); fails on the safety timeout or
        when the daemon, Prometheus or an agent exits meanwhile."""
        procs = self.procs + self.jobs
        deadline = time.monotonic() + timeout
        last = None
        while True:
            last = probe()
            if last:
                return last
            for p in procs:
                if p.poll() is not None:
                    self.fail("%s exited (%s) while waiting for %s\n%s" % (
                        p.cmd[0], p.poll(), what, p.result(p.poll()).describe()))
            if time.monotonic() > deadline:
                self.fail("timed out after %ss waiting for %s (last: %r)\n%s" % (
                    timeout, what, last, self.describe_all(self.jobs)))
            time.sleep(0.2)

    def query(self, expr):
        """Prometheus's answer to an instant query: {"status": ..., "data": ..., "error": ...}."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (self.prom_port, urllib.parse.urlencode({"query": expr}))
        return json.loads(http_get(url)[1])

    def values(self, expr):
        """The instant vector's values (floats), or [] (asserts the query succeeded)."""
        answer = self.query(expr)
        self.assertEqual(answer.get("status"), "success", "query %s failed: %s" % (expr, answer))
        return [float(r["value"][1]) for r in answer["data"]["result"]]

    def status(self, *args, env=None):
        cmd = [ml.RDZV, "status", "--rdzv_endpoint", "127.0.0.1:%d" % self.daemon.port] + list(args)
        full_env = {k: v for k, v in os.environ.items() if k != "DDPRUN_RDZV_TOKEN"}
        full_env.update(env or {})
        return subprocess.run(cmd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=ml.SAFETY_TIMEOUT_S)

    def status_json(self):
        res = self.status("--rdzv_id", self.run_id, "--json", "--token_file", self.token_path)
        self.assertEqual(res.returncode, 0, "status --json failed: %s\n%s" % (res.stdout, res.stderr))
        return json.loads(res.stdout)

    # --- the test ---------------------------------------------------------------------------
    def test_job_in_prometheus_status_and_dashboard(self):
        self.daemon = self.start_daemon()
        self.start_prometheus()
        self.start_job(self.daemon.port)
        self.check_probes()

        self.check_first_round()
        self.write_file("fail", "rank 1 exits 3 now\n")
        self.check_restart()
        exposed = self.check_exposition()
        self.check_agents()
        self.check_status()
        self.check_dashboard(exposed)

        self.release()
        for res in self.wait_all(self.jobs, ml.SAFETY_TIMEOUT_S):
            self.assert_exit(res, 0)
        self.assert_no_leftovers(self.jobs)
        self.assertEqual(self.values('ddprun_restarts_total{run_id="%s",cause="worker_exit"}' % self.run_id), [1.0])
        self.check_after_the_end()
        self.check_timelines()

    def check_agents(self):
        """Each agent's metrics port: Prometheus scrapes it, promtool accepts it, and it shows the
        node's running worker and its one restart."""
        self.wait_until("Prometheus to scrape both agents", lambda: self.values('sum(up{job="ddprun-agent"}) == 2'))
        self.wait_until("both agents' restart in Prometheus",
                        lambda: self.values('sum(ddprun_agent_restarts_total{job="ddprun-agent"}) == 2'))
        for port in self.agent_ports:
            self.assertEqual(http_get("http://127.0.0.1:%d/readyz" % port)[0], 200)
            code, text = http_get("http://127.0.0.1:%d/metrics" % port)
            self.assertEqual(code, 200)
            res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                                 timeout=ml.SAFETY_TIMEOUT_S)
            self.assertEqual((res.returncode, res.stdout + res.stderr), (0, ""), "promtool on the agent's port")
            self.assertIn('ddprun_agent_workers{state="running"} 1', text)
            self.assertIn("ddprun_agent_restarts_total 1", text)
            self.assertIn("process_resident_memory_bytes", text)
        # The node whose rank failed counts it, by cause.
        self.assertEqual(self.values('sum(ddprun_agent_worker_failures_total{cause="worker_exit"})'), [1.0])

    def check_timelines(self):
        """Both agents' --timeline files, merged in the job's event order, tell the job: round 1 on
        both, rank 1 failing with exit code 3, the interruption, round 2 on both, the end (exit 0)."""
        events = []
        for path in self.timelines:
            with open(path) as f:
                lines = [json.loads(line) for line in f]
            self.assertEqual([e["n"] for e in lines], list(range(1, len(lines) + 1)), path)
            self.assertEqual([e["seq"] for e in lines], sorted(e["seq"] for e in lines), "out of order: %s" % path)
            events += lines
        events.sort(key=lambda e: (e["seq"], e["time"]))
        kinds = [(e["event"], e.get("round")) for e in events]
        failed = [e for e in events if e["event"] == "worker_failed"]
        self.assertEqual([(e["rank"], e["exit_code"], e["cause"], e["round"]) for e in failed],
                         [(1, 3, "worker_exit", 1)], events)
        self.assertEqual(kinds.count(("round_formed", 1)), 2, kinds)
        self.assertEqual(kinds.count(("round_formed", 2)), 2, kinds)
        self.assertEqual(kinds.count(("job_ended", 2)), 2, kinds)
        self.assertEqual({e["exit_status"] for e in events if e["event"] == "job_ended"}, {0})
        first_failure = kinds.index(("worker_failed", 1))
        self.assertLess(max(i for i, k in enumerate(kinds) if k == ("round_formed", 1)), first_failure, kinds)
        self.assertLess(first_failure, min(i for i, k in enumerate(kinds) if k == ("round_formed", 2)), kinds)
        # The other node heard of it as the interruption of round 1.
        other = [e for e in events if e["event"] == "round_interrupted" and e["node"] != failed[0]["node"]]
        self.assertEqual(len(other), 1, events)
        self.assertIn("failed", other[0]["reason"])
        members = [e["members"] for e in events if e["event"] == "round_formed"]
        self.assertEqual(len({tuple(m) for m in members}), 1, members)
        self.assertEqual(sorted(members[0]), sorted({e["node"] for e in events}), members)

    def check_after_the_end(self):
        """Two bugs Prometheus showed (each failed here before its fix): a job that succeeded counted
        its agents' streams ending as nodes lost, and ddprun_connections_open never went down."""
        def scraped(name, **labels):
            """The values of `name`'s samples that carry every label given (in any order)."""
            code, text = http_get("http://127.0.0.1:%d/metrics" % self.metrics_port)
            self.assertEqual(code, 200)
            out = []
            for line in text.splitlines():
                m = re.match(r"(\w+)(?:\{(.*)\})? (\S+)$", line)
                if m and m.group(1) == name:
                    have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                    if all(have.get(k) == v for k, v in labels.items()):
                        out.append(float(m.group(3)))
            return out
        # The job's series stay for 2 minutes after it is forgotten: its failures are the one worker's.
        self.assertEqual(scraped("ddprun_failures_total", run_id=self.run_id, cause="node_lost"), [0.0])
        self.assertEqual(scraped("ddprun_failures_total", run_id=self.run_id, cause="worker_exit"), [1.0])
        # Both agents are gone: their connections are no longer open (the scrape's own is HTTP, not
        # the daemon's gRPC port; the status calls above closed theirs).
        self.jobs = []  # they exited 0, as they should: wait_until watches the daemon and Prometheus only
        self.wait_until("ddprun_connections_open to fall to 0", lambda: scraped("ddprun_connections_open") == [0.0])

    def check_probes(self):
        for probe in ("/healthz", "/readyz"):
            code, body = http_get("http://127.0.0.1:%d%s" % (self.metrics_port, probe))
            self.assertEqual(code, 200, "%s answered %s: %s" % (probe, code, body))

    def check_first_round(self):
        job = self.run_id
        self.wait_until("a scrape with both nodes running the first round",
                        lambda: self.values('sum(ddprun_nodes{run_id="%s",state="running"}) == 2' % job))
        self.assertEqual(self.values('sum(ddprun_nodes{run_id="%s"})' % job), [2.0])
        self.assertEqual(self.values('ddprun_rounds_formed_total{run_id="%s"}' % job), [1.0])
        self.assertEqual(self.values('sum(ddprun_restarts_total{run_id="%s"}) > 0' % job), [], "restarted too early")

    def check_restart(self):
        job = self.run_id
        self.wait_until("rounds_formed_total >= 2",
                        lambda: self.values('ddprun_rounds_formed_total{run_id="%s"} >= 2' % job))
        restarts = self.wait_until("the restart in Prometheus", lambda: self.values(
            'ddprun_restarts_total{run_id="%s",cause="worker_exit"}' % job))
        self.assertEqual(restarts, [1.0], "one worker failure, one restart")
        self.assertEqual(self.values('up{job="%s"}' % SCRAPE_JOB), [1.0])
        self.wait_until("a scrape with both nodes running the second round",
                        lambda: self.values('sum(ddprun_nodes{run_id="%s",state="running"}) == 2 and on() '
                                            'ddprun_rounds_formed_total{run_id="%s"} >= 2' % (job, job)))
        self.assertEqual(self.values('sum(ddprun_nodes{run_id="%s"})' % job), [2.0])
        # Prometheus saw the new round form: what a rate() panel draws.
        self.assertGreaterEqual(self.values('increase(ddprun_rounds_formed_total{run_id="%s"}[1m])' % job)[0], 1.0)

    def check_exposition(self):
        code, text = http_get("http://127.0.0.1:%d/metrics" % self.metrics_port)
        self.assertEqual(code, 200)
        self.assertIn('ddprun_nodes{run_id="%s",state="running"} 2' % self.run_id, text)
        res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=ml.SAFETY_TIMEOUT_S)
        self.assertEqual((res.returncode, res.stdout + res.stderr), (0, ""), "promtool check metrics complained")
        return metric_names(text)

    def check_status(self):
        def both_running():
            st = self.status_json()
            job = st["jobs"][0] if st.get("jobs") else {}
            nodes = job.get("nodes", [])
            return st if (len(nodes) == 2 and all(n["state"] == "running" for n in nodes)
                          and job.get("last_failure")) else None
        st = self.wait_until("status to show both nodes running after the failure", both_running)
        self.assertEqual(len(st["jobs"]), 1, st)
        job = st["jobs"][0]
        self.assertEqual((job["run_id"], job["phase"], job["round"], job["restarts"], job["max_restarts"]),
                         (self.run_id, "running", 2, 1, 2), job)
        self.assertEqual((job["min_nodes"], job["max_nodes"], job["node_count"], job["agents_connected"]),
                         (2, 2, 2, 2), job)
        self.assertEqual(sorted(n["group_rank"] for n in job["nodes"]), [0, 1], job)
        node_ids = [n["node_id"] for n in job["nodes"]]
        failure = job["last_failure"]
        self.assertEqual((failure["kind"], failure["cause"], failure["exit_code"], failure["rank"], failure["round"]),
                         ("worker_failed", "worker_exit", 3, 1, 1), failure)
        self.assertIn(failure["node"], node_ids, failure)

        table = self.status("--rdzv_id", self.run_id, env={"DDPRUN_RDZV_TOKEN": self.token})
        self.assertEqual(table.returncode, 0, table.stderr)
        for node_id in node_ids + [self.run_id]:
            self.assertIn(node_id, table.stdout, "the table does not name %s:\n%s" % (node_id, table.stdout))

        wrong = self.status("--json", env={"DDPRUN_RDZV_TOKEN": "not-" + self.token})
        self.assertEqual(wrong.returncode, 2, "a wrong token: %s %s" % (wrong.stdout, wrong.stderr))
        self.assertIn("invalid job token", wrong.stderr)
        self.assertNotIn(self.token, wrong.stdout + wrong.stderr)
        unknown = self.status("--rdzv_id", "no_such_" + self.run_id, "--token_file", self.token_path)
        self.assertEqual(unknown.returncode, 1, "an unknown job: %s %s" % (unknown.stdout, unknown.stderr))

    def check_dashboard(self, exposed):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["run_id"]["definition"], "label_values(ddprun_job_events_total, run_id)")
        # What Grafana asks Prometheus for label_values(ddprun_job_events_total, run_id).
        url = "http://127.0.0.1:%d/api/v1/label/run_id/values?%s" % (
            self.prom_port, urllib.parse.urlencode({"match[]": "ddprun_job_events_total"}))
        self.wait_until("the run_id variable to list the job",
                        lambda: self.run_id in json.loads(http_get(url)[1])["data"])

        targets = dashboard_targets(dashboard)
        shown = set().union(*(names_in_expr(expr) for _, expr in targets))
        self.assertEqual(DASHBOARD_METRICS - shown, set(), "metrics no panel shows")
        for title, expr in targets:
            unknown = names_in_expr(expr) - exposed
            self.assertEqual(unknown, set(), "panel %r names metrics the daemon does not expose: %s" % (title, expr))
            answer = self.query(self.filled(expr))
            self.assertEqual(answer.get("status"), "success", "panel %r: %s -> %s" % (title, expr, answer))
        # The job's own panels show the running job.
        for title, expr in targets:
            if title in ("Nodes by state", "Rounds formed"):
                self.wait_until("data for panel %r (%s)" % (title, expr), lambda: self.values(self.filled(expr)))

    def filled(self, expr):
        return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$run_id", self.run_id)


if __name__ == "__main__":
    main()
