#!/usr/bin/env bash
# Builds the lab's control plane from upstream Go modules, once, into a cache outside the repo:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes)
#   kubelet, kube-proxy (what a real lab node runs; scripts/build-node.sh builds the rest)
#   etcd                                                              (go.etcd.io/etcd/server/v3)
#   kwok                                                              (sigs.k8s.io/kwok)
# Idempotent: nothing is built when every binary already answers --version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"
# shellcheck source=go-module.sh
. "$here/go-module.sh"

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/k8s-v$KUBERNETES_VERSION-etcd-v$ETCD_VERSION-kwok-v$KWOK_VERSION"
mkdir -p "$out"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

log() { printf '[build-controlplane] %s\n' "$*" >&2; }
have() {
  local flag=--version
  [ "$1" = kubectl ] && flag="version --client"
  # shellcheck disable=SC2086
  [ -x "$out/$1" ] && "$out/$1" $flag >/dev/null 2>&1
}

# One Go module builds all of them (scripts/go-module.sh), with the later tools: each shared library
# at one version, compiled once. Measured on 2 cores from an empty build cache: 733 CPU-seconds as
# three modules, 597 as one, 559 with GOGC=400, 481 without debug information; this build sits on
# a fresh CI run's critical path.
build_all() (
  if have kube-apiserver && have kube-controller-manager && have kube-scheduler && have kubectl \
    && have kubelet && have kube-proxy && have etcd && have kwok; then
    return
  fi
  log "building Kubernetes v$KUBERNETES_VERSION, etcd v$ETCD_VERSION and kwok v$KWOK_VERSION (first time only, ~4 min on 2 cores)"
  local module; module=$(shared_module)
  cd "$module"
  local v=k8s.io/component-base/version minor; minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
  local ldflags="-s -w -X $v.gitVersion=v$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor \
    -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z \
    -X k8s.io/client-go/pkg/version.gitVersion=v$KUBERNETES_VERSION \
    -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor \
    -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION"
  # -s -w leave debug information out of the binaries, so the compiler need not produce it
  # either (-dwarf=false): 481 CPU-seconds instead of 559, peak memory 1.7 GB instead of 2.1.
  # Go's panics and stack traces read the symbol table, which stays.
  # The kubelet and kube-proxy share most of the control plane's packages: about 46 CPU-seconds
  # more in this build.
  go build "${shared_build_flags[@]}" -ldflags "$ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
    sigs.k8s.io/kwok/cmd/kwok ./etcd
)

build_all
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok; do
  have "$b" || { log "ERROR: $out/$b did not build"; exit 1; }
done
"$out/kube-apiserver" --version >&2
echo "$out"
