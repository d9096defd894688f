#!/usr/bin/env python3
"""Runs lab tests in parallel lanes, one test per process, longest first, and records each one's time.

    lab-tests.py --lanes N --times TIMES_FILE [--logs DIR] [--expected EXPECTED_FILE] [--skip NAME]...
                 [--after READY_FILE MODULES] [--grow LANES READY_FILES]... [--alone MODULES]
                 [--at-most COUNT MODULES] [--slots-file PATH]
                 --target LABEL EXECUTABLE FOLDER [--target ...]

Each test runs as `EXECUTABLE --exact NAME --test-threads=1` from FOLDER (as cargo runs a
package's tests), so its time is its own and its output is printed whole once it ends, never
interleaved with another's. How many labs run at once is the lab's to decide (its slot locks, see
`nodemedic_lab::LabKind`): a lane whose test needs the machine alone waits for its lab there.

The queue is ordered by EXPECTED_FILE (a times file of an earlier run), longest first, so the
long tests do not end the run on one lane while the other idles; a test it does not name goes
first, as if long. Each finished test appends `<seconds>\t<label>\t<name>\t<result>` to
TIMES_FILE, and with `--logs DIR` its whole output (`--nocapture`, passing or not) to
`DIR/<name>.log`: a test that was slow in a run that passed can be read afterwards. Exits non-zero when any test failed, after every test has run.

`--after READY_FILE MODULES` holds back the tests of the comma-separated MODULES (`chart,machines`)
until READY_FILE exists, holding the exit status of what they need (tools still being built):
0 lets them run, anything else fails them without running. A module named after several
`--after`s waits for all of them. Lanes run other tests meanwhile.

`--alone MODULES` runs the tests of the comma-separated MODULES first, one at a time, before any
other starts: a lab that needs the machine's short-timings labs to itself (`LabConfig::fleet`,
`.alone()`) otherwise waits for every lane's lab to end at once, which with lanes taking turns
took 550 s of ci-20261206T204222Z for a test of 200 s, its lane idle all along.

`--at-most COUNT MODULES` runs at most COUNT tests of the comma-separated MODULES at once; a lane
takes another test meanwhile (scripts/test.sh runs the labs of real nodes one at a time).

`--slots-file PATH` keeps that count in PATH (a file of its own otherwise): a lab test run
beside the lanes, told of it, waits for the same slots as theirs.

`--grow LANES READY_FILES` runs LANES lanes instead of N once every one of the comma-separated
READY_FILES holds an exit status (whatever it is): the builds beside the lanes have ended and more
labs fit beside each other. Every test, those running too, is then let run that many
short-timings labs at once (the file NODEMEDIC_LAB_SHORT_TIMINGS_SLOTS_FILE names, which the
lab's slot locks read again while they wait), so the extra lanes do not just wait for a slot. Several `--grow`s grow in stages, each
from the lanes of the one before (each naming at least the ready files of the one before).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Test:
    label: str
    executable: str
    folder: str
    name: str
    # The ready files of everything the test needs made first.
    after: list[str] = field(default_factory=list)


# Read by the lab (nodemedic_lab's slot locks) while a lab waits for a slot: the file that holds
# how many short-timings labs run at once.
SLOTS_FILE_VAR = "NODEMEDIC_LAB_SHORT_TIMINGS_SLOTS_FILE"


def ready(test: Test) -> str | None:
    """None while what the test needs is still being made; once all is made, the first failed
    maker's exit status, or "0"."""
    return made(test.after)


def made(ready_files: list[str]) -> str | None:
    """None while any of ready_files is missing or empty; then the first non-zero status, or "0"."""
    for ready_file in ready_files:
        try:
            with open(ready_file, encoding="utf-8") as file:
                status = file.read().strip()
        except FileNotFoundError:
            return None
        if not status:
            return None
        if status != "0":
            return status
    return "0"


def module(test: Test) -> str:
    return test.name.split("::")[0]


def listed(label: str, executable: str, folder: str) -> list[Test]:
    out = subprocess.run(
        [executable, "--list", "--format", "terse"], cwd=folder, check=True, capture_output=True, text=True
    ).stdout
    return [
        Test(label, executable, folder, line.removesuffix(": test"))
        for line in out.splitlines()
        if line.endswith(": test")
    ]


def expected_seconds(path: str | None) -> dict[tuple[str, str], float]:
    if not path or not os.path.exists(path):
        return {}
    seconds = {}
    with open(path, encoding="utf-8") as rows:
        for row in rows:
            took, label, name, _ = row.rstrip("\n").split("\t")
            seconds[(label, name)] = float(took)
    return seconds


class Run:
    def __init__(self, queue: list[Test], times_file: str, logs: str | None, slots_file: str | None = None):
        self.queue = queue
        self.times_file = times_file
        self.logs = logs
        self.lock = threading.Lock()
        self.failed: list[str] = []
        self.started = time.monotonic()
        # How many short-timings labs run at once (see grow), in a file every test is told of.
        self.slots = 0
        self.slots_file = slots_file or os.path.join(tempfile.mkdtemp(prefix="lab-tests-"), "short-timings-slots")
        self.env = {**os.environ, SLOTS_FILE_VAR: self.slots_file}
        # Tests of the limited modules (--at-most) that are running, and how many may.
        self.limited: set[str] = set()
        self.limit = 0
        self.running_limited = 0

    def allowed(self, test: Test) -> bool:
        return module(test) not in self.limited or self.running_limited < self.limit

    def next_test(self) -> tuple[Test, str] | None:
        """The first test whose needs are made, waiting while none is; None when none is left."""
        while True:
            with self.lock:
                if not self.queue:
                    return None
                for index, test in enumerate(self.queue):
                    status = ready(test)
                    if status is not None and self.allowed(test):
                        if module(test) in self.limited:
                            self.running_limited += 1
                        return self.queue.pop(index), status
            time.sleep(1)

    def grow(self, lanes: int, first: int, ready_files: list[str]) -> None:
        """Once every ready file is made, lanes `first`..`lanes` join the others; returns when they
        end (at once when the queue empties first)."""
        while made(ready_files) is None:
            with self.lock:
                if not self.queue:
                    return
            time.sleep(1)
        with self.lock:
            self.set_slots(lanes)
            at = time.monotonic() - self.started
            made_now = ", ".join(os.path.basename(f) for f in ready_files)
            sys.stdout.write(f"at {at:.0f}s: {made_now} made; {lanes} lanes from now on\n")
            sys.stdout.flush()
        added = [threading.Thread(target=self.lane, args=(n,)) for n in range(first, lanes + 1)]
        for lane in added:
            lane.start()
        for lane in added:
            lane.join()

    def set_slots(self, slots: int) -> None:
        """Lets up to `slots` short-timings labs run at once (never fewer than before), from the
        labs' next look on, in tests already running too."""
        self.slots = max(self.slots, slots)
        written = self.slots_file + ".new"
        with open(written, "w", encoding="utf-8") as file:
            file.write(f"{self.slots}\n")
        os.replace(written, self.slots_file)

    def lane(self, number: int) -> None:
        while picked := self.next_test():
            test, status = picked
            if status == "0":
                self.run_one(number, test)
            else:
                self.record(number, test, time.monotonic(), 0.0, 1, f"not run: one of {test.after} says {status}\n")
            if module(test) in self.limited:
                with self.lock:
                    self.running_limited -= 1

    def run_one(self, lane: int, test: Test) -> None:
        began = time.monotonic()
        with self.lock:
            env = self.env
        with tempfile.TemporaryFile() as output:
            status = subprocess.run(
                [test.executable, "--exact", test.name, "--test-threads=1"]
                + (["--nocapture"] if self.logs else []),
                cwd=test.folder,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            ).returncode
            took = time.monotonic() - began
            output.seek(0)
            text = output.read().decode(errors="replace")
        if self.logs:
            with open(os.path.join(self.logs, f"{test.name}.log"), "w", encoding="utf-8") as log:
                log.write(text)
        self.record(lane, test, began, took, status, text)

    def record(self, lane: int, test: Test, began: float, took: float, status: int, text: str) -> None:
        result = "ok" if status == 0 else "FAILED"
        with self.lock:
            at = began - self.started
            # A passing test's output is libtest's own summary; a failing one's says why.
            sys.stdout.write(
                f"lane {lane}, at {at:.0f}s: {test.label} {test.name} ... {result} in {took:.1f}s\n"
                + ("" if status == 0 else text)
            )
            sys.stdout.flush()
            with open(self.times_file, "a", encoding="utf-8") as times:
                times.write(f"{took:.1f}\t{test.label}\t{test.name}\t{result}\n")
            if status != 0:
                self.failed.append(f"{test.label} {test.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int, required=True)
    parser.add_argument("--times", required=True)
    parser.add_argument("--logs")
    parser.add_argument("--expected")
    parser.add_argument("--skip", action="append", default=[])
    parser.add_argument("--after", nargs=2, action="append", default=[], metavar=("READY_FILE", "MODULES"))
    parser.add_argument("--grow", nargs=2, action="append", default=[], metavar=("LANES", "READY_FILES"))
    parser.add_argument("--alone", default="", metavar="MODULES")
    parser.add_argument("--at-most", nargs=2, metavar=("COUNT", "MODULES"))
    parser.add_argument("--slots-file", metavar="PATH")
    parser.add_argument("--target", nargs=3, action="append", required=True, metavar=("LABEL", "EXECUTABLE", "FOLDER"))
    args = parser.parse_args()

    tests = [t for target in args.target for t in listed(*target) if t.name not in args.skip]
    for ready_file, modules in args.after:
        for test in tests:
            if test.name.split("::")[0] in modules.split(","):
                test.after.append(ready_file)
    expected = expected_seconds(args.expected)
    tests.sort(key=lambda t: expected.get((t.label, t.name), float("inf")), reverse=True)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    alone_modules = [m for m in args.alone.split(",") if m]
    alone = [t for t in tests if t.name.split("::")[0] in alone_modules]
    run = Run([t for t in tests if t not in alone], args.times, args.logs, args.slots_file)
    # One lab per lane until a grow: a file that says nothing would leave one per core.
    run.set_slots(args.lanes)
    if args.at_most:
        run.limit = int(args.at_most[0])
        run.limited = set(args.at_most[1].split(","))
    if alone:
        print(f"{len(alone)} tests alone first, then the others", flush=True)
        first = Run(alone, args.times, args.logs)
        first.lane(1)
        run.failed += first.failed
    print(f"{len(run.queue)} tests in {args.lanes} lanes, longest first", flush=True)
    lanes = [threading.Thread(target=run.lane, args=(n + 1,)) for n in range(args.lanes)]
    before = args.lanes
    for grow_to, ready_files in sorted(args.grow, key=lambda g: int(g[0])):
        if int(grow_to) > before:
            grown = (int(grow_to), before + 1, ready_files.split(","))
            lanes.append(threading.Thread(target=run.grow, args=grown))
            before = int(grow_to)
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    if run.failed:
        print(f"\n{len(run.failed)} failed:\n  " + "\n  ".join(run.failed), flush=True)
        return 1
    print(f"\nall {len(tests)} passed in {time.monotonic() - run.started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
