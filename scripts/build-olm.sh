#!/usr/bin/env bash
# Builds, once, what the lab that installs the bundle through OLM runs, into the tools folder
# scripts/build-tools.sh fills:
#   olm, catalog, opm, olm-crds/     OLM's two operators, opm and OLM's CRDs (scripts/olm, the versions
#                                    its go.mod pins)
# OLM's release is on Kubernetes' 0.34 libraries, so it keeps a module of its own (the other tools
# share the control plane's: scripts/go-module.sh); the most CPU of the later parts, for one test,
# so it builds last. Idempotent: rebuilt only when scripts/olm changes. Prints the tools directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"

cache=${NODEMEDIC_CACHE:-$HOME/.cache/nodemedic}
out="$cache/bin/tools-helm-v$HELM_VERSION-prometheus-operator-v$PROMETHEUS_OPERATOR_VERSION"
mkdir -p "$out"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
log() { printf '[build-olm] %s\n' "$*" >&2; }

# OLM, as its go.mod pins it; its CRDs come from the same module.
olm_src="$here/olm"
olm_sum=$(cat "$olm_src/tools.go" "$olm_src/go.mod" "$olm_src/go.sum" | sha256sum | cut -c1-16)
if [ "$(cat "$out/olm.sources" 2>/dev/null)" != "$olm_sum" ] || [ ! -x "$out/olm" ] || [ ! -x "$out/catalog" ] || [ ! -x "$out/opm" ]; then
  log "building OLM and opm ($(sed -n 's/^[[:space:]]*github.com\/operator-framework\/\(operator-[a-z-]*\) /\1 /p' "$olm_src/go.mod" | head -2 | paste -sd, -); first time only, several minutes)"
  (
    cd "$olm_src"
    export GOFLAGS=-mod=readonly
    # The tags opm's own release build uses: no gpgme (cgo), SQLite's JSON functions.
    # -s -w leave the debug information out, so the compiler need not produce it either.
    go build -trimpath -tags containers_image_openpgp,json1 -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$out/" \
      github.com/operator-framework/operator-lifecycle-manager/cmd/olm \
      github.com/operator-framework/operator-lifecycle-manager/cmd/catalog \
      github.com/operator-framework/operator-registry/cmd/opm
    olm_dir=$(go list -m -f '{{.Dir}}' github.com/operator-framework/operator-lifecycle-manager)
    rm -rf "$out/olm-crds" && mkdir -p "$out/olm-crds"
    install -m 0644 "$olm_dir"/deploy/chart/crds/*.crd.yaml "$out/olm-crds/"
  )
  echo "$olm_sum" >"$out/olm.sources"
fi

echo "$out"
