"""Case `failure`: 3 agents, --nnodes=2:3; one node is killed with SIGKILL, and the time is from
the kill to the 2 survivors' workers running in the next round."""
import json
import os
import shutil
import signal
import time
import uuid

from benchlib import free_port
from multinode.common import (TORCHRUN, StepTimeout, fmt_s, loadavg, log, median, port_open, proc_state,
                              wait_for)


def run(bench):
    a = bench.args
    bench.report.append("## 2. Failure propagation\n")
    bench.report.append("3 agents, `--nnodes=2:3 --max_restarts=3`, one trivial worker each. Once the round "
                        "has run 1 s, node 2 is killed with SIGKILL; the time is from the kill to both "
                        "survivors' workers running again (their stamp files' mtimes). "
                        "`agent`: only the agent process is killed, workers just sleep. "
                        "`node`: the agent and every descendant are killed at once (a host dies), and "
                        "each worker polls its round's peers every 0.1 s and exits 1 when one is gone, "
                        "as a collective would fail (so up to ~0.1 s of the figure is that polling). "
                        "torchrun's store lives in one agent (node 0, started first so that it wins the "
                        "port); `agent` and `node` kill node 2. `host` (torchrun only) kills node 0's "
                        "agent, the one holding the store. ddprun's store and rendezvous live in "
                        "ddprun-rdzv, which no node failure takes down.\n")
    rows = []
    for kind in ("ddprun", "torchrun"):
        if kind == "torchrun" and not os.path.exists(TORCHRUN):
            continue
        for variant in ("agent", "node") + (("host",) if kind == "torchrun" else ()):
            reps = a.fail_reps if kind == "ddprun" else a.torch_fail_reps
            bound = a.ddprun_fail_bound if kind == "ddprun" else a.torch_fail_bound
            for i in range(reps):
                log("failure %s/%s rep %d (load %s)" % (kind, variant, i + 1, loadavg()))
                try:
                    r = run_case(bench, kind, variant, bound)
                except StepTimeout as e:
                    r = {"kind": kind, "variant": variant, "ok": False, "latency_s": None, "note": str(e)}
                r["load"] = loadavg()
                log("  -> %s" % json.dumps(r))
                rows.append(r)
    bench.report.append("| launcher | variant | reps | kill -> survivors running, s (each) | median s | "
                        "next round | killed agent's worker left running | load |")
    bench.report.append("|---|---|---|---|---|---|---|---|")
    for kind in ("ddprun", "torchrun"):
        for variant in ("agent", "node", "host"):
            rs = [r for r in rows if r["kind"] == kind and r["variant"] == variant]
            if not rs:
                continue
            each = ", ".join(fmt_s(r.get("latency_s")) if r.get("latency_s") is not None
                             else "none (see below)" for r in rs)
            orphan = "-" if variant == "node" else ("yes" if any(r.get("orphan_worker") for r in rs) else "no")
            bench.report.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                "**ddprun**" if kind == "ddprun" else "torchrun c10d", variant, len(rs), each,
                fmt_s(median([r.get("latency_s") for r in rs])),
                next((r["next_round"] for r in rs if r.get("next_round")), "-"), orphan, rs[-1]["load"]))
    for r in rows:
        if r.get("note"):
            bench.report.append("\n- %s/%s: %s" % (r["kind"], r["variant"], r["note"]))
    dd = [r.get("latency_s") for r in rows if r["kind"] == "ddprun" and r["variant"] == "agent"]
    if dd:
        ok = all(x is not None and x < 1.0 for x in dd)
        worst = None if any(x is None for x in dd) else max(dd)
        bench.verdicts.append("Failure propagation (kill -9 of an agent, default settings): ddprun median %s s, "
                              "worst %s s (target < 1 s): %s" % (fmt_s(median(dd)), fmt_s(worst) if worst is not None
                                                                 else "none", "met" if ok else "NOT met"))
    bench.report.append("")


def node_worker(peer_aware):
    # Stamps n<node>.<pid> with "round group_world_size restart_count"; a peer-aware worker
    # also publishes its pid under its round's key and exits 1 as soon as a peer of the same
    # round is gone, as a collective would fail.
    key = '${GROUP_WORLD_SIZE}_${TORCHELASTIC_RESTART_COUNT}_${DDPRUN_ROUND:-x}'
    s = ('read p _ < /proc/self/stat; '
         'echo "${DDPRUN_ROUND:-x} $GROUP_WORLD_SIZE $TORCHELASTIC_RESTART_COUNT" > "$MNB_DIR/n$MNB_NODE.$p"; ')
    if not peer_aware:
        return s + "exec sleep 300"
    return s + ('k=%s; echo $p > "$MNB_DIR/live.$k.$MNB_NODE"; '
                'while sleep 0.1; do for f in "$MNB_DIR"/live.$k.*; do '
                'read p < "$f" && kill -0 "$p" 2>/dev/null || exit 1; done; done' % key)


def run_case(bench, kind, variant, bound):
    d = bench.newdir("fail-%s-%s" % (kind, variant))
    bench.step_env(d)
    run_id = "mnb-fail-%s-%s" % (kind, uuid.uuid4().hex[:6])
    res = {"kind": kind, "variant": variant, "ok": False}
    script = node_worker(variant == "node")
    try:
        extra = ["--max_restarts=3"]
        if kind == "ddprun":
            _, port = bench.start_daemon(d)
            argv = bench.ddprun_agent_argv("2:3", port, run_id, script, extra)
        else:
            port = free_port()
            argv = bench.torchrun_argv("2:3", port, run_id, script, extra)
        shown = (bench.ddprun_agent_argv if kind == "ddprun" else bench.torchrun_argv)("2:3", "PORT", "RUN_ID", script, extra)
        bench.note_cmd("%s failure (%s), env MNB_NODE=0|1|2" % (kind, variant), shown)
        envs = [{"MNB_NODE": str(i)} for i in range(3)]
        if kind == "torchrun":
            # torchrun's store lives in whichever agent binds the port first, and dies with it;
            # node 0 is started first and made the host, so that the victim (node 2) is not.
            _, _, pids = bench.spawn_many([argv], d, envs=envs[:1])
            wait_for(lambda: port_open(port), 120, interval=0.05, what="torchrun's store on node 0")
            _, _, more = bench.spawn_many([argv] * 2, d, envs=envs[1:], first=1)
            pids += more
        else:
            _, _, pids = bench.spawn_many([argv] * 3, d, envs=envs)

        def files():
            # Reap first: the killed node's processes come back to the driver (a subreaper),
            # and a zombie would still pass the peers' `kill -0`.
            bench.procs.reap()
            out = []
            for e in os.scandir(d):
                if e.name.startswith("n") and "." in e.name and e.name[1:].split(".")[0].isdigit():
                    node, pid = e.name[1:].split(".", 1)
                    try:
                        out.append((int(node), int(pid), e.stat().st_mtime_ns, open(e.path).read().split()))
                    except (OSError, ValueError):
                        pass
            return out

        first = wait_for(lambda: len({f[0] for f in files()}) == 3 and files(), 120 if kind == "torchrun" else 30,
                         interval=0.05, what="3 workers in the first round")
        time.sleep(1.0)  # a settled round
        victim = 0 if variant == "host" else 2  # "host": torchrun's store host, node 0
        survivors = [i for i in range(3) if i != victim]
        victim_worker = [f[1] for f in files() if f[0] == victim]
        if variant == "node":
            # Only processes that carry our mark: never a pid that was reused meanwhile.
            ours = set(bench.procs.marked())
            targets = [pids[victim]] + [p for p in bench.procs.descendants(pids[victim]) if p in ours]
        else:
            targets = [pids[victim]]
        kill_path = os.path.join(d, "kill")  # its mtime: the stamps' clock
        with open(kill_path, "w") as f:
            f.write("kill")
        t_kill = os.stat(kill_path).st_mtime_ns
        for p in targets:
            bench.procs.kill(p, signal.SIGKILL)
        res["first_round"] = next((f[3][0] for f in first if f[3]), "?")

        gone = {}

        def survivors_restarted():
            new = {}
            for node, pid, mt, content in files():
                if node != victim and mt > t_kill:
                    new.setdefault(node, (mt, content))
            for i in survivors:
                if i not in gone and not bench.procs.alive(pids[i]):
                    gone[i] = (time.time_ns() - t_kill) / 1e9
            if len(new) == 2:
                return new
            if len(gone) == 2:
                return "gone"
            return None

        try:
            new = wait_for(survivors_restarted, bound, interval=0.02, what="survivors' next round")
            if new == "gone":
                res["latency_s"] = None
                res["note"] = "no new round: both survivors' agents exited (codes %s) %.1f s after the kill" % (
                    ", ".join(str(bench.procs.exit_code(pids[i])) for i in survivors), max(gone.values()))
            else:
                res["latency_s"] = (max(v[0] for v in new.values()) - t_kill) / 1e9
                res["next_round"] = " / ".join(
                    "round %s, world %s, restarts %s" % tuple(v[1][:3]) for v in list(new.values())[:1])
                res["ok"] = True
        except StepTimeout:
            res["latency_s"] = None
            res["note"] = "no new round within %d s%s" % (bound, "; the survivors' workers of the first round "
                                                          "kept running" if variant == "agent" else "")
        # Did the killed agent's worker outlive it? (variant agent only: nobody killed it)
        if variant in ("agent", "host"):
            time.sleep(0.5)
            bench.procs.reap()  # an orphan killed by the watchdog comes back to us as a zombie
            res["orphan_worker"] = any(proc_state(p) not in (None, "Z") for p in victim_worker)
        res["survivor_agents_alive"] = sum(1 for i in survivors if bench.procs.alive(pids[i]))
    finally:
        bench.cleanup_step()
        bench.step_env(None)
        shutil.rmtree(d, ignore_errors=True)
    return res
