"""Ports for test servers: free on every address and below the kernel's ephemeral range.

A port the kernel hands out for bind(port 0) comes from the ephemeral range, which every outgoing
connection draws from too: between the choice and the server's own bind, a test running beside
this one (gRPC channels, etcd clients, thousands of HTTP/2 connections) can take it, and the server
fails with "Address already in use" (seen under ctest -j2). Below that range only listeners live,
and a random pick among ~20,000 ports rarely meets another test's.
"""

import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count, host="0.0.0.0"):
    """`count` distinct ports, each free on `host` (default: every address) right now."""
    low = _ephemeral_low()
    ports = []
    for _ in range(200 * count):
        if len(ports) == count:
            return ports
        port = random.randrange(10000, max(10001, low))
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
    raise RuntimeError("no %d free ports below %d" % (count, low))


def free_port(host="0.0.0.0"):
    return free_ports(1, host)[0]
