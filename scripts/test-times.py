#!/usr/bin/env python3
"""Prints the slowest tests of a run from its times file.

    python3 scripts/test-times.py --report TIMES_FILE N

TIMES_FILE has one line per test, `<seconds>\t<label>\t<name>\t<result>`, as scripts/lab-tests.py
and scripts/test.sh write it.
"""

import sys


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
    else:
        sys.exit(__doc__)
