"""PyTorch's own launcher tests as a conformance suite (issue #34 item 2).

The cases of PyTorch's test/distributed/launcher/test_run.py (torch 2.x), of the same file as torch
1.13 had it (run_test.py: underscore spellings, an etcd rendezvous) and of launch_test.py (the
deprecated `python -m torch.distributed.launch`), re-expressed against the built ddprun: the
argument lists PyTorch hands to torchrun's main() go to ddprun as a subprocess, without a shell
(so `--rdzv-conf='...'` keeps its quotes as part of the value, as PyTorch's argv does), and the
outcomes PyTorch asserts are asserted here. Each test names the case it re-expresses.

Re-expression rules:
- The scripts of PyTorch's bin/ folder are our own workers under workers/torchrun_conformance/,
  same command lines and behaviour: touch_rank.py (bin/test_script.py), touch_rank.sh
  (bin/test_script.sh), local_rank_arg.py (bin/test_script_local_rank.py), init_method.py
  (bin/test_script_init_method.py), is_torchelastic_launched.py
  (bin/test_script_is_torchelastic_launched.py). PyTorch's test_dir is self.test_dir: it holds the
  files the workers touch and nothing else.
- A case that expects main() to raise ValueError (a command line torchrun refuses) expects ddprun's
  usage-error exit status 2, a message naming the problem, and no worker started (torchrun prints
  the ValueError and exits 1). A case that expects ChildFailedError (a worker failed) expects the
  failed workers' exit status, 1, as torchrun's.
- A case that mocks torchrun's Python internals checks what its mock stands for where that is
  visible from outside ddprun (device counts through CUDA_VISIBLE_DEVICES and ZE_AFFINITY_MASK,
  the nnodes grammar through --dry_run and refusals, the recorded event through
  --event_log_handler=console), and is skipped, saying so, where it is not.
- Workers run under PYTHON_EXEC, torch 1.13 (Debian's) or a torch 2.x venv; what differs between
  the two is handled where it differs (the local-rank flag of launch_test.py, read from the
  interpreter's torch version; the --touch-file-dir/--out-file spellings, taken by the workers in
  both forms).
- PyTorch's setUp removes PET_* variables and sets TEST_SENTINEL_PARENT=FOOBAR, which touch_rank.py
  requires in its environment; every job here gets the same environment (and no TORCHELASTIC_*
  variable of an outer launcher).
"""

import ctypes
import os
import subprocess
import uuid

import ports
from ddprun_testlib import PYTHON_EXEC, SAFETY_TIMEOUT_S, WORKERS, DdprunTestCase, main
from etcd_cluster import EtcdCluster, etcd_available
from multinode_lib import Proc

BIN = os.path.join(WORKERS, "torchrun_conformance")

# Jobs whose workers import torch (4 at once, on a 2-core machine beside other tests): a safety
# bound, not a speed claim.
TORCH_JOB_TIMEOUT_S = 180
# A single agent of an elastic job (--nnodes=1:2) waits the rendezvous's last call for a second
# node before it starts with one: torch's default last_call_timeout is 30 s (the torch 1.13 etcd
# cases keep it; the 2.x cases set 1 s or keep it), so the bound is the usual one plus that wait.
ELASTIC_SINGLE_AGENT_TIMEOUT_S = SAFETY_TIMEOUT_S + 30


def path(script):
    """Our worker that stands for PyTorch's launcher/bin/<script>."""
    return os.path.join(BIN, script)


def cuda_driver_loaded():
    """True when libcuda.so.1 loads here: ddprun then counts CUDA devices through the driver, else
    through CUDA_VISIBLE_DEVICES (launcher/nproc.cc)."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


_torch_version = []


def torch_major():
    """The major version of the torch PYTHON_EXEC imports (read once), or None without torch."""
    if not _torch_version:
        try:
            out = subprocess.run([PYTHON_EXEC, "-c", "import torch; print(torch.__version__)"],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            _torch_version.append(int(out.stdout.strip().split(".")[0]) if out.returncode == 0 else None)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            _torch_version.append(None)
    return _torch_version[0]


class ConformanceTest(DdprunTestCase):
    """What every re-expressed case needs: PyTorch's test_dir, its environment, the checks."""

    def setUp(self):
        super().setUp()
        self.test_dir = self.path("test_dir")
        os.mkdir(self.test_dir)

    @staticmethod
    def env(extra=None):
        """Changes to the job's environment (None unsets): PyTorch's setUp, plus `extra`."""
        env = {name: None for name in os.environ if name.startswith(("PET_", "TORCHELASTIC_"))}
        env["TEST_SENTINEL_PARENT"] = "FOOBAR"
        env.update(extra or {})
        return env

    @staticmethod
    def run_id():
        return str(uuid.uuid4().int)  # as PyTorch: a 39-digit decimal number

    @staticmethod
    def free_port():
        return ports.free_ports(1)[0]

    def torchrun(self, args, env=None, timeout=SAFETY_TIMEOUT_S, why=""):
        """Runs ddprun with `args` (launch.main(args) in PyTorch) to completion (a safety bound of
        `timeout`); nothing of the job may outlive it."""
        return self.run_job(args, env=self.env(env), timeout=timeout, why=why)

    def assert_ranks_touched(self, res, world_size):
        """PyTorch's check: each worker touched a file named after its global rank."""
        self.assert_exit(res, 0)
        self.assertEqual(set(os.listdir(self.test_dir)), {str(i) for i in range(world_size)}, res.describe())

    def assert_refused(self, res, *words):
        """main() raised ValueError in PyTorch: ddprun refuses the command line, starts nothing."""
        self.assert_exit(res, 2)
        self.assertEqual(os.listdir(self.test_dir), [], "a worker ran\n" + res.describe())
        for word in words:
            self.assertIn(word, res.stderr, res.describe())
        self.assert_no_crash_text(res.stderr, res)

    def assert_worker_failed(self, res):
        """ChildFailedError in PyTorch: every worker raised RuntimeError (--fail), exit status 1."""
        self.assert_exit(res, 1)
        self.assertEqual(os.listdir(self.test_dir), [], res.describe())
        self.assertIn("RuntimeError: touch_rank.py was asked to fail (--fail)", res.stderr, res.describe())
        self.assertRegex(res.stderr, r"exit ?code\s*:\s*1\b", res.describe())

    def read_out_file(self, out_file, res):
        self.assertTrue(os.path.exists(out_file), "the script wrote no out file\n" + res.describe())
        with open(out_file) as f:
            value = f.readline()
        if value == "unavailable":
            self.skipTest("torch under %s has no torch.distributed.is_torchelastic_launched" % PYTHON_EXEC)
        return value

    def run_script_directly(self, argv, env=None):
        """PyTorch runs some scripts with runpy in its own interpreter, no launcher: here the
        worker runs under PYTHON_EXEC, in the environment of the test minus any launcher's."""
        proc = Proc(self, [PYTHON_EXEC] + list(argv), env=self.env(env), name="direct")
        res = proc.wait(TORCH_JOB_TIMEOUT_S)
        self.assertEqual(res.returncode, 0, res.describe())
        left = proc.survivors()
        self.assertEqual(left, [], "the script left processes behind")
        return res

    # --- checks shared by both forms of test_run.py ------------------------------------------
    def check_min_max_nodes_parse(self):
        # parse_min_max_nnodes("1") == (1, 1), ("2:20") == (2, 20), ("2:20:30") raises: the
        # parse is torchrun's internal; from outside, --dry_run prints the node range ddprun took
        # and a bad --nnodes is refused.
        port = self.free_port()
        rdzv = ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:%d" % port]
        for nnodes, shown in (("1", "1..1 nodes"), ("2:20", "2..20 nodes")):
            res = self.torchrun(["--dry_run", "--nnodes=" + nnodes] + rdzv + ["--no-python", "/bin/true"])
            self.assert_exit(res, 0)
            self.assertIn(shown, res.stdout, res.describe())
        res = self.torchrun(["--nnodes=2:20:30"] + rdzv + ["--no-python", path("touch_rank.sh"), self.test_dir])
        self.assert_refused(res, "2:20:30")

    def check_nproc(self, nproc_type, expected, nproc_flag, tail, env=None):
        """_test_nproc_launch_configuration: --nproc-per-node=<nproc_type> runs `expected`
        workers of bin/test_script.sh. `tail` is the case's flags after --nproc-per-node."""
        args = ["--nnodes=1", "%s=%s" % (nproc_flag, nproc_type)] + tail
        res = self.torchrun(args + [path("touch_rank.sh"), self.test_dir], env=env)
        self.assert_ranks_touched(res, expected)
        for name in os.listdir(self.test_dir):
            os.remove(os.path.join(self.test_dir, name))  # the next configuration of the case

    # What PyTorch's mocks of torch.cuda / torch.xpu / torch.accelerator stand for, as ddprun sees
    # devices (launcher/nproc.cc): CUDA through the driver or, without one, CUDA_VISIBLE_DEVICES;
    # Intel GPUs through ZE_AFFINITY_MASK when set.
    NO_ACCELERATOR = {"CUDA_VISIBLE_DEVICES": "", "ZE_AFFINITY_MASK": ""}

    def three_cuda_devices(self):
        if cuda_driver_loaded():
            self.skipTest("a CUDA driver is loaded here, so ddprun counts the real devices; the case "
                          "mocks torch.cuda.device_count() to 3, which cannot be done from outside")
        return {"CUDA_VISIBLE_DEVICES": "0,1,2", "ZE_AFFINITY_MASK": ""}

    THREE_XPUS = {"CUDA_VISIBLE_DEVICES": "", "ZE_AFFINITY_MASK": "0,1,2"}


class TestRunPy(ConformanceTest):
    """test/distributed/launcher/test_run.py, torch 2.x (PyTorch main): dash spellings, a static
    or c10d rendezvous."""

    def script_args(self):
        return [path("touch_rank.py"), "--touch-file-dir=%s" % self.test_dir]

    # PyTorch: test_run.py::test_launch_user_script_python
    def test_launch_user_script_python(self):
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--rdzv-id=%s" % self.run_id(),
                             "--monitor-interval=1", "--start-method=spawn"] + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: test_run.py::test_launch_user_script_python_caffe2_bc
    def test_launch_user_script_python_caffe2_bc(self):
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn",
                             "--master-addr=localhost", "--master-port=%d" % self.free_port(), "--node-rank=0"]
                            + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: test_run.py::test_launch_user_script_bash
    def test_launch_user_script_bash(self):
        args = ["--nnodes=1", "--nproc-per-node=4", "--rdzv-id=%s" % self.run_id(), "--monitor-interval=1",
                "--start-method=spawn", "--no-python"]
        script_args = [path("touch_rank.sh"), self.test_dir]
        # --no-python cannot be used with --module
        self.assert_refused(self.torchrun(args + ["--module"] + script_args), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(args + script_args), 4)

    # PyTorch: test_run.py::test_launch_user_script_default_nproc
    def test_launch_user_script_default_nproc(self):
        args = ["--nnodes=1", "--rdzv-id=%s" % self.run_id(), "--monitor-interval=1", "--start-method=spawn",
                "--no-python"]
        script_args = [path("touch_rank.sh"), self.test_dir]
        self.assert_refused(self.torchrun(args + ["--module"] + script_args), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(args + script_args), 1)

    # PyTorch: test_run.py::test_launch_with_env_vars
    def test_launch_with_env_vars(self):
        env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "4", "PET_RDZV_ID": self.run_id(),
               "PET_MONITOR_INTERVAL": "1", "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}
        script_args = [path("touch_rank.sh"), self.test_dir]
        self.assert_refused(self.torchrun(script_args, env=dict(env, PET_MODULE="1")), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(script_args, env=dict(env, PET_MODULE="0")), 4)

    def nproc_tail(self):
        return ["--rdzv-id=%s" % self.run_id(), "--monitor-interval=1", "--start-method=spawn", "--no-python"]

    # PyTorch: test_run.py::test_nproc_launch_auto_configurations
    def test_nproc_launch_auto_configurations(self):
        # The case mocks torch.accelerator.is_available() to False and expects
        # torch._utils.cpu_count() workers: in torch 2.x the CPUs of the process's affinity
        # (os.sched_getaffinity, which honours taskset and cpusets), where torch 1.13 counted the
        # online CPUs (os.cpu_count(); RunTestPy's form). ddprun inherits this process's affinity.
        self.check_nproc("auto", len(os.sched_getaffinity(0)), "--nproc-per-node", self.nproc_tail(),
                         env=self.NO_ACCELERATOR)

    # PyTorch: test_run.py::test_nproc_launch_auto_configurations, with the affinity narrowed (as
    # taskset or a cpuset does): torch 2.x counts only the CPUs the process may run on, and so does
    # ddprun. It counted the online CPUs before (2 workers on one allowed CPU here).
    def test_nproc_launch_auto_counts_the_cpus_of_the_affinity(self):
        allowed = os.sched_getaffinity(0)
        if len(allowed) < 2:
            self.skipTest("one CPU only: a narrower affinity cannot be told apart")
        os.sched_setaffinity(0, {min(allowed)})  # ddprun inherits it
        try:
            self.check_nproc("auto", 1, "--nproc-per-node", self.nproc_tail(), env=self.NO_ACCELERATOR)
        finally:
            os.sched_setaffinity(0, allowed)

    # PyTorch: test_run.py::test_nproc_launch_number_configurations
    def test_nproc_launch_number_configurations(self):
        self.check_nproc("4", 4, "--nproc-per-node", self.nproc_tail())

    # PyTorch: test_run.py::test_nproc_launch_unknown_configurations
    def test_nproc_launch_unknown_configurations(self):
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=unknown"] + self.nproc_tail()
                            + [path("touch_rank.sh"), self.test_dir])
        self.assert_refused(res, "unknown")

    # PyTorch: test_run.py::test_nproc_gpu_launch_configurations (mocks 3 CUDA devices)
    def test_nproc_gpu_launch_configurations(self):
        env = self.three_cuda_devices()
        self.check_nproc("auto", 3, "--nproc-per-node", self.nproc_tail(), env=env)
        self.check_nproc("gpu", 3, "--nproc-per-node", self.nproc_tail(), env=env)

    # PyTorch: test_run.py::test_nproc_xpu_launch_configurations (mocks 3 Intel GPUs, the current
    # accelerator: "auto" means them too)
    def test_nproc_xpu_launch_configurations(self):
        self.check_nproc("auto", 3, "--nproc-per-node", self.nproc_tail(), env=self.THREE_XPUS)
        self.check_nproc("xpu", 3, "--nproc-per-node", self.nproc_tail(), env=self.THREE_XPUS)

    def elastic_args(self, conf, extra=()):
        return (["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=localhost:%d" % self.free_port(), conf, "--rdzv-id=%s" % self.run_id(),
                 "--monitor-interval=1"] + list(extra) + ["--start-method=spawn"])

    # PyTorch: test_run.py::test_launch_elastic
    def test_launch_elastic(self):
        # One agent of 1..2 nodes: it starts alone after the last call. The quotes are part of the
        # --rdzv-conf value, as in PyTorch's argv.
        args = self.elastic_args("--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'") + self.script_args()
        self.assert_ranks_touched(self.torchrun(args, timeout=ELASTIC_SINGLE_AGENT_TIMEOUT_S), 4)

    # PyTorch: test_run.py::test_launch_elastic_worker_raise_exception
    def test_launch_elastic_worker_raise_exception(self):
        conf = "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'"
        script = [path("touch_rank.py"), "--fail"]
        res = self.torchrun(self.elastic_args(conf, ["--max-restarts=0"]) + script,
                            timeout=ELASTIC_SINGLE_AGENT_TIMEOUT_S)
        self.assert_worker_failed(res)
        # The case also mocks torch.distributed.elastic.events.record and asserts one call: the
        # launcher records the agent's failure once. From outside: with the console event handler
        # (an added flag), exactly one FAILED event of source AGENT.
        res = self.torchrun(self.elastic_args(conf, ["--max-restarts=0", "--event_log_handler=console"])
                            + script, timeout=ELASTIC_SINGLE_AGENT_TIMEOUT_S)
        self.assert_worker_failed(res)
        agent_events = [line for line in res.stderr.splitlines()
                        if line.startswith('{"name":"torchelastic.worker.status.') and '"source":"AGENT"' in line]
        self.assertEqual(len(agent_events), 1, res.describe())
        self.assertIn('"name":"torchelastic.worker.status.FAILED"', agent_events[0])

    # PyTorch: test_run.py::test_launch_elastic_agent_raise_exception
    def test_launch_elastic_agent_raise_exception(self):
        self.skipTest("the case makes the agent raise by mock.patch of LocalElasticAgent.run (and counts "
                      "events.record calls); ddprun's agent cannot be made to raise from outside")

    # PyTorch: test_run.py::test_launch_standalone
    def test_launch_standalone(self):
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--standalone", "--monitor-interval=1",
                             "--start-method=spawn"] + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: test_run.py::test_launch_run_path
    def test_launch_run_path(self):
        res = self.torchrun(["--run-path", "--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1",
                             "--start-method=spawn"] + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: test_run.py::test_launch_elastic_multiple_agents
    def test_launch_elastic_multiple_agents(self):
        # Two agents of 1..2 nodes on one machine (PyTorch: one in a child process, one in its
        # own); both exit 0 and the 8 ranks ran.
        args = self.elastic_args("--rdzv_conf=timeout=5") + self.script_args()
        jobs = [self.start(args, env=self.env()) for _ in range(2)]
        results = [job.wait() for job in jobs]
        for job, res in zip(jobs, results):
            self.assert_exit(res, 0)
            self.assert_no_survivors(job, res)
        self.assertEqual(set(os.listdir(self.test_dir)), {str(i) for i in range(8)},
                         "\n".join(r.describe() for r in results))

    # PyTorch: test_run.py::test_min_max_nodes_parse
    def test_min_max_nodes_parse(self):
        self.check_min_max_nodes_parse()

    # PyTorch: test_run.py::test_launch_shutdown
    def test_launch_shutdown(self):
        self.skipTest("the case mocks LocalElasticAgent and the rendezvous handler and asserts that "
                      "handler.shutdown() is called once; a static single-node job shows no trace of it outside")

    def is_torchelastic_launched(self, extra):
        out_file = os.path.join(self.test_dir, "out")
        res = self.torchrun(["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1"] + extra
                            + [path("is_torchelastic_launched.py"), "--out-file=%s" % out_file])
        self.assert_exit(res, 0)
        self.assertEqual(self.read_out_file(out_file, res), "True", res.describe())

    # PyTorch: test_run.py::test_is_torchelastic_launched
    def test_is_torchelastic_launched(self):
        self.is_torchelastic_launched([])

    # PyTorch: test_run.py::test_is_torchelastic_launched_with_logs_spec_defined
    def test_is_torchelastic_launched_with_logs_spec_defined(self):
        # The case mocks the entry points so that "default" names torch's DefaultLogsSpecs, as an
        # installed torch registers it: ddprun's built-in logs spec answers to that name.
        self.is_torchelastic_launched(["--logs_specs=default"])

    # PyTorch: test_run.py::test_logs_logs_spec_entrypoint_must_be_defined
    def test_logs_logs_spec_entrypoint_must_be_defined(self):
        res = self.torchrun(["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                             "--logs_specs=DOESNOT_EXIST", path("is_torchelastic_launched.py")])
        self.assert_refused(res, "DOESNOT_EXIST")

    # PyTorch: test_run.py::test_is_not_torchelastic_launched
    def test_is_not_torchelastic_launched(self):
        # No launcher: the script alone (PyTorch: runpy in the test's interpreter) says False.
        out_file = os.path.join(self.test_dir, "out")
        res = self.run_script_directly([path("is_torchelastic_launched.py"), "--out-file=%s" % out_file])
        self.assertEqual(self.read_out_file(out_file, res), "False", res.describe())

    def init_method_with_torchelastic(self, port, init_method):
        res = self.torchrun(["--run-path", "--nnodes=1", "--nproc-per-node=4", "--master-addr=localhost",
                             "--master-port=%d" % port, "--monitor-interval=1", path("init_method.py"),
                             init_method], timeout=TORCH_JOB_TIMEOUT_S)
        # PyTorch validates nothing beyond main() returning; the script prints Done per rank.
        self.assert_exit(res, 0)
        self.assertEqual(res.stdout.count("Done"), 4, res.describe())

    # PyTorch: test_run.py::test_init_method_tcp_with_torchelastic
    def test_init_method_tcp_with_torchelastic(self):
        port = self.free_port()
        self.init_method_with_torchelastic(port, "--init-method=tcp://localhost:%d" % port)

    # PyTorch: test_run.py::test_init_method_env_with_torchelastic
    def test_init_method_env_with_torchelastic(self):
        port = self.free_port()
        self.init_method_with_torchelastic(port, "--init-method=env://")

    # PyTorch: test_run.py::test_capture_logs_using_default_logs_specs
    def test_capture_logs_using_default_logs_specs(self):
        # --redirect is argparse's abbreviation of --redirects; the prefix template comes from
        # torch's environment variable, in string.Template syntax.
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--rdzv-id=%s" % self.run_id(), "--redirect=3",
                             "--tee=3", "--monitor-interval=1", "--start-method=spawn", "--no-python",
                             path("touch_rank.sh"), self.test_dir],
                            env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "})
        self.assert_exit(res, 0)
        for i in range(4):
            self.assertIn("[rank%d]: creating " % i, res.stdout, res.describe())

    # PyTorch: test_run.py::test_virtual_local_rank
    def test_virtual_local_rank(self):
        self.skipTest("needs 2 GPUs: the case compares the code torch.compile generates on cuda:0 and "
                      "cuda:1 with and without --virtual-local-rank")


class RunTestPy(ConformanceTest):
    """test/distributed/launcher/run_test.py, torch 1.13: underscore spellings, an etcd rendezvous.
    As PyTorch's setUpClass, one standalone etcd server (v2 API enabled, as torch's EtcdServer
    starts it) serves the whole class; ddprun speaks etcd's v3 API to it (docs/etcd.md)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.etcd = None
        cls.etcd_missing = etcd_available()
        if cls.etcd_missing is None:
            cls.etcd = EtcdCluster(size=1, enable_v2=True).start()
            cls.addClassCleanup(cls.etcd.close)
            cls.etcd_endpoint = "localhost:%d" % cls.etcd.client_ports[0]  # EtcdServer.get_endpoint()

    def etcd_args(self):
        if self.etcd is None:
            self.skipTest("needs an etcd server: " + self.etcd_missing)
        return ["--rdzv_backend=etcd", "--rdzv_endpoint=%s" % self.etcd_endpoint]

    def script_args(self):
        return [path("touch_rank.py"), "--touch_file_dir=%s" % self.test_dir]

    # PyTorch: run_test.py::test_launch_user_script_python
    def test_launch_user_script_python(self):
        res = self.torchrun(["--nnodes=1", "--nproc_per_node=4"] + self.etcd_args()
                            + ["--rdzv_id=%s" % self.run_id(), "--monitor_interval=1", "--start_method=spawn"]
                            + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: run_test.py::test_launch_user_script_python_caffe2_bc
    def test_launch_user_script_python_caffe2_bc(self):
        res = self.torchrun(["--nnodes=1", "--nproc_per_node=4", "--monitor_interval=1", "--start_method=spawn",
                             "--master_addr=localhost", "--master_port=%d" % self.free_port(), "--node_rank=0"]
                            + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: run_test.py::test_launch_user_script_bash
    def test_launch_user_script_bash(self):
        args = (["--nnodes=1", "--nproc_per_node=4"] + self.etcd_args()
                + ["--rdzv_id=%s" % self.run_id(), "--monitor_interval=1", "--start_method=spawn", "--no_python"])
        script_args = [path("touch_rank.sh"), self.test_dir]
        self.assert_refused(self.torchrun(args + ["--module"] + script_args), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(args + script_args), 4)

    # PyTorch: run_test.py::test_launch_user_script_default_nproc
    def test_launch_user_script_default_nproc(self):
        args = (["--nnodes=1"] + self.etcd_args()
                + ["--rdzv_id=%s" % self.run_id(), "--monitor_interval=1", "--start_method=spawn", "--no_python"])
        script_args = [path("touch_rank.sh"), self.test_dir]
        self.assert_refused(self.torchrun(args + ["--module"] + script_args), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(args + script_args), 1)

    # PyTorch: run_test.py::test_launch_with_env_vars
    def test_launch_with_env_vars(self):
        self.etcd_args()  # skips without etcd
        env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "4", "PET_RDZV_BACKEND": "etcd",
               "PET_RDZV_ENDPOINT": self.etcd_endpoint, "PET_RDZV_ID": self.run_id(), "PET_MONITOR_INTERVAL": "1",
               "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}
        script_args = [path("touch_rank.sh"), self.test_dir]
        self.assert_refused(self.torchrun(script_args, env=dict(env, PET_MODULE="1")), "--module", "--no_python")
        self.assert_ranks_touched(self.torchrun(script_args, env=dict(env, PET_MODULE="0")), 4)

    def nproc_tail(self):
        return self.etcd_args() + ["--rdzv_id=%s" % self.run_id(), "--monitor_interval=1", "--start_method=spawn",
                                   "--no_python"]

    # PyTorch: run_test.py::test_nproc_launch_auto_configurations
    def test_nproc_launch_auto_configurations(self):
        # torch 1.13 expects os.cpu_count() workers with no mock, so on a CPU-only machine; devices
        # are hidden here so that a machine with GPUs counts as one. ddprun counts as torch 2.x does,
        # the CPUs of its affinity: the same number unless the tests run under taskset or a cpuset.
        self.check_nproc("auto", len(os.sched_getaffinity(0)), "--nproc_per_node", self.nproc_tail(),
                         env=self.NO_ACCELERATOR)

    # PyTorch: run_test.py::test_nproc_launch_number_configurations
    def test_nproc_launch_number_configurations(self):
        self.check_nproc("4", 4, "--nproc_per_node", self.nproc_tail())

    # PyTorch: run_test.py::test_nproc_launch_unknown_configurations
    def test_nproc_launch_unknown_configurations(self):
        res = self.torchrun(["--nnodes=1", "--nproc_per_node=unknown"] + self.nproc_tail()
                            + [path("touch_rank.sh"), self.test_dir])
        self.assert_refused(res, "unknown")

    # PyTorch: run_test.py::test_nproc_gpu_launch_configurations (mocks 3 CUDA devices)
    def test_nproc_gpu_launch_configurations(self):
        env = self.three_cuda_devices()
        self.check_nproc("auto", 3, "--nproc_per_node", self.nproc_tail(), env=env)
        self.check_nproc("gpu", 3, "--nproc_per_node", self.nproc_tail(), env=env)

    def elastic_args(self, extra=()):
        return (["--nnodes=1:2", "--nproc_per_node=4"] + self.etcd_args()
                + ["--rdzv_id=%s" % self.run_id(), "--monitor_interval=1"] + list(extra) + ["--start_method=spawn"])

    # PyTorch: run_test.py::test_launch_elastic
    def test_launch_elastic(self):
        res = self.torchrun(self.elastic_args() + self.script_args(), timeout=ELASTIC_SINGLE_AGENT_TIMEOUT_S,
                            why="one agent of 1..2 nodes starts alone after the last call (30 s)")
        self.assert_ranks_touched(res, 4)

    # PyTorch: run_test.py::test_launch_elastic_worker_raise_exception
    def test_launch_elastic_worker_raise_exception(self):
        # The events.record mock (one call) is checked from outside in TestRunPy's form of the case.
        res = self.torchrun(self.elastic_args(["--max_restarts=0"]) + [path("touch_rank.py"), "--fail"],
                            timeout=ELASTIC_SINGLE_AGENT_TIMEOUT_S,
                            why="one agent of 1..2 nodes starts alone after the last call (30 s)")
        self.assert_worker_failed(res)

    # PyTorch: run_test.py::test_launch_elastic_agent_raise_exception
    def test_launch_elastic_agent_raise_exception(self):
        self.skipTest("the case makes the agent raise by mock.patch of LocalElasticAgent.run (and counts "
                      "events.record calls); ddprun's agent cannot be made to raise from outside")

    # PyTorch: run_test.py::test_launch_standalone
    def test_launch_standalone(self):
        res = self.torchrun(["--nnodes=1", "--nproc_per_node=4", "--standalone", "--monitor_interval=1",
                             "--start_method=spawn"] + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: run_test.py::test_launch_run_path
    def test_launch_run_path(self):
        res = self.torchrun(["--run_path", "--nnodes=1", "--nproc_per_node=4", "--monitor_interval=1",
                             "--start_method=spawn"] + self.script_args())
        self.assert_ranks_touched(res, 4)

    # PyTorch: run_test.py::test_launch_elastic_multiple_agents
    def test_launch_elastic_multiple_agents(self):
        args = self.elastic_args() + self.script_args()
        jobs = [self.start(args, env=self.env()) for _ in range(2)]
        results = [job.wait() for job in jobs]
        for job, res in zip(jobs, results):
            self.assert_exit(res, 0)
            self.assert_no_survivors(job, res)
        self.assertEqual(set(os.listdir(self.test_dir)), {str(i) for i in range(8)},
                         "\n".join(r.describe() for r in results))

    # PyTorch: run_test.py::test_min_max_nodes_parse
    def test_min_max_nodes_parse(self):
        self.check_min_max_nodes_parse()

    # PyTorch: run_test.py::test_launch_shutdown
    def test_launch_shutdown(self):
        self.skipTest("the case mocks LocalElasticAgent and the rendezvous handler and asserts that "
                      "handler.shutdown() is called once; a static single-node job shows no trace of it outside")

    # PyTorch: run_test.py::test_is_torchelastic_launched
    def test_is_torchelastic_launched(self):
        out_file = os.path.join(self.test_dir, "out")
        res = self.torchrun(["--run_path", "--nnodes=1", "--nproc_per_node=1", "--monitor_interval=1",
                             path("is_torchelastic_launched.py"), "--out_file=%s" % out_file])
        self.assert_exit(res, 0)
        self.assertEqual(self.read_out_file(out_file, res), "True", res.describe())

    # PyTorch: run_test.py::test_is_not_torchelastic_launched
    def test_is_not_torchelastic_launched(self):
        out_file = os.path.join(self.test_dir, "out")
        res = self.run_script_directly([path("is_torchelastic_launched.py"), "--out_file=%s" % out_file])
        self.assertEqual(self.read_out_file(out_file, res), "False", res.describe())

    # PyTorch: run_test.py::test_init_method_tcp (the script alone, no launcher)
    def test_init_method_tcp(self):
        port = self.free_port()
        res = self.run_script_directly([path("init_method.py"), "--init_method=tcp://localhost:%d" % port,
                                        "--rank=0", "--world_size=1"])
        self.assertIn("Done", res.stdout, res.describe())

    # PyTorch: run_test.py::test_init_method_env (the script alone, no launcher)
    def test_init_method_env(self):
        port = self.free_port()
        res = self.run_script_directly([path("init_method.py"), "--init_method=env://"],
                                       env={"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                                            "MASTER_PORT": str(port)})
        self.assertIn("Done", res.stdout, res.describe())

    def init_method_with_torchelastic(self, port, init_method):
        res = self.torchrun(["--run_path", "--nnodes=1", "--nproc_per_node=4", "--master_addr=localhost",
                             "--master_port=%d" % port, "--monitor_interval=1", path("init_method.py"),
                             init_method], timeout=TORCH_JOB_TIMEOUT_S)
        self.assert_exit(res, 0)
        self.assertEqual(res.stdout.count("Done"), 4, res.describe())

    # PyTorch: run_test.py::test_init_method_tcp_with_torchelastic
    def test_init_method_tcp_with_torchelastic(self):
        port = self.free_port()
        self.init_method_with_torchelastic(port, "--init_method=tcp://localhost:%d" % port)

    # PyTorch: run_test.py::test_init_method_env_with_torchelastic
    def test_init_method_env_with_torchelastic(self):
        port = self.free_port()
        self.init_method_with_torchelastic(port, "--init_method=env://")


class LaunchTestPy(ConformanceTest):
    """test/distributed/launcher/launch_test.py (torch 2.x spellings): the deprecated
    `python -m torch.distributed.launch`, which is torchrun plus one thing, the local rank passed to
    the script as an argument unless --use-env. ddprun does that with --legacy_local_rank, the
    flag this re-expression adds; the spelling follows the interpreter's torch, as its launch did:
    --local_rank up to torch 1.x, --local-rank from torch 2.0 on."""

    # PyTorch: launch_test.py::test_launch_without_env
    def test_launch_without_env(self):
        major = torch_major()
        if major is None:
            self.skipTest("no torch under %s to take the local-rank spelling from" % PYTHON_EXEC)
        mode, flag = ("dash", "--local-rank") if major >= 2 else ("underscore", "--local_rank")
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn",
                             "--master-addr=localhost", "--master-port=%d" % self.free_port(), "--node-rank=0",
                             "--legacy_local_rank=" + mode, path("local_rank_arg.py")])
        self.assert_exit(res, 0)
        self.assertEqual(res.stdout.count("End execution"), 4, res.describe())
        self.assertEqual(res.stdout.count("local rank flag: %s\n" % flag), 4, res.describe())

    # PyTorch: launch_test.py::test_launch_with_env
    def test_launch_with_env(self):
        # --use-env (the script reads LOCAL_RANK, no argument) is what torchrun, and ddprun, do
        # anyway; torchrun has no such flag and ddprun refuses it as torchrun does, so it is left out.
        res = self.torchrun(["--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn",
                             "--master-addr=localhost", "--master-port=%d" % self.free_port(), "--node-rank=0",
                             path("touch_rank.py"), "--touch-file-dir=%s" % self.test_dir])
        self.assert_ranks_touched(res, 4)


if __name__ == "__main__":
    main()
