#!/usr/bin/env python3
"""Every Catch2 test name must survive ctest's discovery.

catch_discover_tests passes the names through a CMake list: a name with ';'
becomes two tests that match nothing, and one with an unbalanced '[' glues the
names after it into one. Either way Catch runs nothing, prints "No tests ran"
and exits 0, so ctest counts a pass for tests that never ran (it happened:
most emulated CUDA tests did not run for a while). This check lists each
executable's names and fails, naming the test, on any such name.

usage: check_test_names.py EXECUTABLE...
"""
import subprocess
import sys


def problem(name):
    if ";" in name:
        return "contains ';'"
    depth = 0
    for ch in name:
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0:
            return "has a ']' before its '['"
    return "has an unclosed '['" if depth else None


def main(executables):
    bad = []
    total = 0
    for exe in executables:
        # Catch2 2.x exits with the number of tests it listed, not 0.
        run = subprocess.run([exe, "--list-test-names-only"], capture_output=True, text=True)
        names = [line for line in run.stdout.splitlines() if line.strip()]
        if run.returncode < 0 or not names:
            print(f"{exe}: listing its tests failed (exit {run.returncode}): {run.stderr.strip()}")
            return 1
        total += len(names)
        bad += [f"{exe}: '{n}' {problem(n)}" for n in names if problem(n)]
    if bad:
        print("test names ctest cannot discover (rename them):\n  " + "\n  ".join(bad))
        return 1
    print(f"{total} test names in {len(executables)} executables, all discoverable")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
