#!/usr/bin/env bash
# Everything CI checks: formatting, lints, generated files, unit/property tests and the lab tests
# against the real control plane. Run through `make test`; installs what it needs first
# (scripts/setup.sh, in phases).
#
# On a fresh machine the control plane's Go build and the Rust build of what the first lab test
# runs go side by side, at the same priority. That first test is the ten-minute control-plane
# outage test, which holds the lab for about 23 minutes, most of it waiting on a stopped API server
# or etcd: it runs from a build of its own (profile outage-test, quicker to build), and the build
# every other lab test runs, the lints, the unit tests, the lab-free tests, the images and the Go
# builds only later tests need are made meanwhile at the lowest priority (the lab's processes keep
# theirs). Lab tests always run one lab at a time: the lab's own tests, then the end-to-end tests,
# follow the outage test.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n=== %s ===\n' "$*" >&2; }

OUTAGE_TEST=outages::ten_minute_api_server_and_etcd_outages_fence_nobody_and_remediate_nothing_healthy
# Every integration-test target and where it runs below; a new one must be added here. The lab's
# own tests run first after the outage test, then the end-to-end tests.
LAB_OWN_TEST_TARGET="nodemedic-lab:it"
END_TO_END_TEST_TARGETS="nodemedic-harness:e2e"
LAB_TEST_TARGETS="$LAB_OWN_TEST_TARGET $END_TO_END_TEST_TARGETS"
LAB_FREE_TEST_TARGETS="nodemedic-api:it nodemedic-descheduler:policies"

step "setup: Debian packages and lint tools"
bash scripts/setup.sh packages

step "meanwhile: the BMC emulator and the control plane (setup.sh lab)"
lab_setup_log=$(mktemp)
bash scripts/setup.sh lab >"$lab_setup_log" 2>&1 &
lab_setup=$!
trap 'kill "$lab_setup" 2>/dev/null || true' EXIT

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
trap 'kill "$lab_setup" "$build" 2>/dev/null || true' EXIT
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
(cd testing/harness && exec "$outage_e2e" --exact "$OUTAGE_TEST" --nocapture) >"$log" 2>&1 &
outage=$!
later_setup_log=$(mktemp)
nice -n 19 bash scripts/setup.sh later >"$later_setup_log" 2>&1 &
later_setup=$!
trap 'kill "$outage" "$later_setup" 2>/dev/null || true' EXIT

step "meanwhile: the build the other lab tests run"
# One cargo run builds the lab's own tests, the product's executables and the end-to-end tests:
# two would resolve features apart (the lab's FUSE crate turns on more of nix and zerocopy) and
# compile kube and every crate above it twice.
build_json=$(mktemp)
nice -n 19 cargo build --locked -p nodemedic --bins -p nodemedic-harness -p nodemedic-lab --test e2e --test it \
  --message-format=json-render-diagnostics >"$build_json"
it_test=$(built_test "$build_json" "${LAB_OWN_TEST_TARGET#*:}")
[ -n "$it_test" ] || { echo "cargo built no executable for $LAB_OWN_TEST_TARGET" >&2; exit 1; }

step "meanwhile: cargo clippy, unit and property tests, doc tests"
nice -n 19 cargo clippy --workspace --all-targets --locked -- -D warnings
nice -n 19 cargo test --workspace --locked --lib --bins
nice -n 19 cargo test --workspace --locked --doc
for target in $LAB_FREE_TEST_TARGETS; do
  nice -n 19 cargo test --locked -p "${target%%:*}" --test "${target#*:}"
done
# Built now, so the lab tests below start the moment the lab is free. They run from these
# executables: `cargo test -p <one package>` would resolve features for that package alone and
# rebuild half the workspace first.
lab_tests=$(mktemp)
nice -n 19 cargo test --workspace --locked --tests --no-run --message-format=json-render-diagnostics |
  LAB_TEST_TARGETS="$END_TO_END_TEST_TARGETS" python3 -c '
import json, os, sys, tomllib
wanted = os.environ["LAB_TEST_TARGETS"].split()
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    with open(message["manifest_path"], "rb") as manifest:
        package = tomllib.load(manifest)["package"]["name"]
    name = package + ":" + message["target"]["name"]
    if message["target"]["kind"] == ["test"] and name in wanted:
        print(name, message["executable"], os.path.dirname(message["manifest_path"]))' >"$lab_tests"
step "meanwhile: the tools only later tests need (setup.sh later)"
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

step "the outage test"
status=0
wait "$outage" || status=$?
trap - EXIT
cat "$log" >&2
if [ "$status" -ne 0 ]; then
  echo "the outage test failed (exit $status)" >&2
  exit "$status"
fi

step "the lab's own tests"
# From the package's folder, as cargo runs its tests.
(cd testing/lab && exec "$it_test")

step "the other end-to-end tests"
for target in $END_TO_END_TEST_TARGETS; do
  read -r _ executable dir < <(grep "^$target " "$lab_tests") ||
    { echo "no executable was built for the test target $target" >&2; exit 1; }
  # From the package's folder, as cargo runs its tests.
  (cd "$dir" && exec "$executable" --skip "$OUTAGE_TEST")
done
