"""Workers get torchrun's environment contract from ddprun (DESIGN.md section 4).

The same worker (workers/dump_env.py: writes its environment to a JSON file per rank) runs under
the torchrun of the same torch (Debian's 1.13, or the torch 2.x tier's) and under ddprun with the same flags, the same inherited environment and the
same TMPDIR, in two modes:
  standalone: --standalone --nproc_per_node=2
  static:     --nproc_per_node=2 --master_port=<a free port> --max_restarts=2 --role=trainer
and the two environments are compared variable by variable:
  - every contract variable is set by both;
  - deterministic values are identical (ranks, sizes, role, MASTER_ADDR, restart counts, the
    static MASTER_PORT and run id "none", OMP_NUM_THREADS, and the async error handling variable
    torchrun sets: NCCL_ASYNC_ERROR_HANDLING for torch 1.x, TORCH_NCCL_ASYNC_ERROR_HANDLING for 2.x);
  - values that are random per run have torchrun's shape: the standalone run id is a UUID (version
    4, as torchrun's uuid.uuid4()), the standalone MASTER_PORT a valid port shared by the ranks,
    TORCHELASTIC_ERROR_FILE an absolute path .../attempt_0/<local rank>/error.json under TMPDIR
    (ddprun's own temporary run folder, where no rank's logs go to files, is flat instead:
    .../attempt_0.<local rank>.error.json, README "Failure summary"; torch 1.13's quirk flags
    below send logs to files, so there both layouts are torchrun's);
  - every other difference is one of the intended ones, asserted explicitly below:
      TORCHELASTIC_USE_AGENT_STORE is "True" under ddprun in both modes: its agent serves torch's
        store at MASTER_ADDR:MASTER_PORT (torchrun 2.x's does too; 1.x's in static mode only, its
        standalone mode says "False": rank 0 hosts the store there);
      MASTER_ADDR is 127.0.0.1 under ddprun in standalone mode, where torchrun says "localhost":
        the agent's store listens on loopback IPv4 only (a "localhost" that resolves to ::1 first
        would cost every rank a refused connection);
      ddprun sets both NCCL_ASYNC_ERROR_HANDLING=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (the
        name torch 2.x reads), where torchrun sets its own version's name only, and DDPRUN_ROUND=1 (rounds count from 1 in every mode);
      TORCHELASTIC_SIGNALS_TO_HANDLE (torchrun 2.x's too) holds ddprun's default list, which adds
        SIGUSR1,SIGUSR2 to torchrun's;
      ddprun adds one DDPRUN_JOB_<16 hex digits>=1, the marker by which its watchdog finds every
        process of the job (not listed in DESIGN.md section 4);
      ddprun may add DDPRUN_STORE_ADDR/DDPRUN_STORE_PREFIX (section 4) once it hosts a store.
"""

import os
import re
import shutil
import tempfile
import unittest
import uuid

import e2e_lib
from e2e_lib import Launcher, read_json, worker

# torchrun 1.x sets NCCL_ASYNC_ERROR_HANDLING, 2.x the newer TORCH_NCCL_ASYNC_ERROR_HANDLING only;
# ddprun sets both (README "Environment"), so the other name is one of its intended additions.
TORCH1 = e2e_lib.torch_version().startswith("1.")
ASYNC_NAME, OTHER_ASYNC_NAME = (("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING") if TORCH1 else
                                ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"))
CONTRACT = ("RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK "
            "ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT "
            "TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS").split() + [ASYNC_NAME]
DETERMINISTIC = ("RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK "
                 "ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR TORCHELASTIC_RESTART_COUNT "
                 "TORCHELASTIC_MAX_RESTARTS OMP_NUM_THREADS").split() + [ASYNC_NAME]
# Random per run in standalone mode, fixed by the flags in static mode.
PER_RUN = ("MASTER_PORT", "TORCHELASTIC_RUN_ID")
# Values that are expected to differ whatever the mode (checked for shape instead).
PER_RUN_ALWAYS = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE")

NPROC = 2
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
JOB_MARKER_RE = re.compile(r"DDPRUN_JOB_[0-9a-f]{16}")
OPTIONAL_DDPRUN_KEYS = {"DDPRUN_STORE_ADDR", "DDPRUN_STORE_PREFIX"}
CASES = [(mode, rank) for mode in ("standalone", "static") for rank in range(NPROC)]


class EnvContractTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.missing = e2e_lib.check_binaries()
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_e2e_env_")
        cls.launcher = Launcher(cls.tmp)
        cls.static_port = e2e_lib.free_port()
        cls.flags = {
            "standalone": ["--standalone", "--nproc_per_node=%d" % NPROC, "--monitor_interval", "0.1"],
            "static": ["--nproc_per_node=%d" % NPROC, "--master_port=%d" % cls.static_port, "--max_restarts=2",
                       "--role=trainer", "--monitor_interval", "0.1"],
        }
        cls.results, cls.envs, cls.probes = {}, {}, {}
        if cls.missing:
            return
        env = cls.launcher.base_env()  # one environment for all four runs: inherited values agree
        for mode, flags in cls.flags.items():
            for name in ("torchrun", "ddprun"):
                out = os.path.join(cls.tmp, "%s_%s" % (name, mode))
                os.makedirs(out)
                run = cls.launcher.torchrun if name == "torchrun" else cls.launcher.ddprun
                # ddprun gets torchrun's quirk flags too: the very same command line.
                extra = [] if name == "torchrun" else list(e2e_lib.TORCHRUN_QUIRK_FLAGS)
                cls.results[name, mode] = run(extra + flags, worker("dump_env.py"), [out], env=env)
                for rank in range(NPROC):
                    path = os.path.join(out, "env_%d.json" % rank)
                    if os.path.exists(path):
                        dump = read_json(path)
                        cls.envs[name, mode, rank] = dump["environ"]
                        cls.probes[name, mode, rank] = dump["probe"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def setUp(self):
        self.assertIsNone(self.missing, self.missing)

    def env(self, name, mode, rank):
        key = (name, mode, rank)
        self.assertIn(key, self.envs, "no environment dump from rank %d of %s (%s mode)\n%s"
                      % (rank, name, mode, self.results[name, mode].describe()))
        return self.envs[key]

    def pair(self, mode, rank):
        """(torchrun's environment, ddprun's environment) of one rank in one mode."""
        return self.env("torchrun", mode, rank), self.env("ddprun", mode, rank)

    def test_both_launchers_run_the_worker_on_every_rank(self):
        for (name, mode), result in self.results.items():
            with self.subTest(launcher=name, mode=mode):
                self.assertEqual(result.returncode, 0, result.describe())
                self.assertEqual(result.leaked, [], result.describe())
                for rank in range(NPROC):
                    self.env(name, mode, rank)
                pids = {self.probes[name, mode, r]["pid"] for r in range(NPROC)}
                self.assertEqual(len(pids), NPROC, "ranks must be distinct processes")

    def test_every_contract_variable_is_set_by_both(self):
        for mode, rank in CASES:
            with self.subTest(mode=mode, rank=rank):
                t, d = self.pair(mode, rank)
                self.assertEqual([k for k in CONTRACT if k not in t], [], "missing under torchrun")
                self.assertEqual([k for k in CONTRACT if k not in d], [], "missing under ddprun")

    def test_deterministic_values_are_identical(self):
        for mode, rank in CASES:
            with self.subTest(mode=mode, rank=rank):
                t, d = self.pair(mode, rank)
                keys = DETERMINISTIC + (list(PER_RUN) if mode == "static" else [])
                if mode == "standalone":
                    keys = [k for k in keys if k != "MASTER_ADDR"]  # an intended difference (above)
                    self.assertEqual(d["MASTER_ADDR"], "127.0.0.1")
                self.assertEqual({k: d.get(k) for k in keys}, {k: t.get(k) for k in keys})
                # And they are what the flags asked for (so the comparison is not vacuous).
                self.assertEqual((d["RANK"], d["LOCAL_RANK"], d["WORLD_SIZE"], d["LOCAL_WORLD_SIZE"]),
                                 (str(rank), str(rank), str(NPROC), str(NPROC)))
                self.assertEqual((d["GROUP_RANK"], d["GROUP_WORLD_SIZE"], d["ROLE_RANK"], d["ROLE_WORLD_SIZE"]),
                                 ("0", "1", str(rank), str(NPROC)))
                self.assertEqual(d["TORCHELASTIC_RESTART_COUNT"], "0")
                self.assertEqual(d["OMP_NUM_THREADS"], "1")
                self.assertEqual((d["NCCL_ASYNC_ERROR_HANDLING"], d["TORCH_NCCL_ASYNC_ERROR_HANDLING"]), ("1", "1"))
                if mode == "static":
                    self.assertEqual((d["ROLE_NAME"], d["TORCHELASTIC_MAX_RESTARTS"]), ("trainer", "2"))
                    self.assertEqual((d["MASTER_PORT"], d["TORCHELASTIC_RUN_ID"]), (str(self.static_port), "none"))
                else:
                    self.assertEqual((d["ROLE_NAME"], d["TORCHELASTIC_MAX_RESTARTS"]), ("default", "0"))

    def test_standalone_random_values_have_torchrun_shape(self):
        for name in ("torchrun", "ddprun"):
            with self.subTest(launcher=name):
                envs = [self.env(name, "standalone", r) for r in range(NPROC)]
                run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs}
                ports = {e["MASTER_PORT"] for e in envs}
                self.assertEqual(len(run_ids), 1, "ranks disagree on the run id")
                self.assertEqual(len(ports), 1, "ranks disagree on MASTER_PORT")
                run_id, port = run_ids.pop(), ports.pop()
                self.assertRegex(run_id, "^%s$" % UUID_RE.pattern)
                self.assertTrue(port.isdigit() and 1024 <= int(port) <= 65535, "MASTER_PORT %r" % port)
        self.assertNotEqual(self.env("torchrun", "standalone", 0)["TORCHELASTIC_RUN_ID"],
                            self.env("ddprun", "standalone", 0)["TORCHELASTIC_RUN_ID"])

    def test_standalone_run_id_is_a_version_4_uuid_like_torchruns(self):
        for name in ("torchrun", "ddprun"):
            with self.subTest(launcher=name):
                run_id = self.env(name, "standalone", 0)["TORCHELASTIC_RUN_ID"]
                parsed = uuid.UUID(run_id)
                self.assertEqual((parsed.version, parsed.variant), (4, uuid.RFC_4122),
                                 "run id %s is not a random (version 4, RFC 4122) UUID as "
                                 "torchrun's str(uuid.uuid4()) is" % run_id)

    def test_error_file_has_torchruns_layout(self):
        tmpdir = self.launcher.base_env()["TMPDIR"]
        for mode, rank in CASES:
            with self.subTest(mode=mode, rank=rank):
                t, d = self.pair(mode, rank)
                paths = {"torchrun": t["TORCHELASTIC_ERROR_FILE"], "ddprun": d["TORCHELASTIC_ERROR_FILE"]}
                for name, path in paths.items():
                    self.assertTrue(os.path.isabs(path), "%s: %s" % (name, path))
                    self.assertTrue(path.startswith(tmpdir + os.sep), "%s: %s is not under TMPDIR" % (name, path))
                    if name == "ddprun" and not e2e_lib.TORCHRUN_QUIRK_FLAGS:  # no logs to files: flat
                        self.assertEqual(os.path.basename(path), "attempt_0.%d.error.json" % rank, name)
                    else:
                        self.assertEqual(path.split(os.sep)[-3:], ["attempt_0", str(rank), "error.json"], name)
                self.assertEqual(self.probes["ddprun", mode, rank]["error_file_dir_exists"],
                                 self.probes["torchrun", mode, rank]["error_file_dir_exists"],
                                 "the error file's folder exists for the worker under one launcher only")
                self.assertFalse(self.probes["ddprun", mode, rank]["error_file_exists"], "stale error file")
                other = self.env("ddprun", mode, 1 - rank)["TORCHELASTIC_ERROR_FILE"]
                self.assertNotEqual(paths["ddprun"], other, "two ranks share an error file")

    def test_only_the_intended_differences(self):
        markers = {}
        for mode, rank in CASES:
            with self.subTest(mode=mode, rank=rank):
                t, d = self.pair(mode, rank)
                # USE_AGENT_STORE: torchrun 1.x's agent hosts the store in static mode only, 2.x's in
                # both (its c10d rendezvous shares its TCPStore with the workers); ddprun's always.
                self.assertEqual(t["TORCHELASTIC_USE_AGENT_STORE"], "True" if mode == "static" or not TORCH1 else "False")
                self.assertEqual(d["TORCHELASTIC_USE_AGENT_STORE"], "True")
                self.assertEqual(d.get("DDPRUN_ROUND"), "1")
                job_markers = [k for k in d if k.startswith("DDPRUN_JOB_")]
                self.assertEqual(len(job_markers), 1, job_markers)
                self.assertRegex(job_markers[0], "^%s$" % JOB_MARKER_RE.pattern)
                self.assertEqual(d[job_markers[0]], "1")
                markers.setdefault(mode, set()).add(job_markers[0])

                only_torchrun = sorted(set(t) - set(d))
                only_ddprun = set(d) - set(t)
                # Hang detection and its evidence (README "When a job hangs"): the heartbeat
                # channel (docs/heartbeat.md: the inherited end, and the socket beside it), the
                # SDK's flight recorder, and Python's stack dump on SIGABRT.
                self.assertEqual(d.get("PYTHONFAULTHANDLER"), "1")
                self.assertRegex(d.get("DDPRUN_HEARTBEAT_SOCKET", ""), r"^@ddprun-hb-\d+-\d+$")
                self.assertRegex(d.get("DDPRUN_HEARTBEAT_FD", ""), r"^\d+$")
                self.assertRegex(d.get("DDPRUN_FLIGHT_RECORDER", ""), r"[/.]flight_recorder$")
                # --signals_to_handle's list (torchrun 2.x sets it too; ddprun's default adds
                # SIGUSR1,SIGUSR2, README "--signals_to_handle").
                self.assertEqual(d.get("TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2")
                if not TORCH1:
                    self.assertEqual(t.get("TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
                expected_extra = {"TORCHELASTIC_SIGNALS_TO_HANDLE"} if TORCH1 else set()
                expected_extra |= {OTHER_ASYNC_NAME, "DDPRUN_ROUND", job_markers[0],
                                  "PYTHONFAULTHANDLER", "DDPRUN_HEARTBEAT_SOCKET", "DDPRUN_HEARTBEAT_FD",
                                  "DDPRUN_FLIGHT_RECORDER"}
                self.assertEqual(only_torchrun, [], "set by torchrun only")
                self.assertEqual(sorted(only_ddprun - OPTIONAL_DDPRUN_KEYS), sorted(expected_extra),
                                 "set by ddprun only")
                for k in only_ddprun & OPTIONAL_DDPRUN_KEYS:
                    self.assertTrue(d[k], k)
                self.assertNotIn(OTHER_ASYNC_NAME, t)

                # Everything else, inherited variables included, is identical.
                random_keys = {e2e_lib.MARKER, "TORCHELASTIC_SIGNALS_TO_HANDLE"}  # the tests' own marker; checked above
                random_keys |= set(PER_RUN_ALWAYS) | (set(PER_RUN) | {"MASTER_ADDR"} if mode == "standalone" else set())
                differing = sorted(k for k in set(t) & set(d) if t[k] != d[k] and k not in random_keys)
                self.assertEqual(differing, [], {k: (t[k], d[k]) for k in differing})
        # One marker per job: the same on both ranks, a different one in the other job.
        self.assertEqual([len(m) for m in markers.values()], [1, 1])
        self.assertNotEqual(markers["standalone"], markers["static"])


if __name__ == "__main__":
    e2e_lib.main()
