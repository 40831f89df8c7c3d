"""Ports for test servers: free on every address and below the kernel's ephemeral range.

A port the kernel hands out for bind(port 0) comes from the ephemeral range, which every outgoing
connection draws from too: between the choice and the server's own bind, a test running beside
this one (gRPC channels, etcd clients, thousands of HTTP/2 connections) can take it, and the server
fails with "Address already in use" (seen under ctest -j2). Below that range only listeners live,
and a random pick among ~20,000 ports rarely meets another test's.

Rarely is not never: two tests under ctest -j2 once picked the same port, and the second's server
lost the bind to the first's. So each pick is also reserved: an flock on a file named after the
port (in /tmp/ddprun-test-ports), held by this process until it exits (the kernel drops it then,
so no reservation outlives its test, whatever ends it), and skipped by every other test's pick
while held.

And ddprun itself picks ports below that range too (a job's MASTER_PORT, common/net.h
findFreePort), without knowing of these reservations: an agent of a test running beside this one
could bind a port this test reserved before this test's server does (a suspected CI failure, a
hosting agent's endpoint taken). So where the kernel leaves room above its ephemeral range (61000
to 65535 by default), test ports come from there, where neither outgoing connections nor ddprun's
own picks land; else from below it, as before.
"""

import fcntl
import os
import random
import socket
import tempfile

# One folder for every test of the machine, whatever TMPDIR each was given.
_LOCK_DIR = os.path.join("/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir(), "ddprun-test-ports")
_held = []  # open lock files: the reservations last as long as this process


def _reserve(port):
    """False when another live process holds `port`'s reservation; else True (this process holds
    it now, or no reservation can be made here: then the pick is as good as before)."""
    try:
        os.makedirs(_LOCK_DIR, mode=0o777, exist_ok=True)
        fd = os.open(os.path.join(_LOCK_DIR, "%d" % port), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return True  # another user's folder, a read-only /tmp: best effort
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held.append(fd)
    return True


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def pick_range():
    """[low, high) that test ports are drawn from (the module's docstring says why)."""
    low, high = _ephemeral_range()
    if 65536 - (high + 1) >= 2000:
        return high + 1, 65536
    return 10000, max(10001, low)


def free_ports(count, host="0.0.0.0"):
    """`count` distinct ports, each free on `host` (default: every address) right now."""
    low, high = pick_range()
    ports = []
    for _ in range(200 * count):
        if len(ports) == count:
            return ports
        port = random.randrange(low, high)
        if port in ports or not _reserve(port):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
    raise RuntimeError("no %d free ports in [%d, %d)" % (count, low, high))


def free_port(host="0.0.0.0"):
    return free_ports(1, host)[0]
