#!/usr/bin/env bash
# Builds nodemedic's two OCI images without a container engine, from Debian packages and the
# release binaries and the agent's size-optimised build (`make image` builds those first):
#   nodemedic-controller  Debian bookworm (essential) + the ClusterLabs fence agents + ipmitool +
#                         CA certificates, and nodemedic, nodemedic-controller on top
#   nodemedic-agent       the agent executable and the shared libraries it loads, nothing else
# Output: target/images/<image>-<version>.oci.tar (OCI image layout archives, gzip layers), and
# target/images/sizes.json, which `make bench` reports against the size goals. The Debian base
# is cached outside the repo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}/images
target=${CARGO_TARGET_DIR:-$root/target}
# The tests build them from the debug executables they test, into a folder of their own.
out=${NODEMEDIC_IMAGE_OUT:-$target/images}
bins=${NODEMEDIC_IMAGE_BINARIES:-$target/release}
# The agent ships built for size (cargo profile `agent`, which `make image` builds: every node
# runs one); the tests pass their debug executables in NODEMEDIC_IMAGE_BINARIES and get those.
if [ -n "${NODEMEDIC_IMAGE_BINARIES:-}" ]; then
  agent_exe=$bins/nodemedic-agent
else
  agent_exe=$target/agent/nodemedic-agent
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
registry=${NODEMEDIC_IMAGE_REGISTRY:-ghcr.io/nodemedic}
log() { printf '[build-images] %s\n' "$*" >&2; }

for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null || { log "ERROR: $tool is missing: run scripts/setup.sh"; exit 1; }
done
for exe in nodemedic nodemedic-controller; do
  [ -x "$bins/$exe" ] || { log "ERROR: $bins/$exe is missing: cargo build --release -p nodemedic --bins"; exit 1; }
done
[ -x "$agent_exe" ] || { log "ERROR: $agent_exe is missing: cargo build --profile agent -p nodemedic --bin nodemedic-agent"; exit 1; }
mkdir -p "$cache" "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The controller's base: what the power fence agents need to run, without documentation.
#   snmp                     the SNMP PDU agents (fence_apc_snmp, fence_eaton_snmp, ...) run snmpget/set
#   openssh-client, telnet   the agents that log in to a BMC or switch over ssh or telnet
#   python3-kubernetes, python3-openshift   fence_kubevirt
#   python3-azure            fence_azure_arm (identity, compute and network only, see below)
#   (fence_aws's boto3 and fence_gce's Google API client are the fence-agents package's own
#   dependencies)
# The cloud SDKs' API models are most of the size: only those the cloud agents use are kept (EC2
# for fence_aws; Azure's identity, compute and network clients, and the API profiles they pick
# versions by, for fence_azure_arm).
# kmod: the agent image's modprobe, taken from this base (see below).
packages=fence-agents,ipmitool,ca-certificates,kmod,snmp,openssh-client,telnet,python3-kubernetes,python3-openshift,python3-azure
azure=/usr/lib/python3/dist-packages/azure
excludes=(
  '/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*'
  '/usr/lib/python3/dist-packages/botocore/data/*'
)
includes=(
  # dpkg's `*` crosses `/`: the top-level files by name.
  '/usr/lib/python3/dist-packages/botocore/data/_retry.json'
  '/usr/lib/python3/dist-packages/botocore/data/endpoints.json'
  '/usr/lib/python3/dist-packages/botocore/data/partitions.json'
  '/usr/lib/python3/dist-packages/botocore/data/sdk-default-configuration.json'
  '/usr/lib/python3/dist-packages/botocore/data/ec2/*'
)
# Azure's SDK is one package of 540 MB; its postinst byte-compiles every module, so the unused
# ones go after the installation (a dpkg path-exclude would fail that step).
keep_azure='__init__.py common core identity mgmt profiles'
keep_azure_mgmt='__init__.py core compute network'
prune_azure="cd \"\$1$azure\" && for d in *; do case \" $keep_azure \" in *\" \$d \"*) ;; *) rm -rf \"\$d\" ;; esac; done && cd mgmt && for d in *; do case \" $keep_azure_mgmt \" in *\" \$d \"*) ;; *) rm -rf \"\$d\" ;; esac; done"
# The agents that do not fence by power (nodemedic_api::fence_agents::NOT_BY_POWER, which the
# CRDs refuse): not offered at all.
not_by_power=(fence_sbd fence_scsi fence_mpath fence_sanlock fence_kdump fence_compute fence_evacuate
  fence_brocade fence_cisco_mds fence_sanbox2 fence_ifmib fence_ack_manual fence_crosslink
  fence_heuristics_ping fence_dummy)
spec="bookworm $packages ${excludes[*]} ${includes[*]} $keep_azure / $keep_azure_mgmt"
base=$cache/controller-base-$(printf '%s' "$spec" | sha256sum | cut -c1-16).tar
if [ ! -s "$base" ]; then
  log "building the controller's Debian base ($packages; first time only, about a minute)"
  opts=()
  for p in "${excludes[@]}"; do opts+=(--dpkgopt="path-exclude=$p"); done
  for p in "${includes[@]}"; do opts+=(--dpkgopt="path-include=$p"); done
  mmdebstrap --quiet --variant=essential --format=tar --include="$packages" \
    --aptopt='APT::Install-Recommends "false"' "${opts[@]}" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    --customize-hook="$prune_azure" \
    bookworm "$base.partial"
  mv "$base.partial" "$base"
fi

# An image from a root filesystem directory: one layer, the entrypoint, an unprivileged user
# (the agent DaemonSet overrides it: it opens the watchdog device).
image() {
  local name=$1 rootfs=$2 entrypoint=$3 user=$4
  local layout=$work/$name-layout bundle=$work/$name-bundle
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci unpack --image "$layout:$version" "$bundle" >/dev/null
  cp -a "$rootfs/." "$bundle/rootfs/"
  umoci repack --image "$layout:$version" "$bundle"
  umoci config --image "$layout:$version" \
    --config.entrypoint "$entrypoint" --config.user "$user" \
    --config.env "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.source=https://github.com/nodemedic/nodemedic"
  umoci gc --layout "$layout"
  rm -f "$out/$name-$version.oci.tar"
  skopeo copy --quiet "oci:$layout:$version" "oci-archive:$out/$name-$version.oci.tar:$registry/$name:$version"
  log "$out/$name-$version.oci.tar ($(du -m "$out/$name-$version.oci.tar" | cut -f1) MiB)"
}

controller=$work/controller-rootfs
mkdir -p "$controller"
tar -xf "$base" -C "$controller"
for agent in "${not_by_power[@]}"; do rm -f "$controller/usr/sbin/$agent"; done
install -D -m 0755 -s "$bins/nodemedic" "$controller/usr/local/bin/nodemedic"
install -D -m 0755 -s "$bins/nodemedic-controller" "$controller/usr/local/bin/nodemedic-controller"
ln -sf nodemedic "$controller/usr/local/bin/kubectl-nodemedic"
image nodemedic-controller "$controller" /usr/local/bin/nodemedic-controller 65532:65532

# The agent: its executable and exactly the libraries the dynamic loader resolves for it.
agent=$work/agent-rootfs
install -D -m 0755 -s "$agent_exe" "$agent/usr/local/bin/nodemedic-agent"
ldd "$agent_exe" | grep -oE '/[^ ]+' | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$agent$lib"
done
# Its modprobe, as medik8s's agent has one: on a node without a watchdog device the agent loads
# softdog (from the node's /lib/modules, which the DaemonSet mounts). kmod and the libraries it
# needs come from the controller's Debian base, resolved there.
install -D -m 0755 "$controller/usr/bin/kmod" "$agent/usr/bin/kmod"
mkdir -p "$agent/usr/sbin"
ln -sf ../bin/kmod "$agent/usr/sbin/modprobe"
chroot "$controller" /usr/bin/ldd /usr/bin/kmod | grep -oE '/[^ ]+' | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$controller$lib")" "$agent$lib"
done
mkdir -p "$agent/tmp" "$agent/etc"
echo 'root:x:0:0:root:/:/usr/local/bin/nodemedic-agent' > "$agent/etc/passwd"
image nodemedic-agent "$agent" /usr/local/bin/nodemedic-agent 0:0

python3 - "$out" "$version" <<'PY'
import json, os, sys, tarfile
out, version = sys.argv[1], sys.argv[2]
sizes = {}
for name in ("nodemedic-controller", "nodemedic-agent"):
    archive = os.path.join(out, f"{name}-{version}.oci.tar")
    with tarfile.open(archive) as t:
        layers = [m for m in t.getmembers() if m.isfile() and m.size > 0]
        unpacked = 0
        for m in layers:
            f = t.extractfile(m)
            try:
                with tarfile.open(fileobj=f, mode="r:*") as layer:
                    unpacked += sum(x.size for x in layer.getmembers() if x.isfile())
            except tarfile.TarError:
                pass  # the index, manifest and config are JSON, not layers
    sizes[name] = {"archive_bytes": os.path.getsize(archive), "unpacked_bytes": unpacked}
with open(os.path.join(out, "sizes.json"), "w") as f:
    json.dump(sizes, f, indent=2)
print(json.dumps(sizes))
PY
