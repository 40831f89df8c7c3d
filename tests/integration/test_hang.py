"""--hang_timeout: a rank whose SDK heartbeat stops is declared hung, the group is stopped and
restarted within the budget, or ddprun exits 124 naming the rank and its last step. The worker
here speaks the SDK's heartbeat protocol ("RANK STEP" datagrams to DDPRUN_HEARTBEAT_SOCKET)."""

from ddprun_testlib import PYTHON_EXEC, DdprunTestCase, main

PYTHON = PYTHON_EXEC  # the interpreter with torch: Debian's 1.13, or the torch 2.x tier's (tests/torch2)

HEARTBEAT_WORKER = r'''
import os, socket, sys, time
name = os.environ["DDPRUN_HEARTBEAT_SOCKET"]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
addr = "\0" + name[1:]
rank = os.environ["RANK"]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
hang_attempts = int(sys.argv[1])
for step in range(40):
    sock.sendto(("%s %d\n" % (rank, step)).encode(), addr)
    if rank == "1" and attempt < hang_attempts and step == 7:
        time.sleep(600)  # stuck, as in a collective that never completes
    time.sleep(0.02)
open(os.path.join(sys.argv[2], "done_%s_%d" % (rank, attempt)), "w").close()
'''

# Rank 0 beats a few times and finishes; rank 1 goes on beating (within the timeout) for 2 s.
FINISH_EARLY_WORKER = r'''
import os, socket, time
name = os.environ["DDPRUN_HEARTBEAT_SOCKET"]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
addr = "\0" + name[1:]
rank = os.environ["RANK"]
steps = 5 if rank == "0" else 100
for step in range(steps):
    sock.sendto(("%s %d\n" % (rank, step)).encode(), addr)
    time.sleep(0.02)
'''

QUIET_WORKER = r'''
import os, sys, time
time.sleep(1.5)  # never sends a heartbeat: not an SDK program, so never declared hung
open(os.path.join(sys.argv[1], "done_" + os.environ["RANK"]), "w").close()
'''


# The hung rank sleeps 600 s: only hang detection ends the job within the safety timeout.
HUNG = "rank 1 hangs for 600 s unless --hang_timeout=0.5 catches it"


class HangTest(DdprunTestCase):
    def test_hung_rank_fails_with_124_and_names_rank_and_step(self):
        prog = self.write_file("hb.py", HEARTBEAT_WORKER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=0.5", PYTHON, prog, "1", self.tmp],
                           why=HUNG)
        self.assert_exit(res, 124)
        self.assertRegex(res.stderr, r"rank\s*:\s*1\b", res.describe())
        self.assertIn("after step 7", res.stderr, res.describe())

    def test_hung_rank_restarts_within_budget(self):
        prog = self.write_file("hb.py", HEARTBEAT_WORKER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=0.5", "--max_restarts=1",
                            PYTHON, prog, "1", self.tmp], why=HUNG)
        self.assert_exit(res, 0)
        self.assertEqual(self.read("done_1_1"), "")  # rank 1 finished in the second attempt

    def test_a_rank_that_finished_is_not_hung(self):
        # Its beats stop because it exited 0, not because it hangs (it was declared hung before).
        prog = self.write_file("early.py", FINISH_EARLY_WORKER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=0.5", PYTHON, prog])
        self.assert_exit(res, 0)
        self.assertNotIn("hung", res.stderr, res.describe())

    def test_workers_without_heartbeats_are_never_hung(self):
        prog = self.write_file("quiet.py", QUIET_WORKER)
        res = self.run_job(["--standalone", "--nproc_per_node=2", "--hang_timeout=0.3", PYTHON, prog, self.tmp])
        self.assert_exit(res, 0)
        self.assertEqual(self.read("done_0") + self.read("done_1"), "")

    def test_heartbeat_socket_always_given(self):
        # Heartbeats also keep a rank alive past --finish_timeout and tell how far an attempt got,
        # so every worker gets the socket; only --hang_timeout makes silence a hang.
        prog = self.script("env.sh", 'echo "[${DDPRUN_HEARTBEAT_SOCKET}]" > "%s/sock_$RANK"' % self.tmp)
        self.assert_exit(self.run_job(["--standalone", "--nproc_per_node=1", prog]), 0)
        self.assertRegex(self.read("sock_0").strip(), r"^\[@ddprun-hb-\d+-\d+\]$")
        self.assert_exit(self.run_job(["--standalone", "--nproc_per_node=1", "--hang_timeout=5", prog]), 0)
        self.assertRegex(self.read("sock_0").strip(), r"^\[@ddprun-hb-\d+-\d+\]$")

if __name__ == "__main__":
    main()
