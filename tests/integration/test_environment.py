"""What workers get: torchrun's environment contract, their arguments untouched, PET_* defaults,
and the right way of running the program (.py under $PYTHON_EXEC -u, -m module, --no_python)."""

import os

from ddprun_testlib import PYTHON_EXEC, DdprunTestCase, main

# Dumps the environment as NUL-separated entries, and argv one per line.
DUMP = """
env -0 > "%(d)s/env_$LOCAL_RANK"
for a in "$0" "$@"; do printf '%%s\\n' "$a"; done > "%(d)s/argv_$LOCAL_RANK"
"""


class EnvironmentTest(DdprunTestCase):
    def dump_script(self):
        return self.script("dump.sh", DUMP % {"d": self.tmp})

    def env_of(self, local_rank):
        with open(self.path("env_%d" % local_rank), "rb") as f:
            entries = f.read().decode().split("\0")
        return dict(e.split("=", 1) for e in entries if "=" in e)

    def argv_of(self, local_rank):
        return self.read("argv_%d" % local_rank).split("\n")[:-1]

    def test_contract_variables(self):
        prog = self.dump_script()
        res = self.run_job(["--standalone", "--nproc_per_node=3", "--max_restarts=4", "--rdzv_id=envjob", prog],
                           env={"MY_INHERITED_SETTING": "kept", "OMP_NUM_THREADS": None})
        self.assert_exit(res, 0)
        envs = [self.env_of(r) for r in range(3)]
        for r, env in enumerate(envs):
            with self.subTest(local_rank=r):
                self.assertEqual(env["RANK"], str(r))
                self.assertEqual(env["LOCAL_RANK"], str(r))
                self.assertEqual(env["WORLD_SIZE"], "3")
                self.assertEqual(env["LOCAL_WORLD_SIZE"], "3")
                self.assertEqual(env["GROUP_RANK"], "0")
                self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
                self.assertEqual(env["ROLE_RANK"], str(r))
                self.assertEqual(env["ROLE_WORLD_SIZE"], "3")
                self.assertEqual(env["ROLE_NAME"], "default")
                self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
                self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "4")
                self.assertEqual(env["TORCHELASTIC_RUN_ID"], "envjob")
                self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")  # the agent serves torch's store
                self.assertTrue(env["TORCHELASTIC_ERROR_FILE"].endswith("error.json"), env["TORCHELASTIC_ERROR_FILE"])
                self.assertEqual(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
                self.assertEqual(env["OMP_NUM_THREADS"], "1")
                self.assertEqual(env["MY_INHERITED_SETTING"], "kept")
                port = int(env["MASTER_PORT"])
                self.assertTrue(1 <= port <= 65535, port)
                self.assertTrue(env["MASTER_ADDR"])
        # One master for all, one error file each.
        self.assertEqual(len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}), 1)
        self.assertEqual(len({e["TORCHELASTIC_ERROR_FILE"] for e in envs}), 3)

    def test_omp_num_threads_override_kept(self):
        prog = self.dump_script()
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog], env={"OMP_NUM_THREADS": "7"})
        self.assert_exit(res, 0)
        self.assertEqual(self.env_of(1)["OMP_NUM_THREADS"], "7", "a user's OMP_NUM_THREADS must be kept")

    def test_standalone_ports_differ_between_jobs(self):
        # Two standalone jobs at once must not collide on MASTER_PORT.
        prog = self.script("port.sh", 'echo "$MASTER_PORT" > "%s/port_$1"\nsleep 0.3\n' % self.tmp)
        a = self.start(["--standalone", prog, "a"])
        b = self.start(["--standalone", prog, "b"])
        ra, rb = a.wait(20), b.wait(20)
        self.assert_exit(ra, 0)
        self.assert_exit(rb, 0)
        self.assertNotEqual(self.read("port_a"), self.read("port_b"))

    def test_program_args_untouched_even_when_they_look_like_flags(self):
        prog = self.dump_script()
        args = ["--nproc_per_node=5", "--max_restarts", "3", "-m", "--standalone", "--", "a b", "", "--help",
                "-r", "0:3", "--log_dir=/nonexistent", "*"]
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog] + args)
        self.assert_exit(res, 0)
        for r in (0, 1):
            self.assertEqual(self.argv_of(r), [prog] + args, res.describe())
        self.assertFalse(os.path.exists(self.path("env_2")), "--nproc_per_node after PROGRAM was taken by ddprun")

    def test_double_dash_before_program(self):
        prog = self.dump_script()
        res = self.run_job(["--standalone", "--", prog, "x", "--y"])
        self.assert_exit(res, 0)
        self.assertEqual(self.argv_of(0), [prog, "x", "--y"])

    def test_pet_nproc_per_node_sets_default(self):
        prog = self.dump_script()
        res = self.run_job(["--standalone", prog], env={"PET_NPROC_PER_NODE": "3"})
        self.assert_exit(res, 0)
        self.assertEqual(sorted(f for f in os.listdir(self.tmp) if f.startswith("env_")), ["env_0", "env_1", "env_2"])
        self.assertEqual(self.env_of(2)["WORLD_SIZE"], "3")

    def test_flag_beats_pet_variable(self):
        prog = self.dump_script()
        res = self.run_job(["--standalone", "--nproc-per-node=2", prog], env={"PET_NPROC_PER_NODE": "3"})
        self.assert_exit(res, 0)
        self.assertEqual(self.env_of(0)["WORLD_SIZE"], "2")
        self.assertFalse(os.path.exists(self.path("env_2")))

    def python_wrapper(self):
        """A $PYTHON_EXEC that records how it was called, then runs the real interpreter."""
        return self.script("mypython", 'printf "%%s\\n" "$@" > "%s/python_args_$LOCAL_RANK"\nexec %s "$@"\n' % (
            self.tmp, PYTHON_EXEC))

    def test_py_program_runs_under_python_exec_unbuffered(self):
        py = self.python_wrapper()
        prog = self.write_file("train.py", """
            import os, sys
            with open(os.path.join(%r, "py_argv_" + os.environ["LOCAL_RANK"]), "w") as f:
                f.write("\\n".join(sys.argv) + "\\n")
            """ % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog, "--lr", "0.1"], env={"PYTHON_EXEC": py})
        self.assert_exit(res, 0)
        for r in (0, 1):
            self.assertEqual(self.read("python_args_%d" % r).split("\n")[:-1], ["-u", prog, "--lr", "0.1"])
            self.assertEqual(self.read("py_argv_%d" % r).split("\n")[:-1], [prog, "--lr", "0.1"])

    def test_module(self):
        py = self.python_wrapper()
        self.write_file("pkg_for_ddprun_test/__init__.py", "")
        self.write_file("pkg_for_ddprun_test/entry.py", """
            import os, sys
            with open(os.path.join(%r, "mod_" + os.environ["LOCAL_RANK"]), "w") as f:
                f.write(__name__ + " " + " ".join(sys.argv[1:]))
            """ % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "-m", "pkg_for_ddprun_test.entry", "--flag", "v"],
                           env={"PYTHON_EXEC": py, "PYTHONPATH": self.tmp})
        self.assert_exit(res, 0)
        for r in (0, 1):
            self.assertEqual(self.read("mod_%d" % r), "__main__ --flag v")
            self.assertEqual(self.read("python_args_%d" % r).split("\n")[:-1],
                             ["-u", "-m", "pkg_for_ddprun_test.entry", "--flag", "v"])

    def test_no_python_runs_py_file_directly(self):
        py = self.python_wrapper()
        prog = self.script("tool.py", 'echo "ran directly: $1" > "%s/direct_$LOCAL_RANK"\n' % self.tmp)
        res = self.run_job(["--standalone", "--no_python", prog, "arg"], env={"PYTHON_EXEC": py})
        self.assert_exit(res, 0)
        self.assertEqual(self.read("direct_0").strip(), "ran directly: arg")
        self.assertFalse(os.path.exists(self.path("python_args_0")), "--no_python still went through $PYTHON_EXEC")

    def test_program_found_on_path(self):
        bindir = self.path("bin")
        os.mkdir(bindir)
        self.script("bin/my-ddprun-tool", 'echo "$RANK" > "%s/onpath_$LOCAL_RANK"\n' % self.tmp)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "my-ddprun-tool"],
                           env={"PATH": bindir + ":" + os.environ.get("PATH", "/usr/bin:/bin")})
        self.assert_exit(res, 0)
        self.assertEqual(self.read("onpath_1").strip(), "1")

    def test_dry_run_prints_environment_and_starts_nothing(self):
        prog = self.script("never.sh", 'touch "%s/started_$LOCAL_RANK"\n' % self.tmp)
        job = self.start(["--standalone", "--nproc_per_node=2", "--dry_run", prog, "arg1"])
        res = job.wait(10)
        self.assert_exit(res, 0)
        out = res.stdout
        for pattern in (r"(?m)^\s*RANK=0$", r"(?m)^\s*RANK=1$", r"(?m)^\s*LOCAL_RANK=1$",
                        r"(?m)^\s*WORLD_SIZE=2$", r"(?m)^\s*MASTER_PORT=(\d+|<a free port, chosen at start>)$", r"(?m)^\s*MASTER_ADDR=\S+$",
                        r"(?m)^\s*TORCHELASTIC_RESTART_COUNT=0$"):
            self.assertRegex(out, pattern, res.describe())
        self.assertIn(prog, out)
        self.assertIn("arg1", out)
        self.assertEqual([f for f in os.listdir(self.tmp) if f.startswith("started_")], [], "--dry_run started workers")
        self.assert_no_survivors(job, res)


if __name__ == "__main__":
    main()
