"""A console nobody reads must not stall supervision.

ddprun's stdout is a pipe that the test never reads (a stopped pager, a dead consumer): the
workers print far more than a pipe holds. ddprun used to block in write() on that pipe: it
neither noticed the workers' exits nor answered SIGTERM. Now the console is a bounded queue with
a writing thread of its own: lines that do not fit are dropped and counted on the console
("[ddprun: N lines dropped]"), the log files get every line, and the job ends, restarts and stops
as usual.
"""

import os
import re
import signal
import subprocess
import threading
import time
import uuid

import ddprun_testlib as tl
from ddprun_testlib import main

LINES = 200000  # 20 MB of output per worker: far more than a pipe (64 KiB) and the console queue
# Safety bounds (two shared cores): a blocked ddprun never ends; a working one ends in seconds.
END_S = 120

CHATTY = r"""import os, sys, time
line = "x" * 99 + "\n"
out = sys.stdout
for i in range(%(lines)d):
    out.write(line)
out.flush()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ.get("CHATTY_SLEEP"):
    open(os.path.join(%(dir)r, "printed_%%s_%%d" %% (os.environ["RANK"], attempt)), "w").close()
    time.sleep(300)
sys.exit(int(os.environ.get("CHATTY_FAIL_FIRST", "0")) if attempt == 0 else 0)
"""


class BlockedConsoleTest(tl.DdprunTestCase):

    def start_blocked(self, args, env=None):
        """ddprun with stdout on a pipe that nobody reads (until the test drains it at the end)."""
        self.marker = uuid.uuid4().hex
        read_end, write_end = os.pipe()
        self.addCleanup(os.close, read_end)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # as tl.Job
        full_env.update(PYTHON_EXEC=tl.PYTHON_EXEC, TMPDIR=self.tmp)
        full_env.update(env or {})
        full_env[tl.MARKER_NAME] = self.marker
        self.err_path = self.path("stderr.txt")
        with open(self.err_path, "wb") as err:
            proc = subprocess.Popen([tl.DDPRUN] + args, stdin=subprocess.DEVNULL, stdout=write_end, stderr=err,
                                    env=full_env, cwd=self.tmp, start_new_session=True)
        os.close(write_end)
        self.addCleanup(self.kill, proc)
        self.read_end = read_end
        return proc

    def kill(self, proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        tl.kill_marked(self.marker)

    def wait_end(self, proc):
        try:
            return proc.wait(END_S)
        except subprocess.TimeoutExpired:
            self.fail("ddprun did not end within %ds with its console blocked\n%s" % (END_S, self.read("stderr.txt")))

    def chatty(self):
        return self.script("chatty.py", CHATTY % {"lines": LINES, "dir": self.tmp})

    def log_lines(self, log_dir, attempt, rank):
        runs = os.listdir(log_dir)
        self.assertEqual(len(runs), 1, runs)
        with open(os.path.join(log_dir, runs[0], "attempt_%d" % attempt, str(rank), "stdout.log"), "rb") as f:
            return f.read().count(b"\n")

    def test_job_ends_and_log_files_keep_every_line(self):
        log_dir = self.path("logs")
        proc = self.start_blocked(["--nproc_per_node=2", "--log_dir", log_dir, self.chatty()])
        self.assertEqual(self.wait_end(proc), 0, self.read("stderr.txt"))
        for rank in (0, 1):
            self.assertEqual(self.log_lines(log_dir, 0, rank), LINES)
        self.assertEqual(tl.survivors_after(self.marker), [])

    def test_restart_with_a_blocked_console(self):
        proc = self.start_blocked(["--nproc_per_node=1", "--max_restarts=1", self.chatty()],
                                  env={"CHATTY_FAIL_FIRST": "3"})
        self.assertEqual(self.wait_end(proc), 0, self.read("stderr.txt"))
        self.assertEqual(tl.survivors_after(self.marker), [])

    def test_sigterm_with_a_blocked_console_and_the_reader_back(self):
        proc = self.start_blocked(["--nproc_per_node=2", "--shutdown_timeout=5", self.chatty()],
                                  env={"CHATTY_SLEEP": "1"})
        self.wait_for_files(["printed_0_0", "printed_1_0"], timeout=END_S)
        # The reader comes back: what the console queued arrives, then the count of what it dropped.
        chunks = []
        reader = threading.Thread(target=self.read_until_eof, args=(chunks,))
        reader.start()
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.wait_end(proc), 128 + signal.SIGTERM, self.read("stderr.txt"))
        reader.join(END_S)
        console = b"".join(chunks).decode("utf-8", "replace")
        self.assertTrue(re.search(r"\[ddprun: \d+ lines dropped\]\n", console),
                        "no drop marker in %d bytes of console output; its end: %r" % (len(console), console[-300:]))
        self.assertLess(console.count("\n"), 2 * LINES, "nothing was dropped")
        self.assertEqual(tl.survivors_after(self.marker), [])

    def read_until_eof(self, chunks):
        while True:
            data = os.read(self.read_end, 1 << 16)
            if not data:
                return
            chunks.append(data)


if __name__ == "__main__":
    main()
