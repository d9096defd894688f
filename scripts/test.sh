#!/usr/bin/env bash
# Everything CI checks: formatting, lints, generated files, unit/property tests and the lab tests
# against the real control plane. Run through `make test`; installs what it needs first
# (scripts/setup.sh, in phases).
#
# On a fresh machine the control plane's Go build and the Rust build of what the first lab test
# runs go side by side, at the same priority. That first test is the ten-minute control-plane
# outage test, which holds its lab for about 23 minutes, most of it waiting on a stopped API
# server or etcd: it runs from a build of its own (profile outage-test, quicker to build), and the
# build every other lab test runs, the lints, the unit tests, the lab-free tests, the images and
# the Go builds only later tests need are made meanwhile at the lowest priority (the lab's
# processes keep theirs). The outage lab runs on Kubernetes' default timings, which tolerate a
# busy machine, so the lab's own tests and the end-to-end tests (short timings, one lab at a
# time) run beside it as soon as they are built; the outage test yields them the CPU (nice 5).
#
# Each phase's start and duration, and the slowest tests, are printed at the end (also when a
# phase fails), and kept in $TEST_REPORT_DIR (target/test-report).
set -euo pipefail
cd "$(dirname "$0")/.."
run_started=$EPOCHREALTIME
repo=$PWD
report_dir=${TEST_REPORT_DIR:-${CARGO_TARGET_DIR:-target}/test-report}
mkdir -p "$report_dir"
# Absolute: tests run from their package's folder.
report_dir=$(cd "$report_dir" && pwd)
phases=$report_dir/phases.tsv
test_times=$report_dir/test-times.tsv
: >"$phases"
: >"$test_times"
seconds_since_start() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.0f}")' "$run_started" "$1"; }
# The script's own flow is one phase after another: each step ends the one before.
current_step="" current_step_started=""
end_step() {
  if [ -n "$current_step" ]; then
    printf '%s\t%s\t%s\n' "$current_step_started" "$EPOCHREALTIME" "$current_step" >>"$phases"
  fi
  current_step=""
}
step() {
  end_step
  current_step="$*" current_step_started=$EPOCHREALTIME
  printf '\n=== %s (at %ss) ===\n' "$*" "$(seconds_since_start "$EPOCHREALTIME")" >&2
}
# Runs a command in the background as a phase of its own: `in_background NAME LOG command...`
# (its pid in $!).
in_background() {
  local name=$1 log=$2
  shift 2
  (
    started=$EPOCHREALTIME status=0
    "$@" >"$log" 2>&1 &
    child=$!
    # Stopping the phase stops its command.
    trap 'kill "$child" 2>/dev/null' TERM
    wait "$child" || status=$?
    printf '%s\t%s\t%s\n' "$started" "$EPOCHREALTIME" "$name" >>"$phases"
    exit "$status"
  ) &
}
background_jobs=""
report() {
  local status=$?
  set +e
  end_step
  # shellcheck disable=SC2086 # one pid per word
  kill $background_jobs 2>/dev/null
  {
    printf '\nphases (started at, seconds; "meanwhile" phases and background phases overlap):\n'
    sort -n "$phases" | while IFS=$'\t' read -r started ended name; do
      printf '%6ss %6ss  %s\n' "$(seconds_since_start "$started")" \
        "$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.0f}")' "$started" "$ended")" "$name"
    done
    printf 'in all: %ss\n\n' "$(seconds_since_start "$EPOCHREALTIME")"
    if [ -s "$test_times" ]; then python3 "$repo/scripts/test-times.py" --report "$test_times" 15; fi
  } | tee "$report_dir/summary.txt" >&2
  exit "$status"
}
trap report EXIT
# Runs a test executable one test at a time, recording each test's time.
timed_tests() {
  local label=$1
  shift
  "$@" --test-threads=1 | python3 "$repo/scripts/test-times.py" "$test_times" "$label"
}

OUTAGE_TEST=outages::ten_minute_api_server_and_etcd_outages_fence_nobody_and_remediate_nothing_healthy
# Every integration-test target and where it runs below; a new one must be added here. The lab's
# own tests run first once built, then the end-to-end tests, beside the outage test.
LAB_OWN_TEST_TARGET="nodemedic-lab:it"
END_TO_END_TEST_TARGETS="nodemedic-harness:e2e"
LAB_TEST_TARGETS="$LAB_OWN_TEST_TARGET $END_TO_END_TEST_TARGETS"
LAB_FREE_TEST_TARGETS="nodemedic-api:it nodemedic-descheduler:policies"

step "setup: Debian packages and lint tools"
bash scripts/setup.sh packages

step "meanwhile: the BMC emulator and the control plane (setup.sh lab)"
lab_setup_log=$(mktemp)
in_background "setup.sh lab (background)" "$lab_setup_log" bash scripts/setup.sh lab
lab_setup=$!
background_jobs="$lab_setup"

step "cargo fmt --check"
cargo fmt --all -- --check

step "every integration-test target is run"
found=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if target["kind"] == ["test"]:
            print(package["name"] + ":" + target["name"])' | sort)
expected=$(printf '%s\n' $LAB_TEST_TARGETS $LAB_FREE_TEST_TARGETS | sort)
if [ "$found" != "$expected" ]; then
  printf 'scripts/test.sh runs these test targets:\n%s\nbut the workspace has:\n%s\nAdd the new one to LAB_TEST_TARGETS or LAB_FREE_TEST_TARGETS.\n' \
    "$expected" "$found" >&2
  exit 1
fi

step "what ships links no test tooling"
shipped_tree=$(cargo tree --locked -p nodemedic -e normal --prefix none)
shipped_tooling=$(printf '%s\n' "$shipped_tree" | grep -E '^nodemedic-(lab|harness) ' | sort -u || true)
if [ -n "$shipped_tooling" ]; then
  printf 'the shipped package nodemedic depends on test tooling:\n%s\nMove what it needs under crates/.\n' "$shipped_tooling" >&2
  exit 1
fi

step "build what the outage test runs (profile outage-test)"
# Its own build, with unoptimised dependencies (see the profile in Cargo.toml): the outage test
# starts as soon as this and the control plane are built, and everything else waits for neither.
outage_build_json=$(mktemp)
cargo build --locked --profile outage-test -p nodemedic --bins -p nodemedic-harness --test e2e \
  --message-format=json-render-diagnostics >"$outage_build_json" &
build=$!
background_jobs="$lab_setup $build"
# The executable cargo built for test target $2, from the build messages in file $1.
built_test() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message["target"]["name"] == sys.argv[2] \
            and message["target"]["kind"] == ["test"] and message.get("executable"):
        print(message["executable"])' "$1" "$2"
}

step "the control plane"
status=0
wait "$lab_setup" || status=$?
cat "$lab_setup_log" >&2
[ "$status" -eq 0 ] || { echo "setup.sh lab failed (exit $status)" >&2; exit "$status"; }

step "the build, then the outage test"
wait "$build" || { echo "cargo build (profile outage-test) failed" >&2; exit 1; }
outage_e2e=$(built_test "$outage_build_json" e2e)
[ -n "$outage_e2e" ] || { echo "cargo built no executable for nodemedic-harness:e2e" >&2; exit 1; }

log=$(mktemp)
# Run from the package's folder, as cargo runs its tests.
in_background "the outage test (background)" "$log" \
  bash -c 'cd testing/harness && exec nice -n 5 "$0" --exact "$1" --nocapture' "$outage_e2e" "$OUTAGE_TEST"
outage=$!
later_setup_log=$(mktemp)
in_background "setup.sh later (background)" "$later_setup_log" nice -n 19 bash scripts/setup.sh later
later_setup=$!
background_jobs="$outage $later_setup"

step "meanwhile: the build the other lab tests run"
# One cargo run builds the lab's own tests, the product's executables and the end-to-end tests:
# two would resolve features apart (the lab's FUSE crate turns on more of nix and zerocopy) and
# compile kube and every crate above it twice.
build_json=$(mktemp)
nice -n 19 cargo build --locked -p nodemedic --bins -p nodemedic-harness -p nodemedic-lab --test e2e --test it \
  --message-format=json-render-diagnostics >"$build_json"
it_test=$(built_test "$build_json" "${LAB_OWN_TEST_TARGET#*:}")
[ -n "$it_test" ] || { echo "cargo built no executable for $LAB_OWN_TEST_TARGET" >&2; exit 1; }
# The lab tests run from these executables: `cargo test -p <one package>` would resolve features
# for that package alone and rebuild half the workspace first.
for target in $END_TO_END_TEST_TARGETS; do
  executable=$(built_test "$build_json" "${target#*:}")
  [ -n "$executable" ] || { echo "cargo built no executable for $target" >&2; exit 1; }
done

step "meanwhile: cargo clippy, unit and property tests, doc tests, lab-free tests (background)"
# At the lowest CPU and I/O priority, beside the lab tests: a lab's processes preempt them.
checks_log=$(mktemp)
in_background "clippy, unit, property, doc and lab-free tests (background)" "$checks_log" \
  nice -n 19 ionice -c3 bash -c '
set -euo pipefail
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --lib --bins
cargo test --workspace --locked --doc
for target in $0; do
  cargo test --locked -p "${target%%:*}" --test "${target#*:}"
done' "$LAB_FREE_TEST_TARGETS"
checks=$!
background_jobs="$outage $later_setup $checks"

step "the lab's own tests (beside the outage test)"
# From the package's folder, as cargo runs its tests.
(cd testing/lab && timed_tests "${LAB_OWN_TEST_TARGET}" "$it_test")

step "the tools only later tests need (setup.sh later)"
status=0
wait "$later_setup" || status=$?
cat "$later_setup_log" >&2
[ "$status" -eq 0 ] || { echo "setup.sh later failed (exit $status)" >&2; exit "$status"; }

step "the chart's Prometheus rules (promtool check and test)"
# shellcheck source=versions.env
. scripts/versions.env
promtool="${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}/bin/rebalancing-descheduler-v$DESCHEDULER_VERSION-prometheus-$PROMETHEUS_DEBIAN_VERSION/promtool"
"$promtool" check rules charts/nodemedic/files/alerts.yaml charts/nodemedic/files/descheduler-rules.yaml
"$promtool" test rules testing/rules/descheduler-rules.test.yaml

step "the upstream descheduler accepts every expected policy"
# It loads and validates the policy, then fails at its first request to the API server (here:
# nothing listens at 127.0.0.1:1): got that far, the policy is accepted. The OpenShift-plugin
# policy is for OpenShift's build, which the upstream one must refuse.
descheduler="$(dirname "$promtool")/descheduler"
scratch=$(mktemp -d)
printf '%s\n' 'apiVersion: v1' 'kind: Config' \
  'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]' \
  'users: [{name: u, user: {token: x}}]' 'contexts: [{name: c, context: {cluster: c, user: u}}]' \
  'current-context: c' >"$scratch/kubeconfig"
for policy in crates/operators/descheduler/tests/policies/*.yaml; do
  verdict=$(cd "$scratch" && timeout 20 "$descheduler" --policy-config-file "$OLDPWD/$policy" \
    --kubeconfig "$scratch/kubeconfig" --dry-run --secure-port=0 2>&1 | grep -m1 'failed to run descheduler server' || true)
  case "$policy:$verdict" in
    *openshift-plugin*:*"KubevirtMigrationAware in pluginConfig not registered"*) ;;
    *openshift-plugin*) echo "$policy: the upstream descheduler did not refuse OpenShift's plugin: $verdict" >&2; exit 1 ;;
    *"127.0.0.1:1"*) ;;
    *) echo "$policy: refused by the upstream descheduler: $verdict" >&2; exit 1 ;;
  esac
done
rm -rf "$scratch"

# The images, as `make image` builds them but from the executables under test, for the test that
# runs them as containers.
target_dir=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
export NODEMEDIC_IMAGES=$target_dir/test-images
NODEMEDIC_IMAGE_BINARIES=$target_dir/debug NODEMEDIC_IMAGE_OUT="$NODEMEDIC_IMAGES" \
  nice -n 19 ionice -c3 bash scripts/build-images.sh

step "the other end-to-end tests (beside the outage test)"
for target in $END_TO_END_TEST_TARGETS; do
  executable=$(built_test "$build_json" "${target#*:}")
  # From the package's folder, as cargo runs its tests.
  package=${target%%:*}
  (cd "testing/${package#nodemedic-}" && timed_tests "$target" "$executable" --skip "$OUTAGE_TEST")
done

step "clippy, unit, property, doc and lab-free tests"
status=0
wait "$checks" || status=$?
cat "$checks_log" >&2
[ "$status" -eq 0 ] || { echo "clippy or the unit, doc or lab-free tests failed (exit $status)" >&2; exit "$status"; }

step "the outage test"
status=0
wait "$outage" || status=$?
background_jobs=""
cat "$log" >&2
outage_seconds=$(sort -n "$phases" | awk -F'\t' '$3 == "the outage test (background)" { printf "%.1f", $2 - $1 }')
printf '%s\t%s\t%s\t%s\n' "$outage_seconds" "nodemedic-harness:e2e" "$OUTAGE_TEST" \
  "$([ "$status" -eq 0 ] && echo ok || echo FAILED)" >>"$test_times"
if [ "$status" -ne 0 ]; then
  echo "the outage test failed (exit $status)" >&2
  exit "$status"
fi
