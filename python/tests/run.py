# SPDX-License-Identifier: MIT
"""Run the Python suite; print one line a CI reader understands:

    python: N passed, N failed, N skipped

Usage: python -m tests.run [COUNTS_FILE]  (from python/, or any cwd with
the package installed).  COUNTS_FILE gets "passed failed" for `make test`'s
total.  Exit status 0 only when nothing failed.
"""
import os
import sys
import unittest


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py",
                                                top_level_dir=here)
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(res.failures) + len(res.errors) + \
        len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    passed = res.testsRun - failed - skipped
    print(f"python: {passed} passed, {failed} failed, {skipped} skipped")
    if len(argv) > 1:
        os.makedirs(os.path.dirname(os.path.abspath(argv[1])), exist_ok=True)
        with open(argv[1], "w") as f:
            f.write(f"{passed} {failed}\n")
    return 0 if failed == 0 and res.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
