#!/usr/bin/env bash
# Fetches, once, the CRDs of the two machine layers nodemedic remediates through, into the cache
# outside the repo, through the Go module proxy:
#   Cluster API (cluster.x-k8s.io): Cluster, Machine, MachineSet, MachineDeployment, MachineHealthCheck
#   OpenShift Machine API (machine.openshift.io): Machine, MachineSet, MachineHealthCheck
# Idempotent: present files are kept. Prints the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/machine-crds-capi-v$CLUSTER_API_VERSION-openshift-api-$OPENSHIFT_API_VERSION"
mkdir -p "$out"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
log() { printf '[fetch-machine-crds] %s\n' "$*" >&2; }

module_dir() {
  (cd "$cache" && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

capi=(clusters machines machinesets machinedeployments machinehealthchecks)
openshift=(machines machinesets machinehealthchecks)
have_all() {
  local kind
  for kind in "${capi[@]}"; do [ -s "$out/cluster.x-k8s.io_$kind.yaml" ] || return 1; done
  for kind in "${openshift[@]}"; do [ -s "$out/machine.openshift.io_$kind.yaml" ] || return 1; done
}

if ! have_all; then
  log "fetching the Cluster API v$CLUSTER_API_VERSION and OpenShift Machine API CRDs through the Go module proxy"
  dir=$(module_dir "sigs.k8s.io/cluster-api@v$CLUSTER_API_VERSION")
  for kind in "${capi[@]}"; do
    install -m 0644 "$dir/core/config/crd/bases/cluster.x-k8s.io_$kind.yaml" "$out/cluster.x-k8s.io_$kind.yaml"
  done
  dir=$(module_dir "github.com/openshift/api@$OPENSHIFT_API_VERSION")
  for kind in "${openshift[@]}"; do
    # The Default feature set where the CRD has feature-gated variants: what a cluster without
    # tech-preview gates serves.
    manifests="$dir/machine/v1beta1/zz_generated.crd-manifests/0000_10_machine-api_01_$kind"
    if [ -f "$manifests-Default.crd.yaml" ]; then manifests="$manifests-Default"; fi
    install -m 0644 "$manifests.crd.yaml" "$out/machine.openshift.io_$kind.yaml"
  done
fi
echo "$out"
