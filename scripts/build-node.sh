#!/usr/bin/env bash
# Builds what a real lab node runs besides the kubelet (scripts/build-controlplane.sh builds that
# and kube-proxy), once, into a cache outside the repo:
#   containerd, containerd-shim-runc-v2, ctr   (github.com/containerd/containerd/v2)
#   bridge, host-local, loopback, portmap      (github.com/containernetworking/plugins)
#   pause.oci.tar, writer.oci.tar              the pod sandbox and the stateful workload's images,
#                                              from testing/lab/node-images (nothing can be pulled)
#   csi-registrar                              the lab CSI driver's registrar (testing/lab/node-images)
#   kube-network-policies-v<version>           NetworkPolicies on real nodes, for the labs that ask
#                                              (sigs.k8s.io/kube-network-policies, patched: see
#                                              testing/lab/node-patches)
# containerd, the registrar and kube-network-policies build in the control plane's Go module
# (scripts/go-module.sh), linking the Kubernetes libraries, gRPC and OpenTelemetry its build
# compiled; the CNI plugins (on a newer OpenTelemetry) and the images keep modules of their own.
# Idempotent: nothing is built when every binary answers and the images (and the patched
# kube-network-policies) match their sources.
# Prints the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"
# shellcheck source=go-module.sh
. "$here/go-module.sh"

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/node-containerd-v$CONTAINERD_VERSION-cni-v$CNI_PLUGINS_VERSION"
sources=$root/testing/lab/node-images
mkdir -p "$out"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
log() { printf '[build-node] %s\n' "$*" >&2; }

for tool in umoci skopeo runc; do
  command -v "$tool" >/dev/null || { log "ERROR: $tool is missing: run scripts/setup.sh packages"; exit 1; }
done

binaries=(containerd containerd-shim-runc-v2 ctr bridge host-local loopback portmap)
have_binaries() {
  local b
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
  "$out/containerd" --version >/dev/null 2>&1 && "$out/ctr" --version >/dev/null 2>&1
}

build_binaries() (
  log "building containerd v$CONTAINERD_VERSION and the CNI plugins v$CNI_PLUGINS_VERSION (first time only, ~2 min on 2 cores)"
  local c=github.com/containerd/containerd/v2 p=github.com/containernetworking/plugins/plugins module work
  local stamp="-s -w -X $c/version.Version=v$CONTAINERD_VERSION -X $c/version.Package=$c"
  module=$(shared_module)
  cd "$module"
  # No btrfs snapshotter (it needs cgo); the shim without its gRPC server (ttrpc only), as
  # containerd's own release build makes it.
  go build "${shared_build_flags[@]}" -tags no_btrfs -ldflags "$stamp" -o "$out/" "$c/cmd/containerd" "$c/cmd/ctr"
  go build "${shared_build_flags[@]}" -tags no_grpc -ldflags "$stamp" -o "$out/" "$c/cmd/containerd-shim-runc-v2"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  cd "$work"
  go mod init local/node >/dev/null 2>&1
  go get "github.com/containernetworking/plugins@v$CNI_PLUGINS_VERSION" >/dev/null
  go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$out/" \
    "$p/main/bridge" "$p/ipam/host-local" "$p/main/loopback" "$p/meta/portmap"
)

# An image of one static executable, named as the kubelet asks for it.
image() (
  local name=$1 reference=$2 program=$3
  local work; work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  (cd "$work" && go mod init "local/$name" >/dev/null 2>&1 && cp "$sources/$name/main.go" . &&
    go build -trimpath -ldflags "-s -w" -o "$work/$program" .)
  umoci init --layout "$work/layout"
  umoci new --image "$work/layout:latest"
  umoci unpack --image "$work/layout:latest" "$work/bundle" >/dev/null
  install -D -m 0755 "$work/$program" "$work/bundle/rootfs/$program"
  umoci repack --image "$work/layout:latest" "$work/bundle"
  umoci config --image "$work/layout:latest" --config.entrypoint "/$program" --config.user 0:0
  umoci gc --layout "$work/layout"
  skopeo copy --quiet "oci:$work/layout:latest" "oci-archive:$out/$name.oci.tar.partial:$reference"
  mv "$out/$name.oci.tar.partial" "$out/$name.oci.tar"
)

have_binaries || build_binaries
have_binaries || { log "ERROR: containerd or a CNI plugin did not build into $out"; exit 1; }
# The registrar, with the kubelet's own registration API (k8s.io/kubelet of the pinned release).
registrar() (
  local module; module=$(shared_module)
  mkdir -p "$module/csi-registrar"
  cp "$sources/csi-registrar/main.go" "$module/csi-registrar/"
  cd "$module"
  go build "${shared_build_flags[@]}" -ldflags "-s -w" -o "$out/csi-registrar" ./csi-registrar
)

# The images and the registrar follow their sources: a changed program is rebuilt.
digest=$(cat "$sources"/*/main.go | sha256sum | cut -c1-16)
if [ "$(cat "$out/sources.digest" 2>/dev/null)" != "$digest" ] || [ ! -x "$out/csi-registrar" ]; then
  log "building the pause and writer images and the CSI registrar"
  image pause lab.nodemedic.io/pause:1 pause
  image writer lab.nodemedic.io/writer:1 writer
  registrar
  echo "$digest" >"$out/sources.digest"
fi
# kube-network-policies with the lab's patch (scripts/go-module.sh applies it to the module's
# copy): this kernel has no nftables `queue` expression (CONFIG_NFT_QUEUE), so it queues through
# x_tables' NFQUEUE target (nft_compat); and it takes a kubeconfig (it runs as a node's process,
# not a pod).
network_policies() (
  local module; module=$(shared_module)
  cd "$module"
  go build "${shared_build_flags[@]}" -ldflags "-s -w" -o "$policies.partial" sigs.k8s.io/kube-network-policies/cmd
  mv "$policies.partial" "$policies"
)
patch=$root/testing/lab/node-patches/kube-network-policies.patch
policies=$out/kube-network-policies-v$KUBE_NETWORK_POLICIES_VERSION
patched=$(sha256sum <"$patch" | cut -c1-16)
if [ "$(cat "$policies.patch-digest" 2>/dev/null)" != "$patched" ] || [ ! -x "$policies" ]; then
  log "building kube-network-policies v$KUBE_NETWORK_POLICIES_VERSION (its version or patch changed; ~2 CPU-min)"
  network_policies
  echo "$patched" >"$policies.patch-digest"
fi
case $("$policies" --help 2>&1) in
  *-kubeconfig*) ;;
  *) log "ERROR: $policies does not run, or lacks the lab's patch"; exit 1 ;;
esac

"$out/containerd" --version >&2
echo "$out"
