#!/usr/bin/env bash
# Times CI the way CI runs it: a fresh clone of this repository's HEAD, `CI=true bash .ci/run`, as
# root. Records bench/results/ci-<UTC time>.json (commit, started, ended, seconds, caches, result)
# in this repository with the run's phases and slowest tests beside it (ci-<UTC time>.summary.txt)
# and every test's time (ci-<UTC time>.test-times.tsv, the form scripts/lab-test-seconds.tsv takes);
# the whole output goes to target/ci/ci-<UTC time>.log.
#
#   scripts/time-ci.sh                  the setup's caches as they are (`caches: warm`)
#   scripts/time-ci.sh --empty-caches   every cache empty: nodemedic's (control plane, Helm,
#                                       Cluster API, descheduler, images), cargo's registry, Go's
#                                       module and build caches, all in a scratch directory removed
#                                       after; pip's cache unused
#
# A fresh clone always starts with an empty cargo target directory. Exits with the run's status.
set -euo pipefail
cd "$(dirname "$0")/.."

caches=warm
case "${1:-}" in
  "") ;;
  --empty-caches) caches=empty ;;
  *) echo "usage: scripts/time-ci.sh [--empty-caches]" >&2; exit 2 ;;
esac

results=$PWD/bench/results
logs=$PWD/target/ci
mkdir -p "$logs"
commit=$(git rev-parse --short HEAD)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git clone -q . "$scratch/clone"
if [ "$caches" = empty ]; then
  mkdir -p "$scratch/cargo"
  export NODEMEDIC_CACHE=$scratch/nodemedic-cache
  export GOMODCACHE=$scratch/go/mod GOCACHE=$scratch/go/build
  # cargo's registry and git checkouts, not its toolchain: rustup's proxies stay on the PATH.
  export CARGO_HOME=$scratch/cargo
  export PIP_NO_CACHE_DIR=1
fi

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start_seconds=$SECONDS
status=0
(cd "$scratch/clone" && CI=true TEST_REPORT_DIR="$scratch/report" bash .ci/run) >"$logs/ci-$stamp.log" 2>&1 || status=$?
seconds=$((SECONDS - start_seconds))
ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for kept in summary.txt test-times.tsv; do
  if [ -f "$scratch/report/$kept" ]; then cp "$scratch/report/$kept" "$results/ci-$stamp.$kept"; fi
done
result=$([ "$status" -eq 0 ] && echo green || echo red)
python3 - "$results/ci-$stamp.json" <<EOF
import json, sys
record = {
    "commit": "$commit",
    "started": "$started",
    "ended": "$ended",
    "seconds": $seconds,
    "caches": "$caches",
    "result": "$result",
}
with open(sys.argv[1], "w") as out:
    json.dump(record, out, indent=2)
    out.write("\n")
EOF
printf 'CI on %s (%s caches): %s in %d min %d s; bench/results/ci-%s.{json,summary.txt,test-times.tsv}, target/ci/ci-%s.log\n' \
  "$commit" "$caches" "$result" $((seconds / 60)) $((seconds % 60)) "$stamp" "$stamp"
exit "$status"
