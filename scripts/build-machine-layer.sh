#!/usr/bin/env bash
# Builds, once, the machine layer the lab runs for the machine remediation tests, into the cache
# outside the repo:
#   cluster-api-manager  Cluster API's core controllers (sigs.k8s.io/cluster-api, package core):
#                        Cluster, Machine, MachineSet, MachineDeployment, MachineHealthCheck
#   crds/                every CRD that manager serves (core/config/crd/bases), OpenShift's
#                        Machine API CRDs (github.com/openshift/api, machine/v1beta1), whose
#                        controller the lab plays itself (none can be had here), and OpenShift's
#                        ClusterVersion and MachineConfigPool CRDs (upgrade signals)
# The manager builds in the control plane's Go module (scripts/go-module.sh), linking the
# Kubernetes libraries its build compiled.
# Usage: build-machine-layer.sh [--crds-only]   (--crds-only: the CRDs, downloads only, as
# `scripts/setup.sh lab` fetches them for the tests that install them without the manager)
# Idempotent: a manager that runs (--help) and present CRDs are kept. Prints the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"
# shellcheck source=go-module.sh
. "$here/go-module.sh"
case "${1:-}" in
  "") crds_only=false ;;
  --crds-only) crds_only=true ;;
  *) echo "usage: build-machine-layer.sh [--crds-only]" >&2; exit 2 ;;
esac

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/machine-layer-capi-v$CLUSTER_API_VERSION-openshift-api-$OPENSHIFT_API_VERSION"
mkdir -p "$out/crds"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
log() { printf '[build-machine-layer] %s\n' "$*" >&2; }

module_dir() {
  (cd "$cache" && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

capi=$(module_dir "sigs.k8s.io/cluster-api@v$CLUSTER_API_VERSION")
for crd in "$capi"/core/config/crd/bases/*.yaml; do
  [ -s "$out/crds/$(basename "$crd")" ] || install -m 0644 "$crd" "$out/crds/"
done
openshift=(machines machinesets machinehealthchecks)
missing=0
for kind in "${openshift[@]}"; do [ -s "$out/crds/machine.openshift.io_$kind.yaml" ] || missing=1; done
if [ "$missing" = 1 ]; then
  log "fetching the OpenShift Machine API CRDs through the Go module proxy"
  dir=$(module_dir "github.com/openshift/api@$OPENSHIFT_API_VERSION")
  for kind in "${openshift[@]}"; do
    # The Default feature set where the CRD has feature-gated variants: what a cluster without
    # tech-preview gates serves.
    manifests="$dir/machine/v1beta1/zz_generated.crd-manifests/0000_10_machine-api_01_$kind"
    if [ -f "$manifests-Default.crd.yaml" ]; then manifests="$manifests-Default"; fi
    install -m 0644 "$manifests.crd.yaml" "$out/crds/machine.openshift.io_$kind.yaml"
  done
fi
# OpenShift's upgrade signals the health check watches (a ClusterVersion progressing, a
# MachineConfigPool updating); no OpenShift controller runs: the tests write their status.
upgrades=(
  "config/v1/zz_generated.crd-manifests/0000_00_cluster-version-operator_01_clusterversions-Default.crd.yaml:config.openshift.io_clusterversions.yaml"
  "machineconfiguration/v1/zz_generated.crd-manifests/0000_80_machine-config_01_machineconfigpools.crd.yaml:machineconfiguration.openshift.io_machineconfigpools.yaml"
)
for entry in "${upgrades[@]}"; do
  if [ ! -s "$out/crds/${entry#*:}" ]; then
    log "fetching OpenShift's ${entry#*:} through the Go module proxy"
    dir=$(module_dir "github.com/openshift/api@$OPENSHIFT_API_VERSION")
    install -m 0644 "$dir/${entry%%:*}" "$out/crds/${entry#*:}"
  fi
done
if [ "$crds_only" = true ]; then
  echo "$out"
  exit 0
fi
if ! { [ -x "$out/cluster-api-manager" ] && "$out/cluster-api-manager" --help >/dev/null 2>&1; }; then
  log "building the Cluster API v$CLUSTER_API_VERSION core manager (first time only, a few minutes)"
  module=$(shared_module)
  (
    cd "$module"
    v=sigs.k8s.io/cluster-api/version
    go build "${shared_build_flags[@]}" -ldflags "-s -w -X $v.gitVersion=v$CLUSTER_API_VERSION -X $v.gitMajor=1 \
      -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z" \
      -o "$out/cluster-api-manager" sigs.k8s.io/cluster-api/core
  )
fi

"$out/cluster-api-manager" --help >/dev/null 2>&1 || { log "ERROR: $out/cluster-api-manager does not run"; exit 1; }
echo "$out"
