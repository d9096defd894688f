#!/usr/bin/env bash
# Times one of the README's two commands the way a newcomer or CI runs it: on a fresh clone, as
# root, from nothing but what the caches hold.
#
#   scripts/time-clone.sh ci   [--empty-caches] [--commit REV]   `CI=true bash .ci/run` (make test)
#   scripts/time-clone.sh demo [--empty-caches] [--commit REV]   `make demo`
#
# --empty-caches: every cache empty: nodemedic's (control plane, Helm, Cluster API, descheduler,
# images), cargo's registry, Go's module and build caches, all in a scratch directory removed after;
# pip's cache unused. Without it the setup's caches are used as they are (`caches: warm`).
# --commit REV: clone this repository and check out REV (default HEAD), e.g. to time an older
# commit's demo beside this one's.
#
# Records bench/results/<ci|demo>-<UTC time>.json (command, commit, started, ended, seconds, caches,
# result; for `ci` also the budget it is held to and whether it was met, and how many tests ran)
# in this repository; for `ci` also the run's phases and slowest tests
# (ci-<UTC time>.summary.txt) and every test's time (ci-<UTC time>.test-times.tsv, the form
# scripts/lab-test-seconds.tsv takes). The whole output goes to target/ci/<ci|demo>-<UTC time>.log,
# each test's own to target/ci/ci-<UTC time>.logs/.
# A fresh clone always starts with an empty cargo target directory. Exits with the run's status.
# The whole script is one block, which bash reads before running any of it: the script runs for
# half an hour, and an edit to it meanwhile (a checkout, a commit) must not change what it runs.
{
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/time-clone.sh ci|demo [--empty-caches] [--commit REV]" >&2; exit 2; }
command=${1:-}
case "$command" in ci | demo) shift ;; *) usage ;; esac
caches=warm
rev=HEAD
while [ $# -gt 0 ]; do
  case "$1" in
    --empty-caches) caches=empty; shift ;;
    --commit) [ $# -ge 2 ] || usage; rev=$2; shift 2 ;;
    *) usage ;;
  esac
done

results=$PWD/bench/results
logs=$PWD/target/ci
mkdir -p "$logs"
commit=$(git rev-parse --short "$rev^{commit}")
stamp=$(date -u +%Y%m%dT%H%M%SZ)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git clone -q . "$scratch/clone"
git -C "$scratch/clone" checkout -q "$commit"
if [ "$caches" = empty ]; then
  mkdir -p "$scratch/cargo"
  export NODEMEDIC_CACHE=$scratch/nodemedic-cache
  export GOMODCACHE=$scratch/go/mod GOCACHE=$scratch/go/build
  # cargo's registry and git checkouts, not its toolchain: rustup's proxies stay on the PATH.
  export CARGO_HOME=$scratch/cargo
  export PIP_NO_CACHE_DIR=1
fi

# The record says what the caches held: a machine whose caches were never filled runs from empty
# ones without the flag (and fills them).
if [ "$caches" = warm ] && [ ! -d "${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}/bin" ]; then
  caches=empty
fi
log=$logs/$command-$stamp.log
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start_seconds=$SECONDS
status=0
case "$command" in
  ci) (cd "$scratch/clone" && CI=true TEST_REPORT_DIR="$scratch/report" bash .ci/run) >"$log" 2>&1 || status=$? ;;
  demo) (cd "$scratch/clone" && make demo) >"$log" 2>&1 </dev/null || status=$? ;;
esac
seconds=$((SECONDS - start_seconds))
ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for kept in summary.txt test-times.tsv; do
  if [ -f "$scratch/report/$kept" ]; then cp "$scratch/report/$kept" "$results/$command-$stamp.$kept"; fi
done
# Every test's output, passing or not, and the machine's CPU use, beside the run's log (not
# committed).
if [ -d "$scratch/report/logs" ]; then cp -r "$scratch/report/logs" "$logs/$command-$stamp.logs"; fi
if [ -f "$scratch/report/vmstat.log" ]; then cp "$scratch/report/vmstat.log" "$logs/$command-$stamp.vmstat.log"; fi
result=$([ "$status" -eq 0 ] && echo green || echo red)
python3 - "$results/$command-$stamp.json" "$log" "$results/$command-$stamp.test-times.tsv" <<EOF
import json, os, re, sys
record = {
    "command": "$command",
    "commit": "$commit",
    "started": "$started",
    "ended": "$ended",
    "seconds": $seconds,
    "caches": "$caches",
    "result": "$result",
}
# The budget (DEVELOPERS.md): 30 minutes with warm caches, 40 with empty ones.
if record["command"] == "ci":
    budget = 30 * 60 if record["caches"] == "warm" else 40 * 60
    record["budgetSeconds"] = budget
    record["budget"] = "under" if record["seconds"] <= budget else "over"
    # How many tests ran: each lab test's row, and what libtest reported for the rest (unit,
    # property, doc and lab-free tests).
    lab_tests = 0
    if os.path.exists(sys.argv[3]):
        with open(sys.argv[3], encoding="utf-8") as rows:
            lab_tests = sum(1 for row in rows if row.strip())
    passed = ignored = 0
    with open(sys.argv[2], encoding="utf-8", errors="replace") as log:
        for line in log:
            found = re.search(r"test result: \w+\. (\d+) passed; \d+ failed; (\d+) ignored", line)
            if found:
                passed += int(found.group(1))
                ignored += int(found.group(2))
    record["tests"] = {"lab": lab_tests, "otherPassed": passed, "otherIgnored": ignored}
with open(sys.argv[1], "w") as out:
    json.dump(record, out, indent=2)
    out.write("\n")
EOF
printf '%s on %s (%s caches): %s in %d min %d s; bench/results/%s-%s.json, %s\n' \
  "$command" "$commit" "$caches" "$result" $((seconds / 60)) $((seconds % 60)) "$command" "$stamp" "$log"
exit "$status"
}
