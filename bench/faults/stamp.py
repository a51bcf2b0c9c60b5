#!/usr/bin/env python3
"""Runs a command and prints each of its output lines with the seconds
since the start, so that the time from a fault to its detection and to the
job's recovery can be read off one run.

  python3 bench/faults/stamp.py -- python3 tracker/launch.py ... -- PROGRAM

With --between A B it prints only the seconds from the first line matching
regex A to the first later line matching regex B (nothing found: exit 1).
"""
import argparse
import re
import subprocess
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--between", nargs=2, metavar=("A", "B"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    first = None
    found = None
    for line in proc.stdout:
        t = time.monotonic() - start
        if args.between is None:
            sys.stdout.write("%8.3f %s" % (t, line))
            continue
        if first is None and re.search(args.between[0], line):
            first = t
        elif first is not None and found is None and \
                re.search(args.between[1], line):
            found = t
    rc = proc.wait()
    if args.between is not None:
        if found is None:
            print("stamp: no line matched %r after %r (command exit %d)" %
                  (args.between[1], args.between[0], rc), file=sys.stderr)
            return 1
        print("%.3f" % (found - first))
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
