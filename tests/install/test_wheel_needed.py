"""The wheel's rule (docs/install.md): manylinux_2_34, and its programs need nothing from the system
but glibc and libgcc_s, with prometheus-cpp's core (the metrics port) compiled in.

auditwheel's policy would pass libstdc++.so.6 and would copy any other library into the wheel, so
scripts/wheel_needed.sh reads every binary's NEEDED itself; this test runs it on the built wheel,
and on a wheel made here around a binary that needs libstdc++ (it must refuse that one, so the check
is known to bite). The wheel: DDPRUN_WHEEL, else the newest build/dist/ddprun-*.whl of the build
folder (DDPRUN_BUILD_DIR); a missing one is a failure: CI builds it before the tests.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest
import zipfile

import test_bare_root as bare
from ddprun_testlib import main

CHECK = os.path.join(bare.SCRIPTS, "wheel_needed.sh")
BINARIES = ("ddprun", "ddprun-multinode", "ddprun-watchdog", "ddprun-rdzv")


def run_check(wheel):
    return subprocess.run(["bash", CHECK, wheel], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)


class WheelNeededTest(unittest.TestCase):

    def wheel(self):
        wheel, missing = bare.find_package("DDPRUN_WHEEL", "ddprun-*.whl")
        if missing:
            self.fail("the wheel under test is missing: " + missing)
        return wheel

    def test_tag_is_manylinux_2_34(self):
        name = os.path.basename(self.wheel())
        self.assertRegex(name, r"^ddprun-%s-py3-none-manylinux_2_34_x86_64\.whl$" % re.escape(bare.VERSION))

    def test_binaries_need_only_glibc_and_libgcc_s(self):
        wheel = self.wheel()
        res = run_check(wheel)
        out = res.stdout + res.stderr
        print(out, flush=True)
        self.assertEqual(res.returncode, 0, out)
        needed = {}
        for line in res.stdout.splitlines():
            m = re.match(r"^(\S+): NEEDED (.*)$", line)
            if m:
                needed[os.path.basename(m.group(1))] = m.group(2)
        for binary in BINARIES:
            self.assertIn(binary, needed, "wheel_needed.sh did not list %s\n%s" % (binary, out))
        # The wheel's own point: no libstdc++, whatever the policy allows.
        for binary, libs in needed.items():
            self.assertNotIn("libstdc++", libs, binary)

    def test_auditwheel_show(self):
        auditwheel = os.path.join(bare.build_dir(), "package-venv", "bin", "auditwheel")
        if not os.access(auditwheel, os.X_OK):
            self.skipTest("no %s (scripts/package.sh wheel makes it)" % auditwheel)
        res = subprocess.run([auditwheel, "show", self.wheel()], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=300)
        out = " ".join((res.stdout + res.stderr).split())
        self.assertEqual(res.returncode, 0, out)
        self.assertIn('is consistent with the following platform tag: "manylinux_2_34_x86_64"', out)

    def test_check_refuses_a_binary_that_needs_libstdcxx(self):
        cmake = shutil.which("cmake")
        self.assertIsNotNone(cmake, "cmake, which runs this test, is not on PATH")
        needs = subprocess.run(["readelf", "-d", cmake], capture_output=True, text=True, timeout=60).stdout
        self.assertIn("[libstdc++.so.6]", needs, "cmake was to be the binary that needs libstdc++")
        with tempfile.TemporaryDirectory(prefix="ddprun_wheel_needed_") as tmp:
            fake = os.path.join(tmp, "ddprun-0.0.0-py3-none-manylinux_2_34_x86_64.whl")
            with zipfile.ZipFile(fake, "w") as z:
                z.write(cmake, "ddprun-0.0.0.data/scripts/ddprun")
            res = run_check(fake)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("ddprun-0.0.0.data/scripts/ddprun needs libstdc++.so.6", res.stdout)


if __name__ == "__main__":
    main()
