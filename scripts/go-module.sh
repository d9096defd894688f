# Sourced by the scripts that build Go programs on Kubernetes' 1.36 libraries (the control plane,
# Helm, the OLM bundle validator, Cluster API's manager, the descheduler, and a real node's
# containerd, CSI registrar and kube-network-policies): one Go module requires all of them, so
# each library is resolved to one version and compiled once, into Go's build cache, by whichever
# build comes first; the others link what it compiled. Built as a module each,
# they compiled client-go, k8s.io/api and the rest up to five times over, the largest share of a
# CI run on empty caches (ci-20261206T164803Z: 2,370 CPU-seconds of Go builds).
#
# Needs versions.env sourced and $cache set. `shared_module` prints the module's folder, making it
# the first time (a few seconds: `go get` reads every requirement's go.mod). The folder's name
# follows versions.env, this file and the lab's kube-network-policies patch, so a new pin resolves
# a new module.
#
# Every build in it must use shared_build_flags: the compiler's flags are part of what Go's build
# cache keys a compiled package by (the linker's, -ldflags, are not).
shared_build_flags=(-trimpath -gcflags=all=-dwarf=false)

shared_module() {
  local key dir partial staging gomod m policies
  local scripts; scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  local patch=$scripts/../testing/lab/node-patches/kube-network-policies.patch
  key=$(cat "${BASH_SOURCE[0]}" "$scripts/versions.env" "$patch" | sha256sum | cut -c1-12)
  dir=$cache/go-modules/k8s-v$KUBERNETES_VERSION-$key
  if [ -f "$dir/go.sum" ]; then
    echo "$dir"
    return
  fi
  mkdir -p "$cache/go-modules"
  partial=$(mktemp -d "$cache/go-modules/.partial-XXXXXX")
  (
    # A failed step ends the subshell (also inside `$(shared_module)`, where bash clears -e), and
    # what it made is removed unless it became the module.
    set -e
    trap 'rm -rf "$partial"' EXIT
    cd "$partial"
    go mod init local/lab-tools >/dev/null 2>&1
    # etcd's server/v3 has local replace directives, so `go install` refuses it; its main is one
    # call.
    mkdir etcd
    cat >etcd/main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    # k8s.io/kubernetes maps its staging modules with local replace directives, which do not
    # propagate to a consumer. Mirror them with the published v0.<minor>.<patch> tags instead,
    # taking the list from the release's own go.mod so a new staging module is never missed.
    staging=v0.${KUBERNETES_VERSION#1.}
    go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" >/dev/null
    gomod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$KUBERNETES_VERSION.mod
    grep -oE '^\s+k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace "$m=$m@$staging"
    done
    # The descheduler requires a kube-openapi tag that does not exist and replaces it in its own
    # go.mod, which a consumer does not inherit: the one Kubernetes' release pins stands in.
    go mod edit -replace "k8s.io/kube-openapi=k8s.io/kube-openapi@$KUBE_OPENAPI_VERSION"
    # Cluster API replaces its own api module with ./api: the published one of the same release.
    go mod edit -replace "sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@v$CLUSTER_API_VERSION"
    # kube-network-policies with the lab's patch (testing/lab/node-patches), from a copy here.
    policies=sigs.k8s.io/kube-network-policies@v$KUBE_NETWORK_POLICIES_VERSION
    policies=$(go mod download -json "$policies" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    cp -r "$policies/." kube-network-policies
    chmod -R u+w kube-network-policies
    (cd kube-network-policies && git apply "$patch")
    go mod edit -replace sigs.k8s.io/kube-network-policies=./kube-network-policies
    go get "k8s.io/kubernetes@v$KUBERNETES_VERSION" "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" \
      "sigs.k8s.io/kwok@v$KWOK_VERSION" "helm.sh/helm/v3@v$HELM_VERSION" \
      "github.com/operator-framework/api@v$OPERATOR_FRAMEWORK_API_VERSION" \
      "sigs.k8s.io/cluster-api@v$CLUSTER_API_VERSION" "sigs.k8s.io/descheduler@v$DESCHEDULER_VERSION" \
      "github.com/containerd/containerd/v2@v$CONTAINERD_VERSION" \
      "sigs.k8s.io/kube-network-policies@v$KUBE_NETWORK_POLICIES_VERSION" >/dev/null 2>go-get.log ||
      { cat go-get.log >&2; exit 1; }
    rm go-get.log
    # Another build may have made it meanwhile: theirs stays.
    cd / && mv -T "$partial" "$dir" 2>/dev/null || true
  )
  [ -f "$dir/go.sum" ] || { printf 'resolving the Go module of the Kubernetes tools failed (see above)\n' >&2; return 1; }
  echo "$dir"
}
