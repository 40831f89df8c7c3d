"""Test hosts made of Linux network namespaces (192.0.2.0/24, a bridge and a veth pair each), for the
tests that need separate network stacks: test_netns, test_slurm_netns, chaos/test_partition.
Every name carries this process's id, so parallel runs never collide; everything is deleted at the
end, also on failure."""

import os
import subprocess
import sys


def ip(*args, check=True):
    res = subprocess.run(["ip"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError("ip %s: exit %d: %s" % (" ".join(args), res.returncode, res.stderr.strip()))
    return res


class TestHosts:
    """Namespaces, a bridge and veth pairs; remove() deletes all of them (idempotent)."""

    def __init__(self, tags):
        pid = os.getpid()
        self.tags = tags
        self.bridge_ns = "ddpt_%d_br" % pid
        self.ns = {t: "ddpt_%d_%s" % (pid, t) for t in tags}
        self.addr = {t: "192.0.2.%d" % (i + 1) for i, t in enumerate(tags)}
        self.host_if = {t: "ddv%d%s" % (pid, t) for t in tags}    # inside the host namespace
        self.bridge_if = {t: "ddb%d%s" % (pid, t) for t in tags}  # its peer, on the bridge
        self.created = []

    def create(self):
        ip("netns", "add", self.bridge_ns)
        self.created.append(self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "set", "lo", "up")
        ip("-n", self.bridge_ns, "link", "add", "ddbr0", "type", "bridge")
        ip("-n", self.bridge_ns, "link", "set", "ddbr0", "up")
        for t in self.tags:
            ns = self.ns[t]
            ip("netns", "add", ns)
            self.created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("link", "add", self.host_if[t], "type", "veth", "peer", "name", self.bridge_if[t])
            ip("link", "set", self.host_if[t], "netns", ns)
            ip("link", "set", self.bridge_if[t], "netns", self.bridge_ns)
            ip("-n", ns, "addr", "add", self.addr[t] + "/24", "dev", self.host_if[t])
            ip("-n", ns, "link", "set", self.host_if[t], "up")
            ip("-n", self.bridge_ns, "link", "set", self.bridge_if[t], "master", "ddbr0")
            ip("-n", self.bridge_ns, "link", "set", self.bridge_if[t], "up")

    def cut(self, tag):
        ip("-n", self.bridge_ns, "link", "set", self.bridge_if[tag], "down")

    def heal(self, tag):
        ip("-n", self.bridge_ns, "link", "set", self.bridge_if[tag], "up")

    def exec_prefix(self, tag):
        return ["ip", "netns", "exec", self.ns[tag]]

    def remove(self):
        problems = []
        for t in self.tags:  # veths still in the root namespace (a failure half-way through create)
            for name in (self.host_if[t], self.bridge_if[t]):
                if ip("link", "show", name, check=False).returncode == 0:
                    ip("link", "del", name, check=False)
        for ns in reversed(self.created):
            res = ip("netns", "del", ns, check=False)
            if res.returncode != 0:
                problems.append("ip netns del %s: %s" % (ns, res.stderr.strip()))
        self.created = []
        left = [ns for ns in [self.bridge_ns] + list(self.ns.values())
                if ns in ip("netns", "list", check=False).stdout.split()]
        if problems or left:
            sys.stderr.write("test_netns cleanup problems: %s; left: %s\n" % (problems, left))
        return left


def make_test_hosts(test, tags):
    """TestHosts for `test`, removed when it ends (the cleanup is registered before any agent's, so
    it runs after every agent was killed); the test fails when they cannot be made."""
    hosts = TestHosts(tags)
    test.addCleanup(hosts.remove)
    try:
        hosts.create()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        test.fail("cannot build the test hosts out of network namespaces (needs root with CAP_SYS_ADMIN and "
                  "CAP_NET_ADMIN, and iproute2): %s" % e)
    return hosts
