#!/usr/bin/env bash
# Installs everything nodemedic's tests, demo and benchmarks need on a fresh Debian bookworm
# machine (as root). Idempotent: every step checks first and does nothing when already done.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
log() { printf '[setup] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "ERROR: run as root (the lab creates network namespaces, bridges and nftables rules)"
  exit 1
fi

# Debian packages: the real fence agents and BMC emulators, netns/nftables tooling, protoc for
# the peer protocol, and what builds and runs the images without a container engine.
packages=(fence-agents ipmitool openipmi nftables iproute2 procps psmisc python3-venv protobuf-compiler curl openssl ca-certificates
  mmdebstrap umoci skopeo runc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust lint tools.
for component in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done

# The Redfish BMC emulator, in its own virtualenv.
venv="$cache/venv-sushy-tools-$SUSHY_TOOLS_VERSION"
if [ ! -x "$venv/bin/sushy-emulator" ]; then
  log "installing sushy-tools $SUSHY_TOOLS_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "sushy-tools==$SUSHY_TOOLS_VERSION"
fi

# The control plane (kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok).
bash "$here/build-controlplane.sh" >/dev/null

# Helm (for the chart) and the Prometheus operator CRDs (for the chart test).
bash "$here/build-tools.sh" >/dev/null

# The machine layer: Cluster API's core manager and CRDs, and the OpenShift Machine API CRDs.
bash "$here/build-machine-layer.sh" >/dev/null

# Rebalancing: the upstream descheduler, and Debian's Prometheus and promtool.
bash "$here/build-descheduler.sh" >/dev/null
log "ready"
