"""Proof on a bare system (issue #23): the Python wheel and the .deb, installed into a minimal
Debian 12 root (minbase + python3 + python3-venv: none of ddprun's build dependencies), start
ddprun, ddprun-rdzv, a single-node job of 2 ranks and a 2-node job against a ddprun-rdzv daemon.
Both packages serve the metrics port: ddprun's (scraped while its 2 workers run) and ddprun-rdzv's
(scraped after the 2-node job) must answer, hold the expected series, and pass the host's
`promtool check metrics` without a word.

scripts/bare_root.sh makes the root (mmdebstrap; cached as a tarball, so only the first run
downloads), scripts/bare_root_check.sh copies the packages in and runs every check inside it under
unshare + chroot; this test runs both and reads the second one's verdict lines.

The packages: DDPRUN_WHEEL and DDPRUN_DEB, else the newest build/dist/ddprun-*.whl and
build/dist/ddprun_*.deb of the build folder (DDPRUN_BUILD_DIR, default <repo>/build). A missing one
is a failure, not a skip: CI builds both before the tests. The test is skipped only where it
cannot run at all: not root, or mmdebstrap, unshare or promtool missing.
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from ddprun_testlib import REPO, main

SCRIPTS = os.path.join(REPO, "scripts")
VERSION = re.search(r"project\(ddprun VERSION ([0-9.]+)", open(os.path.join(REPO, "CMakeLists.txt")).read()).group(1)
MAKE_TIMEOUT_S = 900    # cold: downloads ~100 MB and installs ~130 packages (minutes); warm: seconds
CHECK_TIMEOUT_S = 1500  # pip, apt-get install (fetches the .deb's Depends), six ddprun jobs
# The lines bare_root_check.sh prints when a check passed, in order.
EXPECTED = [
    "bare_root_check: wheel: single-node 2 ranks ok",
    "bare_root_check: wheel: ddprun's metrics port scraped",
    "bare_root_check: wheel: 2-node job ok",
    "bare_root_check: wheel: ddprun-rdzv's metrics port scraped",
    "bare_root_check: wheel: ok",
    "bare_root_check: deb: single-node 2 ranks ok",
    "bare_root_check: deb: ddprun's metrics port scraped",
    "bare_root_check: deb: 2-node job ok",
    "bare_root_check: deb: ddprun-rdzv's metrics port scraped",
    "bare_root_check: deb: ok",
    "bare_root_check: the checks inside the root passed",
    "bare_root_check: wheel: promtool check metrics ddprun: ok",
    "bare_root_check: wheel: promtool check metrics ddprun-rdzv: ok",
    "bare_root_check: deb: promtool check metrics ddprun: ok",
    "bare_root_check: deb: promtool check metrics ddprun-rdzv: ok",
    "bare_root_check: all checks passed",
]


def build_dir():
    return os.environ.get("DDPRUN_BUILD_DIR") or os.path.join(REPO, "build")


def find_package(env_name, pattern):
    """(path, None) or (None, what is missing)."""
    given = os.environ.get(env_name)
    if given:
        if os.path.isfile(given):
            return given, None
        return None, "%s=%s does not exist" % (env_name, given)
    found = glob.glob(os.path.join(build_dir(), "dist", pattern))
    if not found:
        return None, "no %s in %s (set %s, or build the package)" % (
            pattern, os.path.join(build_dir(), "dist"), env_name)
    return max(found, key=os.path.getmtime), None  # the newest, if several versions lie there


def mounts_under(path):
    path = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point == path or point.startswith(path + "/"):
                found.append(point)
    return found


class BareRootTest(unittest.TestCase):

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root (mmdebstrap's root mode, unshare, chroot)")
        for tool, package in (("mmdebstrap", "mmdebstrap"), ("unshare", "util-linux"), ("promtool", "prometheus")):
            if shutil.which(tool) is None:
                self.skipTest("%s is not installed (Debian package %s; scripts/install_deps.sh installs it)"
                              % (tool, package))
        self.tmp = tempfile.mkdtemp(prefix="ddprun_bare_root_", dir="/tmp")
        self.addCleanup(self.remove_tmp)

    def remove_tmp(self):
        # bare_root_check.sh mounts only inside a mount namespace of its own, so nothing should be
        # mounted here; if something is, never delete through it.
        left = mounts_under(self.tmp)
        for point in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30, check=False)
        still = mounts_under(self.tmp)
        if still:
            raise AssertionError("mounts left under %s, not removed: %s" % (self.tmp, still))
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(left, [], "bare_root_check.sh left mounts behind (unmounted now)")

    def run_script(self, name, args, timeout, env=None):
        """Runs scripts/NAME with its output in a file (never a pipe that a leftover process could
        hold open); returns (exit status, output). Killed, with its process group, on timeout."""
        out_path = os.path.join(self.tmp, name + ".out")
        full_env = dict(os.environ)
        full_env.update(env or {})
        start = time.monotonic()
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(["bash", os.path.join(SCRIPTS, name)] + list(args), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(timeout=30)
                rc = "timeout after %ds" % timeout
        with open(out_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        print("%s: exit %s after %.0fs" % (name, rc, time.monotonic() - start), flush=True)
        return rc, text

    def test_wheel_and_deb_on_a_bare_root(self):
        wheel, wheel_missing = find_package("DDPRUN_WHEEL", "ddprun-*.whl")
        deb, deb_missing = find_package("DDPRUN_DEB", "ddprun_*.deb")
        missing = [m for m in (wheel_missing, deb_missing) if m]
        if missing:
            self.fail("the packages under test are missing: " + "; ".join(missing))
        print("wheel: %s\ndeb: %s" % (wheel, deb), flush=True)

        root = os.path.join(self.tmp, "root")
        rc, out = self.run_script("bare_root.sh", [root], MAKE_TIMEOUT_S)
        self.assertEqual(rc, 0, "bare_root.sh failed (exit %s)\n--- output (tail) ---\n%s" % (rc, out[-6000:]))

        # The inner limit ends the run inside the root (cleanly, with a message) before ours does.
        rc, out = self.run_script("bare_root_check.sh", [root, wheel, deb], CHECK_TIMEOUT_S,
                                  env={"DDPRUN_BARE_CHECK_TIMEOUT": str(CHECK_TIMEOUT_S - 60)})
        tail = "\n--- bare_root_check.sh output (tail) ---\n%s" % out[-12000:]
        self.assertEqual(rc, 0, "bare_root_check.sh failed (exit %s)%s" % (rc, tail))
        lines = [line.strip() for line in out.splitlines()]
        for expected in EXPECTED:
            self.assertIn(expected, lines, "missing line %r%s" % (expected, tail))
        positions = [lines.index(e) for e in EXPECTED]
        self.assertEqual(positions, sorted(positions), "the checks did not run in order%s" % tail)
        # One version everywhere: the packages' names, and what the installed commands say (the
        # wheel's, then the .deb's).
        self.assertIn("ddprun-%s-py3-none-manylinux_" % VERSION, os.path.basename(wheel))
        self.assertTrue(os.path.basename(deb).startswith("ddprun_%s_" % VERSION), deb)
        for binary in ("ddprun", "ddprun-rdzv"):
            self.assertEqual(lines.count("%s %s" % (binary, VERSION)), 2, "%s --version, twice%s" % (binary, tail))


if __name__ == "__main__":
    main()
