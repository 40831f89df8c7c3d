#!/usr/bin/env python3
"""Writes the hand-made seeds of tests/fuzz/corpus/*/seed-* (the fuzzers add their own finds beside).

The binary seeds follow the decoders of fuzz_store_ops.cc and fuzz_rendezvous_state.cc byte for
byte (FuzzInput in fuzz_input.h: little-endian integers, one length byte for strings up to 255,
two above). Run from anywhere: python3 tests/fuzz/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


class Enc:
    def __init__(self):
        self.b = bytearray()

    def byte(self, v):
        self.b.append(v & 0xFF)
        return self

    def u16(self, v):
        self.b += struct.pack("<H", v & 0xFFFF)
        return self

    def u32(self, v):
        self.b += struct.pack("<I", v & 0xFFFFFFFF)
        return self

    def u64(self, v):
        self.b += struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)
        return self

    def bytes(self, data, max_len):
        data = data.encode() if isinstance(data, str) else data
        (self.byte if max_len <= 255 else self.u16)(len(data))
        self.b += data
        return self


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(bytes(data))


# ---- store_ops -------------------------------------------------------------------------------
RUNS = ["job", "job", "j2", "x"]
KEYS = ["a", "b", "c", "n"]


class Store(Enc):
    def header(self, waiters=4, bytes_per_run=8000, bytes_total=12000, keys_per_run=7, keys_total=11, pending=4,
               round_check=False):
        return (self.byte(waiters - 1).u16(bytes_per_run).u16(bytes_total).byte(keys_per_run).byte(keys_total)
                .byte(pending - 1).byte(1 if round_check else 0))

    def run(self, run):
        if run in RUNS:
            return self.byte(RUNS.index(run)).byte(RUNS.index(run))
        return self.byte(4).bytes(run, 300)

    def round(self, r):
        if r < 4:
            return self.byte(r)
        return self.byte(4).u64(r)

    def key(self, key):
        if key in KEYS:
            return self.byte(KEYS.index(key)).byte(KEYS.index(key))
        if key == "":
            return self.byte(7)
        if len(key) <= 64:
            return self.byte(4).bytes(key, 64)
        # case 5: a piece repeated up to 4096 bytes
        return self.byte(5).bytes(key, 255)

    def value(self, v):
        if v == "":
            return self.byte(4)
        if v == "1":
            return self.byte(2)
        if isinstance(v, int):
            return self.byte(3).u16(v)  # that many 'v'
        return self.byte(0).bytes(v, 64)

    def request(self, op, rid=1):
        return self.byte(0).u16(rid).byte(op)

    def scope(self, run="job", r=1):
        return self.run(run).round(r)

    def set(self, key, value, run="job", r=1):
        return self.request(0).scope(run, r).key(key).value(value)

    def get(self, key, timeout_ms=0, run="job", r=1):
        self.request(1).scope(run, r).key(key)
        return self.byte(1) if timeout_ms == 0 else self.byte(0).u16(timeout_ms)

    def add(self, key, delta, run="job", r=1):
        return self.request(2).scope(run, r).key(key).byte(1).byte(delta + 128)

    def compare_set(self, key, expected, desired, run="job", r=1):
        self.request(3).scope(run, r).key(key)
        if expected == "":
            self.byte(1)
        else:
            self.byte(0).value(expected)
        return self.value(desired)

    def wait(self, keys, timeout_ms=0, run="job", r=1):
        self.request(4).scope(run, r).byte(len(keys))
        for k in keys:
            self.key(k)
        return self.byte(1) if timeout_ms == 0 else self.byte(0).u16(timeout_ms)

    def check(self, keys, run="job", r=1):
        self.request(5).scope(run, r).byte(len(keys))
        for k in keys:
            self.key(k)
        return self

    def delete(self, key, run="job", r=1):
        return self.request(6).scope(run, r).key(key)

    def num_keys(self, run="job", r=1):
        return self.request(7).scope(run, r)

    def raw(self, proto):
        return self.byte(9).bytes(proto, 4096)

    def advance(self, ms):
        steps = [0, 1, 10, 100, 1000, 60000]
        return self.byte(10).byte(steps.index(ms)) if ms in steps else self.byte(11).u16(ms)

    def new_round(self, run, r):
        return self.byte(12).run(run).round(r)

    def drop_run(self, run):
        return self.byte(13).run(run)

    def cancel(self, index):
        return self.byte(14).byte(index)

    def close(self):
        return self.byte(15).byte(0)


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num, payload):
    if isinstance(payload, int):
        return varint(num << 3) + varint(payload)
    payload = payload.encode() if isinstance(payload, str) else payload
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def store_seeds():
    s = Store().header()
    s.set("a", "hello").get("a").add("n", 5).add("n", -7).compare_set("a", "hello", "world")
    s.compare_set("b", "", "new").compare_set("c", "x", "y").check(["a", "n"]).check(["a", "c"])
    s.delete("a").delete("a").num_keys().get("a").add("b", 1)
    write("store_ops", "every-op", s.b)

    s = Store().header()
    s.wait(["a", "b"], 1000).get("c", 100).set("a", "1").set("b", "2").advance(100).advance(1000)
    s.wait(["a"], 5).wait([], 0).get("zz", 0).wait(["c"], 60000).cancel(0).cancel(0)
    write("store_ops", "waits", s.b)

    s = Store().header(round_check=True)
    s.new_round("job", 1).set("a", "1", r=1).set("a", "1", r=2).wait(["b"], 1000, r=1).get("c", 1000, r=1)
    s.new_round("job", 2).set("b", "x", r=1).get("a", 0, r=2).wait(["c"], 1000, r=2).drop_run("job")
    s.num_keys(r=2).new_round("j2", 3).set("k", "v", run="j2", r=3).advance(60000)
    write("store_ops", "rounds", s.b)

    s = Store().header(waiters=1, bytes_per_run=40, bytes_total=60, keys_per_run=2, keys_total=3, pending=2)
    s.set("a", 30).set("a", 50).set("b", 5).set("c", "x").set("a", "").set("c", "x")
    s.set("a", "v", run="j2").set("b", 45, run="j2").delete("a").set("c", "y").add("n", 1, run="x")
    s.wait(["z"], 100).wait(["y"], 100).wait(["w"], 100, run="j2").wait(["v"], 100, run="x")
    s.drop_run("job").set("a", 30).advance(100)
    write("store_ops", "caps", s.b)

    s = Store().header()
    s.wait(["a"], 1000).get("b", 60000).wait(["a", "c"], 100).close()
    s.set("a", "1").get("a").wait(["a"], 10).num_keys().delete("a").set("", "x")
    write("store_ops", "close", s.b)

    s = Store().header()
    s.set("", "x").set("K" * 200, "x").get("").check(["a", ""]).run("bad id\n")  # stray bytes are fine
    s.set("a", "x", run="bad id with spaces").set("a", "x", run="r" * 257).num_keys(run="")
    write("store_ops", "bad-input", s.b)

    long_keys = ["\x1b[31m\n" + chr(0x80 + i) * 60 for i in range(10)]
    s = Store().header()
    s.wait(long_keys, 0).wait(long_keys, 10).advance(10).check(long_keys)
    write("store_ops", "long-keys", s.b)

    s = Store().header()
    s.set("\x1b]0;owned\x07\n", "not a number").add("\x1b]0;owned\x07\n", 1).set("n", "9223372036854775807")
    s.add("n", 1).compare_set("n", "9223372036854775807", "-9223372036854775808").add("n", -1)
    write("store_ops", "add-errors", s.b)

    scope = field(1, "job") + field(2, 1)
    s = Store().header()
    s.raw(field(1, 7) + field(2, field(1, scope) + field(2, "a") + field(3, "x")))  # set
    s.raw(field(1, 8) + field(3, field(1, scope) + field(2, "a") + field(3, 10)))  # get
    s.raw(field(1, 9) + field(6, field(1, scope) + field(2, "a") + field(2, "b") + field(3, 50)))  # wait
    s.raw(field(1, 10))  # no op
    s.raw(field(1, 11) + field(99, "unknown field"))
    s.raw(field(1, 12) + field(9, field(1, scope)))  # num_keys
    s.advance(100)
    write("store_ops", "raw-protos", s.b)


# ---- rendezvous_state -------------------------------------------------------------------------
IDS = ["a", "b", "c", "d", "e", "f"]
TIMEOUTS = [0, 1, 5, 50, 1000, 30000, 600000]
LWS = [1, 2, 8, 0, 1024, 1025]
PORTS = [29500, 29501, 0, 65535, 65536, -1]


class Rdzv(Enc):
    # Time steps: 0 none, 1 one us, 2 hb/2, 3 hb, 4 hb+1us, 5 last call, 6 join timeout, 7 raw
    def rules(self, mn, mx, restarts, join_ms, last_call_ms, hb_ms, start=1000):
        self.byte(0).byte(mn - 1).byte(0).byte(mx - mn).byte(restarts + 1)
        for ms in (join_ms, last_call_ms, hb_ms):
            self.byte(TIMEOUTS.index(ms)) if ms in TIMEOUTS else self.byte(7).u32(ms)
        return self.u32(start)

    def step(self, kind, node="a", dt=0, raw_us=0):
        return self.u32(raw_us).byte(dt).byte(IDS.index(node) if node else 6).byte(kind)

    def round_pick(self, which):  # "cur", "prev", "next"
        return self.byte({"prev": 0, "next": 1, "cur": 3}[which])

    def join(self, node, lws=1, port=29500, rank=-1, last_round=None, dt=0):
        self.step(0, node, dt).byte(LWS.index(lws)).byte(PORTS.index(port))
        self.byte(1 if rank < 0 else 3 * (rank + 1))
        if last_round is None:
            return self.byte(3).byte(1)
        return self.round_pick(last_round).byte(0)

    def heartbeat(self, node, dt=0):
        return self.step(2, node, dt)

    def beat_all(self, dt=0):
        return self.step(3, "a", dt)

    def failed(self, node, which="cur", dt=0):
        return self.step(4, node, dt).byte(3).byte(1).round_pick(which)

    def succeeded(self, node, which="cur", dt=0):
        return self.step(5, node, dt).round_pick(which)

    def leave(self, node, dt=0):
        return self.step(7, node, dt)

    def tick(self, dt=0, raw_us=0):
        return self.step(8, "a", dt, raw_us)


def rendezvous_seeds():
    r = Rdzv().rules(2, 2, 0, 600000, 30000, 5000)
    r.join("a").join("b", lws=2).beat_all(2).succeeded("a").succeeded("b").join("c").tick(4)
    write("rendezvous_state", "two-nodes-succeed", r.b)

    r = Rdzv().rules(1, 3, 2, 600000, 1000, 5000)
    r.join("a").tick(5).join("b", port=29501).failed("a").beat_all(2).failed("b").failed("a", "prev")
    r.failed("a").succeeded("a").join("a").tick(6)
    write("rendezvous_state", "elastic-budget", r.b)

    r = Rdzv().rules(2, 4, 1, 1000, 50, 50)
    r.join("a").join("b").tick(5).join("c").join("d").join("e").beat_all(2).tick(4)
    r.join("a", last_round="cur").join("b", last_round="next").beat_all(0).tick(4).tick(6)
    write("rendezvous_state", "heartbeat-timeouts", r.b)

    r = Rdzv().rules(3, 3, 1, 600000, 0, 5000)
    r.join("a", rank=2).join("b", rank=0).join("c", rank=2).join("c", rank=1).leave("a").join("d", rank=2)
    r.failed("b").succeeded("b").succeeded("c").succeeded("d")
    write("rendezvous_state", "static-ranks", r.b)

    r = Rdzv().rules(1, 2, 0, 1000, 0, 1000)
    r.join("", lws=1).join("a", lws=0).join("a", lws=1025).join("a", port=65536).join("a", rank=5)
    r.heartbeat("f").succeeded("f").failed("a").join("a").join("a").succeeded("a", "next").leave("a").leave("a")
    r.tick(6).tick(6).join("b").failed("b")
    write("rendezvous_state", "malformed-and-stale", r.b)

    r = Rdzv().rules(1, 2, 3, 50, 0, 5)
    r.join("a").join("b").join("c").leave("a").leave("b").tick(6).beat_all(0).tick(4).tick(6).join("d")
    write("rendezvous_state", "standby-and-below-min", r.b)


# ---- endpoint and cli ---------------------------------------------------------------------------
def text_seeds():
    endpoints = {
        "host": "localhost", "host-port": "node-1.example.com:29400", "ipv4-port": "127.0.0.1:29400",
        "ipv6-bracket": "[::1]:29400", "ipv6-bare": "fe80::1", "ipv6-no-port": "[2001:db8::1]",
        "two-colons": "a:b:c", "open-bracket": "[::1", "after-bracket": "[::1]x", "empty-port": "host:",
        "empty-host": ":80", "port-high": "host:65536", "port-neg": "host:-1", "port-junk": "host:80x",
        "ctrl": "bad host\n\x1b[31m", "id-chars": "job-1.2_x:y@z+w=v", "label-dash": "-a.b-", "dots": "a..b",
        "empty": "", "long-label": "a" * 64 + ".com", "backslash": "a\\x41\x7f\xff",
        "nul-after-ipv6": "::1\x00\x1b[2J",
    }
    for name, text in endpoints.items():
        write("endpoint", name, text.encode("latin-1"))

    clis = {
        "nproc": ["--nproc_per_node", "2", "/bin/true"],
        "standalone": ["--standalone", "--nproc-per-node=4", "/bin/echo", "hi", "--not-ours"],
        "elastic": ["--nnodes=1:4", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400",
                    "--rdzv_conf=join_timeout=60,last_call_timeout=1,heartbeat_timeout=2,is_host=1,timeout=9",
                    "--rdzv_id=job-7", "/bin/true"],
        "static": ["--nnodes=2", "--node_rank=1", "--master_addr=localhost", "--master_port=29500", "/bin/true"],
        "help": ["--help"], "version": ["--version"],
        "logs": ["-r", "0:3,1:2", "-t", "3", "--local_ranks_filter=0,1", "--log_line_prefix_template={rank}:{host}",
                 "--log_dir", "/tmp/x", "/bin/true"],
        "supervision": ["--signals_to_handle=SIGUSR1,TERM", "--max_restarts=3", "--monitor_interval=0.5",
                        "--shutdown_timeout=1.5", "--hang_timeout=30", "--start_method=fork", "/bin/true"],
        "module": ["-m", "http.server", "8000"],
        "grpc-v6": ["--rdzv_backend=grpc", "--rdzv_endpoint=[::1]:1", "/bin/true"],
        "grpc-name": ["--rdzv_backend=grpc", "--rdzv_endpoint=no-such-host.invalid", "/bin/true"],
        "bad-conf": ["--rdzv_conf=bogus", "/bin/true"],
        "no-python": ["--no_python", "x.py"],
        "dry-run": ["--dry_run", "--log_level=debug", "--role=trainer", "--virtual_local_rank", "/bin/true"],
        "bad-nnodes": ["--nnodes=4:2", "/bin/true"],
        "bad-nproc": ["--nproc_per_node=0", "/bin/true"],
        "missing-program": ["/nonexistent/program"],
        "dashdash": ["--", "-weird"],
        "auto-nproc": ["--nproc_per_node=auto", "--run_id=abc", "/bin/true"],
        "token-file": ["--rdzv_backend=grpc", "--rdzv_endpoint=localhost", "--rdzv_conf=token_file=/etc/hostname",
                       "/bin/true"],
        "huge-timeouts": ["--rdzv_conf=join_timeout=1e300", "--shutdown_timeout=1e300", "/bin/true"],
    }
    for name, args in clis.items():
        write("cli", name, "\0".join(args).encode())


def wire_frame(message):
    return struct.pack(">I", len(message)) + message


def store_wire_seeds():
    """Byte streams of one connection in the store's own framing (store/store_wire.h), as
    fuzz_store_wire.cc feeds them to a StoreWireServer whose job token is "t"."""
    magic = b"DDPSTORE"
    hello = wire_frame(field(1, "t") + field(2, "seed"))
    scope = field(1, "job") + field(2, 1)

    def req(rid, op, body):
        return wire_frame(field(1, rid) + field(op, body))

    setr = lambda rid, k, v: req(rid, 2, field(1, scope) + field(2, k) + field(3, v))
    getr = lambda rid, k, ms=0: req(rid, 3, field(1, scope) + field(2, k) + (field(3, ms) if ms else b""))
    addr = lambda rid, k, d: req(rid, 4, field(1, scope) + field(2, k) + field(3, d))
    casr = lambda rid, k, e, d: req(rid, 5, field(1, scope) + field(2, k) + field(3, e) + field(4, d))
    waitr = lambda rid, keys, ms: req(rid, 6, field(1, scope) + b"".join(field(2, k) for k in keys) + field(3, ms))
    checkr = lambda rid, keys: req(rid, 7, field(1, scope) + b"".join(field(2, k) for k in keys))
    delr = lambda rid, k: req(rid, 8, field(1, scope) + field(2, k))
    numr = lambda rid: req(rid, 9, field(1, scope))
    ping = lambda rid: req(rid, 10, b"")
    write("store_wire", "every-op", magic + hello + setr(1, "k", "v") + getr(2, "k") + addr(3, "n", 5) +
          casr(4, "c", "", "x") + waitr(5, ["k", "n"], 10) + checkr(6, ["k", "absent"]) + delr(7, "k") +
          numr(8) + ping(9))
    write("store_wire", "waits", magic + hello + getr(1, "later", 50) + waitr(2, ["a", "b"], 30) + setr(3, "later", "v"))
    write("store_wire", "wrong-token", magic + wire_frame(field(1, "not-t")) + setr(1, "k", "v"))
    write("store_wire", "no-hello", magic)
    write("store_wire", "huge-length", magic + b"\xff\xff\xff\xff")
    write("store_wire", "garbage-hello", magic + wire_frame(b"\xff\xff\xff"))
    write("store_wire", "garbage-request", magic + hello + wire_frame(b"\x0a\xff\xff"))
    write("store_wire", "no-op", magic + hello + wire_frame(field(1, 7)))
    write("store_wire", "cut-frame", magic + hello + setr(1, "k", "v")[:-2])
    write("store_wire", "other-round", magic + hello +
          req(1, 2, field(1, field(1, "job") + field(2, 9)) + field(2, "k") + field(3, "v")))


def tcpstore_seeds():
    """Byte streams of one TCPStore connection (store/tcpstore/tcpstore_codec.h), as
    fuzz_tcpstore.cc feeds them to a TcpStoreServer: torch 2.x's (VALIDATE and its magic first)
    and torch 1.13's numbering."""
    u64 = lambda v: struct.pack("<Q", v)
    u32 = lambda v: struct.pack("<I", v)
    s = lambda t: u64(len(t.encode() if isinstance(t, str) else t)) + (t.encode() if isinstance(t, str) else t)
    ks = lambda keys: u64(len(keys)) + b"".join(s(k) for k in keys)
    validate = b"\x00" + u32(0x3C85F7CE)
    ping = b"\x0d" + u32(7)
    v2 = validate + ping
    write("tcpstore", "v2-every-op", v2 + b"\x01" + s("/k") + s("v") + b"\x03" + s("/k") + b"\x04" + s("/n") +
          u64(5) + b"\x02" + s("/c") + s("") + s("x") + b"\x05" + ks(["/k", "/n"]) + b"\x06" + ks(["/k"]) +
          b"\x07" + b"\x09" + s("/ap") + s("y") + b"\x0a" + ks(["/k", "/none"]) + b"\x0b" + u64(2) + s("/m0") +
          s("a") + s("/m1") + s("b") + b"\x11" + b"\x08" + s("/k"))
    write("tcpstore", "v2-wait-cancel", v2 + b"\x06" + ks(["/later"]) + b"\x0c" + b"\x06" + ks(["/x"]) +
          b"\x01" + s("/x") + s("1") + b"\x0c")
    write("tcpstore", "legacy-every-op", b"\x00" + s("/k") + s("v") + b"\x05" + ks(["/k"]) + b"\x02" + s("/k") +
          b"\x03" + s("/n") + u64(1) + b"\x01" + s("/k") + s("v") + s("w") + b"\x04" + ks(["/k"]) + b"\x06" +
          b"\x08" + s("/k"))
    write("tcpstore", "legacy-watch-key", b"\x07" + s("/k"))
    write("tcpstore", "bad-magic", b"\x00\xff\xff\xff\xff\x01\x00\x00\x00")
    write("tcpstore", "unknown-op", v2 + b"\x13")
    write("tcpstore", "queue-op", v2 + b"\x0e" + s("/q") + s("v"))
    write("tcpstore", "huge-key", v2 + b"\x01" + u64(1 << 40))
    write("tcpstore", "cut-command", v2 + b"\x01" + s("/k") + u64(10) + b"abc")
    write("tcpstore", "add-to-text", v2 + b"\x01" + s("/t") + s("text") + b"\x04" + s("/t") + u64(1))


if __name__ == "__main__":
    store_seeds()
    store_wire_seeds()
    tcpstore_seeds()
    rendezvous_seeds()
    text_seeds()
