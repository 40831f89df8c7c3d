"""unittest's main for ddprun's Python tests (one ctest test per file), with honest skips.

A test that cannot run on this machine calls self.skipTest(reason); it is never counted as
passed. After the run this prints one line per skipped test on stdout,
    SKIPPED: <test id>: <reason>
and a count, "PYTHON TESTS: ran N, passed P, skipped S, failed F", both of which scripts/test.sh
(scripts/test_summary.py) collects from ctest's log (build/Testing/Temporary/LastTest.log), and exits
    1   when a test failed or raised (or no test ran at all),
    77  when every test of the file was skipped (SKIP_RETURN_CODE: ctest reports "Skipped"),
    0   otherwise (the skipped ones among them are listed by the lines above).
"""

import os
import sys
import unittest

SKIP_EXIT_CODE = 77


def main(module="__main__"):
    program = unittest.main(module=module, verbosity=2, exit=False)
    result = program.result
    script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    for test, reason in result.skipped:
        test_id = test.id()
        if test_id.startswith("__main__."):
            test_id = script + test_id[len("__main__"):]
        print("SKIPPED: %s: %s" % (test_id, " ".join(str(reason).split())))
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    print("PYTHON TESTS: ran %d, passed %d, skipped %d, failed %d" % (
        result.testsRun, max(0, result.testsRun - len(result.skipped) - failed - len(result.expectedFailures)),
        len(result.skipped), failed))
    sys.stdout.flush()
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped and len(result.skipped) >= result.testsRun:  # setUpClass may skip a whole class
        sys.exit(SKIP_EXIT_CODE)
    if result.testsRun == 0:
        print("no test ran", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
