#!/usr/bin/env python3
"""Passes a libtest run's output through unchanged and records how long each test took.

    <test executable> --test-threads=1 ... | python3 scripts/test-times.py TIMES_FILE LABEL

With one test thread libtest prints `test <name> ... ` as a test starts and its result when it
ends, so the time between the two is the test's. Each finished test appends one line,
`<seconds>\t<label>\t<name>\t<result>`, to TIMES_FILE. `--report TIMES_FILE N` prints the N
slowest of every run recorded there.
"""

import os
import re
import sys
import time

STARTED = re.compile(rb"^test (\S+) \.\.\. ")
ENDED = re.compile(rb"^test (\S+) \.\.\. (ok|FAILED|ignored)")


def record(times_file: str, label: str) -> None:
    starts: dict[bytes, float] = {}
    line = b""
    with open(times_file, "a", encoding="utf-8") as out:
        while chunk := os.read(sys.stdin.fileno(), 65536):
            os.write(sys.stdout.fileno(), chunk)
            now = time.monotonic()
            for piece in chunk.splitlines(keepends=True):
                line += piece
                started = STARTED.match(line)
                if started and started.group(1) not in starts:
                    starts[started.group(1)] = now
                if not line.endswith(b"\n"):
                    continue
                ended = ENDED.match(line)
                if ended:
                    name, result = ended.group(1), ended.group(2)
                    seconds = now - starts.pop(name, now)
                    out.write(f"{seconds:.1f}\t{label}\t{name.decode()}\t{result.decode()}\n")
                    out.flush()
                line = b""


def report(times_file: str, count: int) -> None:
    rows = []
    with open(times_file, encoding="utf-8") as lines:
        for row in lines:
            seconds, label, name, result = row.rstrip("\n").split("\t")
            rows.append((float(seconds), label, name, result))
    rows.sort(reverse=True)
    print(f"the {count} slowest tests (seconds, target, test, result):")
    for seconds, label, name, result in rows[:count]:
        print(f"{seconds:8.1f}  {label}  {name}  {result}")
    print(f"{len(rows)} tests timed, {sum(r[0] for r in rows) / 60:.1f} minutes in all")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--report":
        report(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 3:
        record(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
