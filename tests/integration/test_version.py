"""`--version` on every binary (issue #23): the version of the project (CMakeLists.txt), the git
commit, the build type, and what that binary links; the multi-node binaries name gRPC and protobuf
(compiled in when DDPRUN_STATIC_GRPC). The wheel and the .deb carry the same version: the wheel's
from CMakeLists.txt (pyproject.toml's regex), the .deb's from CPACK_PACKAGE_VERSION = PROJECT_VERSION;
the bare-root test (tests/install) checks both from the installed packages."""

import os
import re
import subprocess

from ddprun_testlib import BIN_DIR, REPO, main
import unittest

VERSION = re.search(r"project\(ddprun VERSION ([0-9.]+)", open(os.path.join(REPO, "CMakeLists.txt")).read()).group(1)


def version_of(binary):
    r = subprocess.run([os.path.join(BIN_DIR, binary), "--version"], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


class VersionTest(unittest.TestCase):
    def test_every_binary_says_its_version_commit_build_and_links(self):
        for binary in ("ddprun", "ddprun-multinode", "ddprun-watchdog", "ddprun-rdzv"):
            with self.subTest(binary=binary):
                rc, out, err = version_of(binary)
                self.assertEqual(rc, 0, err)
                self.assertEqual(err, "")
                lines = out.splitlines()
                self.assertEqual(lines[0], "%s %s" % (binary, VERSION), out)
                self.assertRegex(lines[1], r"^commit: ([0-9a-f]{12}(-dirty)?|unknown)$")
                self.assertRegex(lines[2], r"^build: \S+$")
                self.assertTrue(lines[3].startswith("links: "), out)
                self.assertEqual(len(lines), 4, out)

    def test_the_commit_is_one_of_this_trees(self):
        if subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
            self.skipTest("not a git checkout")
        rc, out, _ = version_of("ddprun")
        commit = re.search(r"^commit: ([0-9a-f]{12})(-dirty)?$", out, re.M)
        self.assertIsNotNone(commit, out)
        # HEAD's at the last build: HEAD itself in CI, an ancestor of it after a commit that was
        # not built yet. A commit from elsewhere, or none, fails.
        ancestor = subprocess.run(["git", "-C", REPO, "merge-base", "--is-ancestor", commit.group(1), "HEAD"],
                                  capture_output=True, text=True)
        self.assertEqual(ancestor.returncode, 0, "%s is not HEAD or an ancestor of it: %s" % (commit.group(1), ancestor.stderr))

    def test_the_multinode_binaries_name_grpc_and_protobuf(self):
        for binary in ("ddprun-multinode", "ddprun-rdzv"):
            with self.subTest(binary=binary):
                _, out, _ = version_of(binary)
                self.assertRegex(out, r"gRPC \d+\.\d+\.\d+ \((compiled in|shared)\)")
                self.assertRegex(out, r"protobuf \d+\.\d+\.\d+ \((compiled in|shared)\)")
        _, out, _ = version_of("ddprun")
        self.assertRegex(out, r"spdlog \d+\.\d+\.\d+")
        self.assertIn("no gRPC", out)
        _, out, _ = version_of("ddprun-watchdog")
        self.assertIn("links: nothing (a static executable)", out)

    def test_the_version_matches_the_wheel_metadata_rule(self):
        # pyproject.toml reads the version with this regex; a change to project() that breaks it
        # would give the wheel no version.
        text = open(os.path.join(REPO, "pyproject.toml")).read()
        pattern = re.search(r"regex = '(.*)'", text).group(1)
        self.assertEqual(re.search(pattern, open(os.path.join(REPO, "CMakeLists.txt")).read()).group("value"), VERSION)


if __name__ == "__main__":
    main()
