"""ddprun's store speaking torch's TCPStore protocol (store/tcpstore/), driven by torch's REAL
TCPStore client: test-bin/tcpstore_server hosts a store core and the adapter on 127.0.0.1, and a
script under PYTHON_EXEC (Debian's torch 1.13, or the torch 2.x tier's) connects with
TCPStore(is_master=False) and runs the CPU cases of PyTorch's test/distributed/test_store.py that
apply to a TCPStore client, re-expressed; then init_process_group("gloo") of 3 ranks against it, as
under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True)."""

import json
import os
import subprocess
import sys
import unittest

from ddprun_testlib import PYTHON_EXEC, REPO, main

TEST_BIN = os.environ.get("DDPRUN_TEST_BIN") or os.path.join(REPO, "build", "test-bin")
SERVER = os.path.join(TEST_BIN, "tcpstore_server")

# Runs every case against the server at argv[1], in order, on one client (plus a second one where
# a case needs a peer); prints one JSON line per case: [name, "ok" | "skip" | "fail", detail].
CASES = r'''
import datetime, json, sys, threading, time, traceback
import torch
import torch.distributed as dist

port = int(sys.argv[1])
def client(timeout_s=5):
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))

class Skip(Exception):
    pass

def need(store, name):
    if not hasattr(store, name):
        raise Skip("torch %s's TCPStore client has no %s()" % (torch.__version__, name))

def eq(a, b):
    if a != b:
        raise AssertionError("%r != %r" % (a, b))

store = client()

def set_get():
    store.set("key0", "value0")
    store.set("key1", b"value1")
    store.set("key2", bytes(range(256)))
    eq(store.get("key0"), b"value0")
    eq(store.get("key1"), b"value1")
    eq(store.get("key2"), bytes(range(256)))
    store.set("key0", "overwritten")
    eq(store.get("key0"), b"overwritten")
    big = bytes(range(256)) * 4096  # 1 MiB
    store.set("big", big)
    eq(store.get("big"), big)

def add():
    eq(store.add("counter", 1), 1)
    eq(store.add("counter", 5), 6)
    eq(store.add("counter", -2), 4)
    eq(store.get("counter"), b"4")  # decimal text, as torch's server keeps it
    store.set("counter_text", "41")
    eq(store.add("counter_text", 1), 42)

def compare_set():
    store.set("cs_key0", "value0")
    eq(store.compare_set("cs_key0", "wrong", "new"), b"value0")  # present, not equal: current value
    eq(store.get("cs_key0"), b"value0")
    eq(store.compare_set("cs_key0", "value0", "value1"), b"value1")  # present, equal: set
    eq(store.get("cs_key0"), b"value1")
    eq(store.compare_set("cs_key1", "", "first"), b"first")  # missing, empty expected: set
    eq(store.get("cs_key1"), b"first")
    eq(store.compare_set("cs_key2", "expected", "x"), b"expected")  # missing, expected: no set
    eq(store.compare_set("cs_key2", "", "z"), b"z")  # still missing: it was not set

def check():
    need(store, "check")
    store.set("ck_a", "1")
    eq(store.check(["ck_a"]), True)
    eq(store.check(["ck_a", "ck_missing"]), False)
    eq(store.check(["ck_missing"]), False)

def wait_ready():
    store.set("w_ready", "1")
    store.wait(["w_ready"])
    store.wait(["w_ready"], datetime.timedelta(seconds=1))

def wait_set_by_peer():
    peer = client()
    t = threading.Timer(0.3, lambda: peer.set("w_later", "x"))
    t.start()
    start = time.monotonic()
    store.wait(["w_later"], datetime.timedelta(seconds=10))
    elapsed = time.monotonic() - start
    t.join()
    if elapsed > 5:
        raise AssertionError("the wait took %.1f s" % elapsed)
    eq(store.get("w_later"), b"x")  # get = WAIT then GET, answered in order

def get_waits_for_peer():
    peer = client()
    t = threading.Timer(0.3, lambda: peer.set("g_later", "y"))
    t.start()
    eq(store.get("g_later"), b"y")
    t.join()

def wait_timeout():
    # torch 1.13's client gives up on its own (no CANCEL_WAIT: its connection is spent after it),
    # so it runs on a connection of its own; 2.x's sends CANCEL_WAIT and goes on.
    s = client() if torch.__version__.startswith("1.") else store
    start = time.monotonic()
    try:
        s.wait(["never_set"], datetime.timedelta(milliseconds=300))
    except Exception as e:  # DistStoreError (2.x) or RuntimeError (1.13): "timeout"
        if "imeout" not in str(e):
            raise
    else:
        raise AssertionError("wait on a key nobody sets returned")
    elapsed = time.monotonic() - start
    if not 0.25 <= elapsed < 5:
        raise AssertionError("timed out after %.2f s, not 0.3" % elapsed)
    if s is store:  # the connection goes on after CANCEL_WAIT/WAIT_CANCELED
        store.set("after_timeout", "ok")
        eq(store.get("after_timeout"), b"ok")

def wait_cancel_race():
    # The key arrives just as the client gives up: STOP_WAITING may come before WAIT_CANCELED.
    if torch.__version__.startswith("1."):
        raise Skip("torch 1.13's client sends no CANCEL_WAIT")
    peer = client()
    for i in range(20):
        key = "race%d" % i
        t = threading.Timer(0.05 + 0.002 * i, lambda k=key: peer.set(k, "1"))
        t.start()
        try:
            store.wait([key], datetime.timedelta(milliseconds=50 + 2 * (i % 5)))
        except Exception as e:
            if "imeout" not in str(e):
                raise
        t.join()
        store.set("race_probe", str(i))
        eq(store.get("race_probe"), str(i).encode())  # the stream stayed in step

def delete_key():
    store.set("del_a", "1")
    eq(store.delete_key("del_a"), True)
    eq(store.delete_key("del_a"), False)
    eq(store.compare_set("del_a", "", "again"), b"again")  # missing again

def num_keys():
    before = store.num_keys()
    store.set("nk_a", "1")
    store.set("nk_b", "2")
    eq(store.num_keys(), before + 2)
    store.delete_key("nk_a")
    eq(store.num_keys(), before + 1)

def append():
    need(store, "append")
    store.append("ap", "po")
    store.append("ap", "tato")
    eq(store.get("ap"), b"potato")

def multi_get_set():
    need(store, "multi_set")
    store.multi_set(["mk0", "mk1"], ["v0", b"v1"])
    eq(store.multi_get(["mk0", "mk1"]), [b"v0", b"v1"])
    eq(store.get("mk1"), b"v1")

def list_keys():
    need(store, "list_keys")
    store.set("lk_a", "1")
    keys = store.list_keys()
    if "lk_a" not in keys or "key0" not in keys:
        raise AssertionError("list_keys: %r" % keys)
    eq(len(keys), store.num_keys())

def queues():
    need(store, "queue_push")
    raise Skip("queues are not served by ddprun's store (docs/store.md, TCPStore): the connection is closed")

def prefix_store():
    p = dist.PrefixStore("pfx", store)
    p.set("k", "v")
    eq(p.get("k"), b"v")
    eq(store.get("pfx/k"), b"v")
    eq(p.add("n", 3), 3)

def many_clients():
    clients = [client() for _ in range(8)]
    for i, c in enumerate(clients):
        c.add("mc_counter", 1)
        c.set("mc_%d" % i, str(i))
    eq(store.get("mc_counter"), b"8")
    for i in range(8):
        eq(clients[(i + 1) % 8].get("mc_%d" % i), str(i).encode())

for name in ["set_get", "add", "compare_set", "check", "wait_ready", "wait_set_by_peer", "get_waits_for_peer",
             "wait_timeout", "wait_cancel_race", "delete_key", "num_keys", "append", "multi_get_set", "list_keys",
             "queues", "prefix_store", "many_clients"]:
    try:
        globals()[name]()
        print(json.dumps([name, "ok", ""]), flush=True)
    except Skip as e:
        print(json.dumps([name, "skip", str(e)]), flush=True)
    except Exception:
        print(json.dumps([name, "fail", traceback.format_exc()]), flush=True)
'''

# One rank of a gloo group whose store is the server's: every rank a TCPStore client, as under
# torchrun's agent store.
RANK = r'''
import datetime, os, sys
import torch
import torch.distributed as dist
rank, world = int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
dist.barrier()
dist.destroy_process_group()
print("RANK_OK", rank, flush=True)
'''


def torch_version():
    r = subprocess.run([PYTHON_EXEC, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                       timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


class TcpStoreServerCase(unittest.TestCase):
    """Starts test-bin/tcpstore_server once for the class."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SERVER):
            raise unittest.SkipTest("%s is not built (target tcpstore_server)" % SERVER)
        cls.version = torch_version()
        if cls.version is None:
            raise unittest.SkipTest("%s cannot import torch" % PYTHON_EXEC)
        cls.server = subprocess.Popen([SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
        line = cls.server.stdout.readline()
        if not line.startswith("PORT "):
            cls.server.kill()
            raise AssertionError("tcpstore_server printed %r, not its port" % line)
        cls.port = int(line.split()[1])

    @classmethod
    def tearDownClass(cls):
        cls.server.stdin.close()  # its exit signal
        try:
            cls.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cls.server.kill()
            cls.server.wait()
            raise AssertionError("tcpstore_server did not exit at the end of its stdin")
        err = cls.server.stderr.read()
        cls.server.stdout.close()
        cls.server.stderr.close()
        if cls.server.returncode != 0:
            raise AssertionError("tcpstore_server exited %d: %s" % (cls.server.returncode, err))


class TestTorchClientOps(TcpStoreServerCase):
    """test_store.py's TCPStore cases with torch's client against ddprun's server."""

    results = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        r = subprocess.run([PYTHON_EXEC, "-c", CASES, str(cls.port)], capture_output=True, text=True, timeout=240)
        cls.results = {}
        for line in r.stdout.splitlines():
            if line.startswith("["):
                name, outcome, detail = json.loads(line)
                cls.results[name] = (outcome, detail)
        cls.driver = r

    def case(self, name):
        if name not in self.results:
            self.fail("the client script did not reach %s (exit %d):\n%s" % (name, self.driver.returncode,
                                                                              self.driver.stderr[-3000:]))
        outcome, detail = self.results[name]
        if outcome == "skip":
            self.skipTest(detail)
        self.assertEqual(outcome, "ok", "torch %s: %s" % (self.version, detail))

    def test_set_get(self):
        self.case("set_get")

    def test_add(self):
        self.case("add")

    def test_compare_set(self):
        self.case("compare_set")

    def test_check(self):
        self.case("check")

    def test_wait_ready(self):
        self.case("wait_ready")

    def test_wait_set_by_peer(self):
        self.case("wait_set_by_peer")

    def test_get_waits_for_peer(self):
        self.case("get_waits_for_peer")

    def test_wait_timeout(self):
        self.case("wait_timeout")

    def test_wait_cancel_race(self):
        self.case("wait_cancel_race")

    def test_delete_key(self):
        self.case("delete_key")

    def test_num_keys(self):
        self.case("num_keys")

    def test_append(self):
        self.case("append")

    def test_multi_get_set(self):
        self.case("multi_get_set")

    def test_list_keys(self):
        self.case("list_keys")

    def test_queues(self):
        self.case("queues")

    def test_prefix_store(self):
        self.case("prefix_store")

    def test_many_clients(self):
        self.case("many_clients")


class TestInitProcessGroup(TcpStoreServerCase):
    """init_process_group("gloo", tcp://) of 3 ranks whose store is ddprun's: all_reduce, barrier."""

    def test_gloo_three_ranks(self):
        world = 3
        env = dict(os.environ, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
        ranks = [subprocess.Popen([PYTHON_EXEC, "-c", RANK, str(self.port), str(r), str(world)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        outputs = []
        for p in ranks:
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for q in ranks:
                    q.kill()
                out, err = p.communicate()
            outputs.append((p.returncode, out, err))
        for r, (rc, out, err) in enumerate(outputs):
            self.assertEqual(rc, 0, "rank %d failed: %s" % (r, err[-3000:]))
            self.assertIn("RANK_OK %d" % r, out)


if __name__ == "__main__":
    main()
