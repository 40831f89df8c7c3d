"""Worker output: console lines prefixed per worker ([default0]:, or --log_line_prefix_template),
intact and in order under heavy output, per-attempt per-rank log files with --log_dir, and
--redirects, --tee (also per-rank maps) and --local_ranks_filter."""

import glob
import importlib.util
import os
import re

from ddprun_testlib import WORKERS, DdprunTestCase, hostname, main, worker

# The same text the worker prints: its own line_text, loaded from the worker file.
_spec = importlib.util.spec_from_file_location("print_lines", os.path.join(WORKERS, "print_lines.py"))
_print_lines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_print_lines)
line_text = _print_lines.line_text

# Prints one tagged line to stdout and one to stderr; the tags name rank and attempt.
TAGGED = """
echo "OUT-r$LOCAL_RANK-a$TORCHELASTIC_RESTART_COUNT"
echo "ERR-r$LOCAL_RANK-a$TORCHELASTIC_RESTART_COUNT" >&2
"""


def tagged_lines(text, kind):
    """Lines of `text` that carry a worker's tag of `kind` (OUT or ERR)."""
    return [line for line in text.splitlines() if (kind + "-r") in line]


class ConsolePrefixTest(DdprunTestCase):
    def test_default_prefix_on_stdout_and_stderr(self):
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 0)
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")), ["[default0]:OUT-r0-a0", "[default1]:OUT-r1-a0"],
                         res.describe())
        self.assertEqual(sorted(tagged_lines(res.stderr, "ERR")), ["[default0]:ERR-r0-a0", "[default1]:ERR-r1-a0"],
                         res.describe())
        self.assertEqual(tagged_lines(res.stdout, "ERR"), [], "stderr leaked into stdout")

    def test_role_in_default_prefix(self):
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--role", "trainer", prog])
        self.assert_exit(res, 0)
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")), ["[trainer0]:OUT-r0-a0", "[trainer1]:OUT-r1-a0"],
                         res.describe())

    def test_prefix_template(self):
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--log_line_prefix_template", "{rank}|{host}|", prog])
        self.assert_exit(res, 0)
        host = hostname()
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")),
                         ["0|%s|OUT-r0-a0" % host, "1|%s|OUT-r1-a0" % host], res.describe())
        self.assertEqual(sorted(tagged_lines(res.stderr, "ERR")),
                         ["0|%s|ERR-r0-a0" % host, "1|%s|ERR-r1-a0" % host], res.describe())

    def test_torchrun_style_prefix_template(self):
        # torchrun's own syntax: ${role_name}, ${rank}, ${local_rank}.
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--log-line-prefix-template",
                            "${role_name}-${local_rank}/${rank}> ", prog])
        self.assert_exit(res, 0)
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")), ["default-0/0> OUT-r0-a0", "default-1/1> OUT-r1-a0"],
                         res.describe())

    def test_last_line_without_newline_is_kept(self):
        prog = self.script("nonl.sh", 'printf "first\\nno newline at the end of r%s" "$LOCAL_RANK"\n')
        res = self.run_job(["--standalone", "--nproc_per_node=2", prog])
        self.assert_exit(res, 0)
        for r in (0, 1):
            self.assertIn("[default%d]:no newline at the end of r%d\n" % (r, r), res.stdout, res.describe())
            self.assertIn("[default%d]:first\n" % r, res.stdout, res.describe())

    def test_heavy_output_lines_intact_prefixed_and_in_order(self):
        count, width = 2000, 3000
        log_dir = self.path("logs")
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--log_dir", log_dir, "--rdzv_id=heavy",
                            worker("print_lines.py"), str(count), str(width)], timeout=60)
        self.assert_exit(res, 0)
        seen = {0: [], 1: []}
        bad = []
        pattern = re.compile(r"^\[default([01])\]:(L[01]:\d{5}:.*)$")
        for line in res.stdout.split("\n")[:-1]:
            m = pattern.match(line)
            if not m:
                bad.append(line[:120])
                continue
            seen[int(m.group(1))].append(m.group(2))
        self.assertEqual(bad[:5], [], "%d malformed console line(s)" % len(bad))
        self.assertTrue(res.stdout.endswith("\n"))
        for r in (0, 1):
            lines = seen[r]
            self.assertEqual(len(lines), count, "rank %d: %d of %d lines on the console" % (r, len(lines), count))
            for i, got in enumerate(lines):
                if got != line_text(r, i, width):
                    self.fail("rank %d line %d is wrong or out of order: %r... (len %d)" % (r, i, got[:40], len(got)))
        # The per-rank log files hold the raw output, byte for byte.
        (run,) = os.listdir(log_dir)
        for r in (0, 1):
            with open(os.path.join(log_dir, run, "attempt_0", str(r), "stdout.log")) as f:
                raw = f.read()
            expected = "".join(line_text(r, i, width) + "\n" for i in range(count))
            self.assertTrue(raw == expected, "rank %d stdout.log differs from what the worker wrote (%d vs %d bytes)"
                            % (r, len(raw), len(expected)))


class LogFilesTest(DdprunTestCase):
    def run_dir(self, log_dir, run_id):
        entries = os.listdir(log_dir)
        self.assertEqual(len(entries), 1, "expected one run folder in %s: %s" % (log_dir, entries))
        self.assertTrue(entries[0].startswith(run_id + "_"), entries[0])
        return os.path.join(log_dir, entries[0])

    def file(self, *parts):
        with open(os.path.join(*parts)) as f:
            return f.read()

    def test_log_dir_keeps_every_attempt_raw(self):
        log_dir = self.path("logs")
        prog = self.script("tagged_fail.sh", TAGGED + """
            echo "RUNID=$TORCHELASTIC_RUN_ID"
            if [ "$LOCAL_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
              until [ -s "%s/rank0_a0" ]; do sleep 0.01; done
              exit 3
            fi
            echo done > "%s/rank${LOCAL_RANK}_a$TORCHELASTIC_RESTART_COUNT"
            """ % (self.tmp, self.tmp))
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=logtest42",
                            "--log_dir", log_dir, prog])
        self.assert_exit(res, 0)
        run = self.run_dir(log_dir, "logtest42")
        for attempt in (0, 1):
            for r in (0, 1):
                d = os.path.join(run, "attempt_%d" % attempt, str(r))
                out = self.file(d, "stdout.log")
                err = self.file(d, "stderr.log")
                self.assertEqual(out.splitlines()[:2], ["OUT-r%d-a%d" % (r, attempt), "RUNID=logtest42"],
                                 "%s/stdout.log: %r" % (d, out))
                self.assertEqual(err, "ERR-r%d-a%d\n" % (r, attempt), "%s/stderr.log" % d)
        # --log_dir alone does not take output off the console.
        self.assertIn("[default1]:OUT-r1-a1", res.stdout, res.describe())
        self.assertIn("[default0]:OUT-r0-a0", res.stdout, res.describe())

    def test_log_dir_named_after_generated_run_id(self):
        log_dir = self.path("logs")
        prog = self.script("runid.sh", 'echo "$TORCHELASTIC_RUN_ID"\n')
        res = self.run_job(["--standalone", "--log_dir", log_dir, prog])
        self.assert_exit(res, 0)
        lines = [l for l in res.stdout.splitlines() if l.startswith("[default0]:")]
        self.assertEqual(len(lines), 1, res.describe())
        run_id = lines[0][len("[default0]:"):]
        self.assertTrue(run_id, res.describe())
        run = self.run_dir(log_dir, run_id)
        self.assertEqual(self.file(run, "attempt_0", "0", "stdout.log"), run_id + "\n")

    def test_redirects_3_keeps_output_off_console_but_in_files(self):
        log_dir = self.path("logs")
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--redirects", "3", "--rdzv_id=redir",
                            "--log_dir", log_dir, prog])
        self.assert_exit(res, 0)
        self.assertEqual(tagged_lines(res.stdout + res.stderr, "OUT") + tagged_lines(res.stdout + res.stderr, "ERR"),
                         [], res.describe())
        run = self.run_dir(log_dir, "redir")
        for r in (0, 1):
            self.assertEqual(self.file(run, "attempt_0", str(r), "stdout.log"), "OUT-r%d-a0\n" % r)
            self.assertEqual(self.file(run, "attempt_0", str(r), "stderr.log"), "ERR-r%d-a0\n" % r)

    def test_redirects_without_log_dir_uses_a_kept_temp_folder(self):
        tmpdir = self.path("tmpdir")
        os.mkdir(tmpdir)
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--redirects=3", prog], env={"TMPDIR": tmpdir})
        self.assert_exit(res, 0)
        self.assertEqual(tagged_lines(res.stdout, "OUT") + tagged_lines(res.stderr, "ERR"), [], res.describe())
        outs = sorted(glob.glob(os.path.join(tmpdir, "*", "attempt_0", "*", "stdout.log")))
        self.assertEqual(len(outs), 2, "redirected output not kept under TMPDIR\n" + res.describe())
        self.assertEqual(sorted(self.file(p) for p in outs), ["OUT-r0-a0\n", "OUT-r1-a0\n"])

    def test_tee_1_shows_stdout_and_keeps_it(self):
        log_dir = self.path("logs")
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--tee", "1", "--rdzv_id=tee",
                            "--log_dir", log_dir, prog])
        self.assert_exit(res, 0)
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")), ["[default0]:OUT-r0-a0", "[default1]:OUT-r1-a0"],
                         res.describe())
        self.assertEqual(sorted(tagged_lines(res.stderr, "ERR")), ["[default0]:ERR-r0-a0", "[default1]:ERR-r1-a0"],
                         res.describe())
        run = self.run_dir(log_dir, "tee")
        for r in (0, 1):
            self.assertEqual(self.file(run, "attempt_0", str(r), "stdout.log"), "OUT-r%d-a0\n" % r)

    def test_tee_1_without_log_dir_keeps_stdout_in_temp_folder(self):
        tmpdir = self.path("tmpdir")
        os.mkdir(tmpdir)
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--tee=1", prog], env={"TMPDIR": tmpdir})
        self.assert_exit(res, 0)
        self.assertEqual(tagged_lines(res.stdout, "OUT"), ["[default0]:OUT-r0-a0"], res.describe())
        outs = glob.glob(os.path.join(tmpdir, "*", "attempt_0", "0", "stdout.log"))
        self.assertEqual(len(outs), 1, res.describe())
        self.assertEqual(self.file(outs[0]), "OUT-r0-a0\n")

    def test_per_rank_redirect_map(self):
        log_dir = self.path("logs")
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "-r", "0:1", "--rdzv_id=map",
                            "--log_dir", log_dir, prog])
        self.assert_exit(res, 0)
        # Rank 0's stdout is off the console; its stderr and all of rank 1 stay.
        self.assertEqual(tagged_lines(res.stdout, "OUT"), ["[default1]:OUT-r1-a0"], res.describe())
        self.assertEqual(sorted(tagged_lines(res.stderr, "ERR")), ["[default0]:ERR-r0-a0", "[default1]:ERR-r1-a0"],
                         res.describe())
        run = self.run_dir(log_dir, "map")
        self.assertEqual(self.file(run, "attempt_0", "0", "stdout.log"), "OUT-r0-a0\n")

    def test_per_rank_tee_map_short_flag(self):
        prog = self.script("tagged.sh", TAGGED)
        log_dir = self.path("logs")
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--redirects=3", "-t", "1:2",
                            "--log-dir", log_dir, "--rdzv_id=teemap", prog])
        self.assert_exit(res, 0)
        # Everything is redirected; rank 1's stderr is teed back to the console.
        self.assertEqual(tagged_lines(res.stdout, "OUT"), [], res.describe())
        self.assertEqual(tagged_lines(res.stderr, "ERR"), ["[default1]:ERR-r1-a0"], res.describe())
        run = self.run_dir(log_dir, "teemap")
        self.assertEqual(self.file(run, "attempt_0", "1", "stderr.log"), "ERR-r1-a0\n")

    def test_local_ranks_filter(self):
        prog = self.script("tagged.sh", TAGGED)
        res = self.run_job(["--standalone", "--nproc_per_node=3", "--local_ranks_filter", "1", prog])
        self.assert_exit(res, 0)
        self.assertEqual(tagged_lines(res.stdout, "OUT"), ["[default1]:OUT-r1-a0"], res.describe())
        self.assertEqual(tagged_lines(res.stderr, "ERR"), ["[default1]:ERR-r1-a0"], res.describe())
        res = self.run_job(["--standalone", "--nproc_per_node=3", "--local-ranks-filter=0,2", prog])
        self.assert_exit(res, 0)
        self.assertEqual(sorted(tagged_lines(res.stdout, "OUT")), ["[default0]:OUT-r0-a0", "[default2]:OUT-r2-a0"],
                         res.describe())

    def test_python_worker_output_is_unbuffered(self):
        # Under $PYTHON_EXEC -u, a print before a crash is not lost in a buffer.
        prog = self.write_file("crash.py", """
            import os
            print("before the crash from", os.environ["LOCAL_RANK"])
            os.kill(os.getpid(), 9)
            """)
        res = self.run_job(["--standalone", prog])
        self.assert_exit(res, 137)
        self.assertIn("[default0]:before the crash from 0", res.stdout, res.describe())


if __name__ == "__main__":
    main()
