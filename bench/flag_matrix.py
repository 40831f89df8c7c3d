#!/usr/bin/env python3
"""ddprun and torchrun 2.x side by side on the same command lines and pod environments.

1. Flags: every flag of torchrun's parser (read from the installed torch, so a new torch release
   adds its rows by itself), each with a sample value, in both spellings, on a one-worker job
   whose program records its environment. A flag "is accepted" when the launcher does not stop
   with a usage error (argparse's exit 2, ddprun's exit 2 naming an unknown or ambiguous option).
   Also: an unambiguous prefix, an ambiguous one, a repeated flag.
2. Kubernetes: the environments the Kubeflow operators give each pod (PyTorchJob v1, static and
   elastic; Trainer v2), run with no flags at all but the script; every worker's torchrun
   contract variables compared.

    python3 -m venv bench/.venv-torch2 && bench/.venv-torch2/bin/pip install torch numpy
    bench/flag_matrix.py [--ddprun build/bin/ddprun] [--torchrun bench/.venv-torch2/bin/torchrun]
                         [--output bench/RESULTS_FLAGS.md]

torch 2.x is installed only here, never in CI (the e2e tests use Debian's torch 1.13). Without it,
torchrun's side is reported skipped and ddprun runs alone on the flags of Debian's torch 1.13 parser
(/usr/bin/python3). `--smoke` (ctest): a few flags and one pod case, printed only.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import benchlib
from benchlib import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT = ("RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_WORLD_SIZE "
            "ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
            "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING").split()
DUMP = r"""
import json, os, sys
out = os.environ["MATRIX_OUT"]
with open(os.path.join(out, "env_%%s_%%s.json" %% (os.environ.get("GROUP_RANK", "x"), os.environ["LOCAL_RANK"])), "w") as f:
    json.dump({k: os.environ.get(k) for k in %r} | {"argv": sys.argv[1:]}, f)
""" % (CONTRACT,)

# A sample value per torchrun option (by its first long name); switches take none.
SAMPLES = {
    "--nnodes": "1", "--nproc-per-node": "1", "--rdzv-backend": "c10d", "--rdzv-endpoint": "127.0.0.1:{port}",
    "--rdzv-id": "matrix", "--rdzv-conf": "join_timeout=60", "--max-restarts": "0", "--monitor-interval": "0.1",
    "--start-method": "spawn", "--event-log-handler": "console", "--role": "trainer", "--log-dir": "{tmp}/logs",
    "-r": "0", "--redirects": "0", "-t": "3", "--tee": "3", "--log-line-prefix-template": "[${rank}]:",
    "--local-ranks-filter": "0", "--duplicate-stdout-filters": "a,b", "--duplicate-stderr-filters": "a",
    "--node-rank": "0", "--master-addr": "127.0.0.1", "--master-port": "{port}", "--local-addr": "127.0.0.1",
    "--logs-specs": "default", "--numa-binding": "node", "--signals-to-handle": "SIGTERM,SIGUSR1",
    "--shutdown-timeout": "5", "--print-completion": "bash",
}
# Flags whose run needs what this machine has not (a GPU) or a plugin: compared on acceptance of
# the flag itself (not a usage error), not on success.
NEEDS_MORE = {"--numa-binding": "a GPU"}


def torchrun_options(python):
    """[(names, takes_value)] of torchrun's parser, from the torch of `python`."""
    code = ("import json; from torch.distributed.run import get_args_parser as g; p = g(); "
            "print(json.dumps([[a.option_strings, a.nargs != 0] for a in p._actions "
            "if a.option_strings and '-h' not in a.option_strings]))")
    return json.loads(subprocess.check_output([python, "-c", code], text=True))


def run(cmd, env, timeout=120, cwd=None):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                           cwd=cwd, start_new_session=True)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or "") + (e.stderr or "") if isinstance(e.stdout, str) else "", timeout


def usage_error(code, text):
    return code == 2 and bool(re.search(r"usage:|unrecognized arguments|ambiguous option|unknown option|"
                                        r"expected one argument|invalid choice", text))


def base_env(tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM_", "TORCHELASTIC_"))}
    env.update(PYTHON_EXEC=sys.executable, MATRIX_OUT=tmp, PYTHONUNBUFFERED="1")
    return env


def flag_rows(launchers, options, script):
    rows = []
    for names, takes_value in options:
        longs = [n for n in names if n.startswith("--")] or names
        for name in names:
            key = longs[0]
            value = SAMPLES.get(key, SAMPLES.get(name))
            row = {"flag": name, "value": value, "results": {}}
            for label, exe in launchers.items():
                tmp = tempfile.mkdtemp(prefix="matrix_")
                port = free_port()
                args = [name] + ([value.replace("{port}", str(port)).replace("{tmp}", tmp)] if takes_value and value is not None else
                                 (["x"] if takes_value else []))
                if key == "--rdzv-endpoint":
                    args = ["--rdzv-backend", "c10d"] + args
                extra = [] if key in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend",
                                      "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--local-addr") else ["--standalone"]
                cmd = [exe] + extra + args + [script]
                code, text, _ = run(cmd, base_env(tmp))
                shutil.rmtree(tmp, ignore_errors=True)
                row["results"][label] = (code, usage_error(code, text), text.strip().splitlines()[-1:] if code else [])
            rows.append(row)
    return rows


def pod_cases(port, rdzv_port):
    """(name, [per-pod env], note): the variables the Kubeflow operators set, one dict per pod."""
    v1 = lambda rank: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(rank),
                       "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "PET_NNODES": "2",
                       "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "2"}
    elastic = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "127.0.0.1:%d" % rdzv_port, "PET_RDZV_ID": "kf-job",
               "PET_NNODES": "1:2", "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "2",
               "PET_RDZV_CONF": "join_timeout=60", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    v2 = lambda rank: {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank),
                       "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
    return [
        ("PyTorchJob v1, 2 pods x 2 (static: MASTER_*, WORLD_SIZE, RANK per pod and PET_*)", [v1(0), v1(1)]),
        ("PyTorchJob v1 elastic, 1 pod of 1:2 (c10d at PET_RDZV_ENDPOINT)", [elastic]),
        ("Trainer v2, 2 pods x 2 (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_*)", [v2(0), v2(1)]),
        ("PyTorchJob v1, standalone (PET_STANDALONE=1, PET_NPROC_PER_NODE=3)", [{"PET_STANDALONE": "1",
                                                                                  "PET_NPROC_PER_NODE": "3"}]),
    ]


def run_pods(exe, pods, script):
    tmp = tempfile.mkdtemp(prefix="matrix_pods_")
    procs = []
    for pod in pods:
        env = base_env(tmp)
        env.update(pod)
        procs.append(subprocess.Popen([exe, script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
        time.sleep(0.2)
    codes, texts = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, _ = p.communicate()
        codes.append(p.returncode)
        texts.append(out)
    envs = {}
    for name in sorted(os.listdir(tmp)):
        with open(os.path.join(tmp, name)) as f:
            d = json.load(f)
        envs[(d["RANK"])] = d
    shutil.rmtree(tmp, ignore_errors=True)
    return codes, envs, texts


# Values that differ on purpose (README, "What every worker gets"); compared by presence only.
EXPECTED_DIFFERENT = {
    "TORCHELASTIC_RUN_ID": "a random id under --standalone on both, different by nature",
    "MASTER_PORT": "ddprun gives workers a free port of rank 0's node (PyTorch's rank 0 hosts its store there); "
                   "torchrun reuses the rendezvous port or picks another free one",
    "TORCHELASTIC_USE_AGENT_STORE": "ddprun hosts no TCPStore at MASTER_PORT, so always False",
    "MASTER_ADDR": "elastic (c10d) jobs: ddprun gives the address the rendezvous saw rank 0's node connect from "
                   "(an IP every node can reach), torchrun that node's host name as it sees itself ('localhost' here); "
                   "static jobs: both give --master_addr",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, "bench", ".venv-torch2", "bin", "torchrun"))
    ap.add_argument("--output", default=os.path.join(ROOT, "bench", "RESULTS_FLAGS.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a few flags, one pod case, print only (ctest)")
    args = ap.parse_args()
    if args.smoke:
        args.no_write = True
    if not os.access(args.ddprun, os.X_OK):
        sys.exit("flag_matrix: %s is missing (see the usage in this file's docstring)" % args.ddprun)
    python = os.path.join(os.path.dirname(args.torchrun), "python")
    skipped = None
    if not os.access(args.torchrun, os.X_OK):
        # The peer is not installed: ddprun alone, on the flags of the torch that is.
        skipped = "torchrun 2.x: skipped (%s not installed); ddprun alone, on torch %%s's flags" % args.torchrun
        python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        benchlib.skip("flag_matrix: neither torch 2.x (%s) nor torch for %s" % (args.torchrun, python))
    version = probe.stdout.strip()
    if skipped:
        skipped %= version
        print(skipped, flush=True)
    work = tempfile.mkdtemp(prefix="matrix_script_")
    script = os.path.join(work, "dump_env.py")
    with open(script, "w") as f:
        f.write(DUMP)
    launchers = {"ddprun": args.ddprun}
    if not skipped:
        launchers["torchrun"] = args.torchrun
    none = ("skipped", False, [])  # a launcher that did not run
    out = ["# ddprun and torchrun %s side by side: flags and Kubernetes pod environments" % version, "",
           "Measured %s on %s with `bench/flag_matrix.py` (torchrun from a venv; the program records its "
           "environment)." % (time.strftime("%Y-%m-%d"), socket.gethostname()), ""]
    if skipped:
        out += [skipped + ".", ""]

    options = torchrun_options(python)
    if args.smoke:
        options = options[:4]
    rows = flag_rows(launchers, options, script)
    rejected = [r["flag"] for r in rows if r["results"]["ddprun"][1] and not r["results"].get("torchrun", none)[1]]
    out += ["## 1. Every torchrun flag, both spellings (%d command lines)" % len(rows), "",
            "| flag | value | torchrun exit | ddprun exit | note |", "|---|---|---|---|---|"]
    for r in rows:
        t, d = r["results"].get("torchrun", none), r["results"]["ddprun"]
        key = next((n for n in (r["flag"],) if n in NEEDS_MORE), None) or \
            next((n for n in NEEDS_MORE if n.replace("-", "_") == r["flag"].replace("-", "_")), None)
        note = ("usage error!" if d[1] and not t[1] else "both refuse the usage" if d[1] and t[1] else
                ("needs %s: both accept the flag; " % NEEDS_MORE[key] if key else "") +
                ("ddprun: " + d[2][0][:90] if d[0] and d[2] else ""))
        out.append("| `%s` | %s | %s | %s | %s |" % (r["flag"], "`%s`" % r["value"] if r["value"] else "",
                                                       t[0], d[0], note.replace("|", "\\|")))
    out += ["", "Flags torchrun accepts and ddprun rejects as a usage error: %s." % (
        ", ".join("`%s`" % f for f in rejected) if rejected else "**none**"), ""]

    # Abbreviations and repeats.
    tmp = tempfile.mkdtemp(prefix="matrix_")
    out += ["## 2. argparse habits", "", "| command line | torchrun exit | ddprun exit |", "|---|---|---|"]
    for words in (["--standalone", "--nproc-per", "2"], ["--standalone", "--nproc_per", "2"],
                  ["--standalone", "--rdzv", "x"], ["--standalone", "--role", "a", "--role", "b"]):
        res = {label: run([exe] + words + [script], base_env(tmp))[0] for label, exe in launchers.items()}
        out.append("| `%s PROGRAM` | %s | %s |" % (" ".join(words), res.get("torchrun", "skipped"), res["ddprun"]))
    shutil.rmtree(tmp, ignore_errors=True)

    # Kubernetes pod environments.
    out += ["", "## 3. Kubeflow pod environments, no flags but the script", "",
            "Each case runs every pod's launcher with the operator's variables and nothing else on the command "
            "line; the table compares the contract variables of every worker (by RANK).", "",
            "| case | torchrun exits | ddprun exits | workers | contract variables equal | differ (by design) |",
            "|---|---|---|---|---|---|"]
    cases = pod_cases(free_port(), free_port())
    for name, pods in cases[-1:] if args.smoke else cases:
        results = {}
        for label, exe in launchers.items():
            port, rdzv = free_port(), free_port()
            fresh = [dict((k, v.replace(pods[0].get("PET_MASTER_PORT", "@"), str(port))
                           .replace(pods[0].get("PET_RDZV_ENDPOINT", "@").split(":")[-1], str(rdzv)))
                          for k, v in pod.items()) for pod in pods]
            results[label] = run_pods(exe, fresh, script)
        (tc, te, _), (dc, de, _) = results.get("torchrun", ("skipped", {}, [])), results["ddprun"]
        same, differ = [], set()
        for rank in sorted(set(te) | set(de)) if te else []:  # nothing to compare without torchrun
            for var in CONTRACT:
                a, b = te.get(rank, {}).get(var), de.get(rank, {}).get(var)
                if a == b:
                    same.append(var)
                elif var in EXPECTED_DIFFERENT and a is not None and b is not None:
                    differ.add(var)
                else:
                    differ.add("%s (rank %s: torchrun %r, ddprun %r)" % (var, rank, a, b))
        unexpected = sorted(d for d in differ if d not in EXPECTED_DIFFERENT)
        out.append("| %s | %s | %s | %d / %d | %d of %d | %s |" % (
            name, tc, dc, len(te), len(de), len(same), len(same) + len(differ) * max(1, len(te)),
            ", ".join(sorted(d for d in differ if d in EXPECTED_DIFFERENT)) +
            ("; **unexpected: %s**" % "; ".join(unexpected) if unexpected else "")))
    out += ["", "Differences by design: " + "; ".join("`%s`: %s" % kv for kv in EXPECTED_DIFFERENT.items()) + "."]
    shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(out) + "\n"
    print(text)
    if not args.no_write:
        with open(args.output, "w") as f:
            f.write(text)
    # ddprun refusing a flag that torchrun takes is this matrix's finding; ddprun's pod runs must work.
    return 0


if __name__ == "__main__":
    sys.exit(main())
