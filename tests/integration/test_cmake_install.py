"""`cmake --install` and the CMake package (issue #23): install this build to a temp prefix, build
examples/consumer (a trainer on the worker SDK) against it with find_package(ddprun), once with
libddp.so and once with libddp.a, and once with pkg-config; run each under the installed ddprun
with two ranks (gloo): both ranks end with the same weights, the ones the model converges to."""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from ddprun_testlib import BIN_DIR, REPO, main

BUILD = os.path.dirname(BIN_DIR)
DIGEST_RE = re.compile(r"rank (\d) of 2: digest (\S+) (\S+)")


def run(cmd, timeout=600, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


class CmakeInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ddprun-install-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        cls.install = run(["cmake", "--install", BUILD, "--prefix", cls.prefix])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)

    def test_the_prefix_holds_the_commands_the_library_and_the_package(self):
        for path in ("bin/ddprun", "bin/ddprun-multinode", "bin/ddprun-watchdog", "bin/ddprun-rdzv",
                     "lib/libddp.a", "lib/cmake/ddprun/ddprunConfig.cmake", "lib/cmake/ddprun/ddprunConfigVersion.cmake",
                     "lib/pkgconfig/ddprun.pc", "include/ddprun/worker_sdk/ddp.h", "include/ddprun/common/error.h",
                     "lib/python3/dist-packages/ddprun/__init__.py",
                     "lib/python3/dist-packages/ddprun/py.typed"):  # type checkers use its annotations
            self.assertTrue(os.path.exists(os.path.join(self.prefix, path)), path)
        self.assertTrue(glob.glob(os.path.join(self.prefix, "lib/libddp.so*")))
        out = run([os.path.join(self.prefix, "bin/ddprun"), "--version"]).stdout
        self.assertTrue(out.startswith("ddprun "), out)

    def consumer_run(self, build_dir):
        exe = os.path.join(build_dir, "consumer")
        r = run([os.path.join(self.prefix, "bin/ddprun"), "--nproc_per_node=2", exe], timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        digests = {m.group(1): (m.group(2), m.group(3)) for m in DIGEST_RE.finditer(r.stdout)}
        self.assertEqual(set(digests), {"0", "1"}, r.stdout)
        self.assertEqual(digests["0"], digests["1"], r.stdout)
        w = re.search(r"weights (\S+) (\S+)", r.stdout)
        self.assertAlmostEqual(float(w.group(1)), 3.0, delta=0.1, msg=r.stdout)
        self.assertAlmostEqual(float(w.group(2)), 1.0, delta=0.1, msg=r.stdout)
        self.assertIn("libddp ", r.stdout)
        return r.stdout

    def cmake_consumer(self, name, *defines):
        build_dir = os.path.join(self.tmp, name)
        r = run(["cmake", "-S", os.path.join(REPO, "examples/consumer"), "-B", build_dir, "-G", "Ninja",
                 "-DCMAKE_PREFIX_PATH=" + self.prefix] + list(defines))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = run(["cmake", "--build", build_dir])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return build_dir

    def test_find_package_and_the_shared_library(self):
        build_dir = self.cmake_consumer("shared")
        ldd = run(["ldd", os.path.join(build_dir, "consumer")]).stdout
        self.assertIn(os.path.join(self.prefix, "lib"), ldd)  # the installed libddp.so, by its rpath
        self.consumer_run(build_dir)

    def test_find_package_and_the_static_library(self):
        build_dir = self.cmake_consumer("static", "-DDDPRUN_STATIC=ON")
        ldd = run(["ldd", os.path.join(build_dir, "consumer")]).stdout
        self.assertNotIn("libddp", ldd)
        self.consumer_run(build_dir)

    def test_pkg_config(self):
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(self.prefix, "lib/pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "ddprun"], env=env)
        self.assertEqual(flags.returncode, 0, flags.stderr)
        includes = [os.path.normpath(f[2:]) for f in flags.stdout.split() if f.startswith("-I")]
        self.assertIn(os.path.join(self.prefix, "include/ddprun"), includes)  # relocated: ${pcfiledir}
        exe_dir = os.path.join(self.tmp, "pkgconfig")
        os.makedirs(exe_dir)
        libdir = os.path.join(self.prefix, "lib")
        r = run(["g++", os.path.join(REPO, "examples/consumer/main.cc"), "-o", os.path.join(exe_dir, "consumer")]
                + flags.stdout.split() + ["-Wl,-rpath," + libdir])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.consumer_run(exe_dir)


if __name__ == "__main__":
    main()
