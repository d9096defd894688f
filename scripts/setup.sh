#!/usr/bin/env bash
# Installs everything nodemedic's tests, demo and benchmarks need on a fresh Debian bookworm
# machine (as root). Idempotent: every step checks first and does nothing when already done.
#
# Usage: setup.sh [all|packages|lab|later|PART]   (default: all, in that order)
#   packages  Debian packages and Rust lint tools: what building the workspace needs
#   lab       the Redfish BMC emulator, the control plane and the machine layers' CRDs: what every
#             lab test needs
#   later     what only some tests need, its parts in this order:
#     chart-tools    Helm, the Prometheus operator's CRDs and the OLM bundle validator
#     node           what real lab nodes run besides the kubelet (containerd, the CNI plugins, two
#                    images, kube-network-policies)
#     machine-layer  Cluster API's manager
#     descheduler    the upstream descheduler, Prometheus and promtool
#     olm            OLM's two operators and opm
# The test driver runs the phases apart, so that the Go builds overlap the Rust build and the
# lab tests, each test waiting only for the part it needs (scripts/test.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
log() { printf '[setup] %s\n' "$*" >&2; }
# Runs a build script and says what it cost (near nothing once its cache holds the result): with
# every cache empty the Go builds are most of a CI run's work, and these lines say which.
build() {
  local TIMEFORMAT="[setup] $1: %0R s, %0U+%0S CPU-seconds"
  time bash "$here/$1" >/dev/null
}

if [ "$(id -u)" != 0 ]; then
  log "ERROR: run as root (the lab creates network namespaces, bridges and nftables rules)"
  exit 1
fi

# Debian packages: the real fence agents and BMC emulators, netns/nftables tooling, protoc for
# the peer protocol, and what builds and runs the images without a container engine. Then the
# Rust lint tools.
packages() {
  local wanted=(fence-agents ipmitool openipmi nftables iproute2 procps psmisc python3-venv protobuf-compiler curl
    openssl ca-certificates mmdebstrap umoci skopeo runc iptables)
  local missing=() p component
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
  done
}

# The Redfish BMC emulator and the EC2 emulator (moto), each in its own virtualenv, the control
# plane (kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok) and the machine layers'
# CRDs (downloads only: the tests that install them need nothing else of the later parts).
lab() {
  local venv="$cache/venv-sushy-tools-$SUSHY_TOOLS_VERSION" sushy=""
  local moto_venv="$cache/venv-moto-$MOTO_VERSION" moto=""
  if [ ! -x "$venv/bin/sushy-emulator" ]; then
    log "installing sushy-tools $SUSHY_TOOLS_VERSION into $venv"
    # Mostly downloads: it runs beside the control plane's build instead of before it.
    { python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --disable-pip-version-check "sushy-tools==$SUSHY_TOOLS_VERSION"; } &
    sushy=$!
  fi
  if [ ! -x "$moto_venv/bin/moto_proxy" ]; then
    log "installing moto $MOTO_VERSION into $moto_venv"
    { python3 -m venv "$moto_venv" &&
      "$moto_venv/bin/pip" install -q --disable-pip-version-check "moto[ec2,proxy]==$MOTO_VERSION"; } &
    moto=$!
  fi
  bash "$here/build-machine-layer.sh" --crds-only >/dev/null &
  local crds=$!
  build build-controlplane.sh
  if ! wait "$crds"; then
    log "ERROR: fetching the machine layers' CRDs failed (see above)"
    exit 1
  fi
  if [ -n "$sushy" ] && ! wait "$sushy"; then
    log "ERROR: installing sushy-tools into $venv failed (see above); remove $venv and run again"
    exit 1
  fi
  if [ -n "$moto" ] && ! wait "$moto"; then
    log "ERROR: installing moto into $moto_venv failed (see above); remove $moto_venv and run again"
    exit 1
  fi
}

# The later parts, cheapest first among those most tests wait for: the chart's tools and the
# machine layer and descheduler share the control plane's compiled libraries (scripts/go-module.sh),
# real nodes' parts build their own, and OLM (one test) builds the most.
later_parts=(chart-tools node machine-layer descheduler olm)
part() {
  case "$1" in
    chart-tools) build build-tools.sh ;;
    node) build build-node.sh ;;
    machine-layer) build build-machine-layer.sh ;;
    descheduler) build build-descheduler.sh ;;
    olm) build build-olm.sh ;;
  esac
}
later() {
  local p
  for p in "${later_parts[@]}"; do part "$p"; done
}

phase=${1:-all}
case "$phase" in
  all) packages; lab; later ;;
  packages | lab | later) "$phase" ;;
  chart-tools | node | machine-layer | descheduler | olm) part "$phase" ;;
  *) log "ERROR: unknown phase '$phase': use all, packages, lab, later or one of later's parts (${later_parts[*]})"; exit 2 ;;
esac
log "ready ($phase)"
