#!/usr/bin/env python3
"""The end of scripts/test.sh: what passed, what failed, and every skipped test with its reason.

Usage: test_summary.py CTEST_CONSOLE_LOG LAST_TEST_LOG
  CTEST_CONSOLE_LOG: ctest's console output (the "N/M Test #K: name ... Passed" lines);
  LAST_TEST_LOG:     build/Testing/Temporary/LastTest.log (every test's full output).
Skips are reported by the tests themselves: C++ test cases through DDPRUN_SKIP
(tests/support/test_skip.h), Python tests through self.skipTest (tests/support/unittest_main.py); both print
"SKIPPED: <test>: <reason>". A ctest test whose tests were all skipped exits 77 and ctest reports
it "Skipped"; a Python file with some skipped tests passes in ctest, and its skipped tests are
listed here too, so the counts below never count a skipped test as passed.
"""

import re
import sys

# "  3/8 Test #194: unit:nccl: some name ........   Passed    0.01 sec" ("***Skipped", "***Failed", ...)
RESULT_RE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (.+?) \.{3,}\s*(?:\*\*\*)?(\S.*?)\s+[\d.]+ sec\s*$")
LOG_TEST_RE = re.compile(r"^\d+/\d+ Test: (.+)$")
PY_COUNT_RE = re.compile(r"^PYTHON TESTS: ran (\d+), passed (\d+), skipped (\d+), failed (\d+)$")


def ctest_results(path):
    results = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = RESULT_RE.match(line)
            if m:
                results[m.group(1).strip()] = m.group(2)
    return results


def skips_and_counts(path):
    """{ctest test: [skip line without 'SKIPPED: ']}, and the summed Python counts."""
    skips, py = {}, [0, 0, 0, 0]
    current = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = LOG_TEST_RE.match(line)
            if m:
                current = m.group(1).strip()
                continue
            if line.startswith("SKIPPED: ") and current:
                entry = line[len("SKIPPED: "):]
                if entry not in skips.setdefault(current, []):
                    skips[current].append(entry)
            m = PY_COUNT_RE.match(line)
            if m:
                py = [a + int(b) for a, b in zip(py, m.groups())]
    return skips, py


def describe(test, entry):
    """'ctest name: reason' for a C++ test case (whose name is the ctest name without its
    prefix), 'ctest name: test id: reason' for a test inside a Python file."""
    tail = test.split(":", 1)[1].strip() if ":" in test else test
    if entry.startswith(tail + ": "):
        return "%s: %s" % (test, entry[len(tail) + 2:])
    return "%s: %s" % (test, entry)


def main():
    results = ctest_results(sys.argv[1])
    try:
        skips, py = skips_and_counts(sys.argv[2])
    except OSError:
        skips, py = {}, [0, 0, 0, 0]
    by_status = {}
    for test, status in results.items():
        by_status.setdefault(status, []).append(test)
    passed = by_status.pop("Passed", [])
    skipped = by_status.pop("Skipped", [])
    failed = sorted(t for tests in by_status.values() for t in tests)
    inner = sorted(t for t in results if t in skips and results[t] != "Skipped")  # Python files that ran, with skips

    print()
    print("=" * 78)
    print("ctest: %d passed, %d skipped, %d failed (of %d run)" % (len(passed), len(skipped), len(failed), len(results)))
    inner_passed = [t for t in inner if results[t] == "Passed"]
    if inner_passed:
        print("  (%d of the passed are Python files in which some tests skipped: those are listed below)"
              % len(inner_passed))
    if py[0]:
        print("python tests inside the ctest tests: %d passed, %d skipped, %d failed (of %d run)"
              % (py[1], py[2], py[3], py[0]))
    for test in failed:
        print("FAILED: %s (%s)" % (test, results[test]))
    lines = []
    for test in sorted(skipped) + inner:
        entries = skips.get(test) or ["(no reason printed: the test must say why it skipped)"]
        lines += [describe(test, e) for e in entries]
    if lines:
        print("%d test(s) skipped, not passed, and why:" % len(lines))
        for line in lines:
            print("  SKIPPED: " + line)
    else:
        print("no test skipped")
    print("=" * 78)


if __name__ == "__main__":
    main()
