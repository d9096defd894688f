#!/usr/bin/env bash
# Builds and fetches, once, what the rebalancing tests run, into the cache outside the repo:
#   descheduler   the upstream descheduler (sigs.k8s.io/descheduler), the engine a
#                 KubeDescheduler's policy runs in
#   prometheus    Prometheus and promtool, from Debian's package (extracted: no service starts),
#   promtool      which scrape the lab's node exporters and check the chart's recording rules
# The descheduler builds in the control plane's Go module (scripts/go-module.sh), linking the
# Kubernetes libraries its build compiled.
# Idempotent: binaries that run are kept. Prints the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"
# shellcheck source=go-module.sh
. "$here/go-module.sh"

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/rebalancing-descheduler-v$DESCHEDULER_VERSION-prometheus-$PROMETHEUS_DEBIAN_VERSION"
mkdir -p "$out"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
log() { printf '[build-descheduler] %s\n' "$*" >&2; }

if ! { [ -x "$out/descheduler" ] && "$out/descheduler" version >/dev/null 2>&1; }; then
  log "building the descheduler v$DESCHEDULER_VERSION (first time only, a few minutes)"
  module=$(shared_module)
  (
    cd "$module"
    v=sigs.k8s.io/descheduler/pkg/version
    go build "${shared_build_flags[@]}" -ldflags "-s -w -X $v.version=v$DESCHEDULER_VERSION -X $v.buildDate=1970-01-01T00:00:00Z \
      -X $v.gitbranch=release-${DESCHEDULER_VERSION%.*} -X $v.gitsha1=v$DESCHEDULER_VERSION" \
      -o "$out/descheduler" sigs.k8s.io/descheduler/cmd/descheduler
  )
fi

if ! { [ -x "$out/prometheus" ] && [ -x "$out/promtool" ] && "$out/promtool" --version >/dev/null 2>&1; }; then
  log "extracting Prometheus $PROMETHEUS_DEBIAN_VERSION from Debian's package"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  (
    cd "$work"
    apt-get download "prometheus=$PROMETHEUS_DEBIAN_VERSION" >/dev/null 2>&1 || {
      apt-get update >/dev/null
      apt-get download "prometheus=$PROMETHEUS_DEBIAN_VERSION" >/dev/null
    }
    dpkg-deb -x prometheus_*.deb root
    install -m 0755 root/usr/bin/prometheus root/usr/bin/promtool "$out/"
  )
fi
"$out/descheduler" version >/dev/null 2>&1 || { log "ERROR: $out/descheduler does not run"; exit 1; }
"$out/promtool" --version >/dev/null 2>&1 || { log "ERROR: $out/promtool does not run"; exit 1; }
echo "$out"
