#!/usr/bin/env bash
# Builds and fetches what the chart and its tests need, once, into the cache outside the repo:
#   helm                             (helm.sh/helm/v3, built from its Go module)
#   ServiceMonitor and PrometheusRule CRDs (github.com/prometheus-operator/prometheus-operator)
#   bundle-validate                  the Operator Framework's bundle validation (scripts/bundle-validate,
#                                    github.com/operator-framework/api as its go.mod pins it)
#   olm, catalog, opm, olm-crds/     OLM's two operators, opm and OLM's CRDs (scripts/olm, the versions
#                                    its go.mod pins), for the lab that installs the bundle through OLM
# Idempotent: present files are kept. Prints the tools directory.
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
log() { printf '[build-tools] %s\n' "$*" >&2; }

if ! { [ -x "$out/helm" ] && "$out/helm" version >/dev/null 2>&1; }; then
  log "building Helm v$HELM_VERSION (first time only, a few minutes)"
  # The version and default Kubernetes version Helm's own release build stamps in.
  k8s_minor=${KUBERNETES_VERSION#1.}; k8s_minor=${k8s_minor%%.*}
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  (cd "$cache" && GOBIN="$out" go install -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION")
fi

crds=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
have_crds() {
  local f
  for f in "${crds[@]}"; do [ -s "$out/$f" ] || return 1; done
}
if ! have_crds; then
  log "fetching the Prometheus operator v$PROMETHEUS_OPERATOR_VERSION CRDs through the Go module proxy"
  dir=$(cd "$cache" && go mod download -json "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  for f in "${crds[@]}"; do
    install -m 0644 "$dir/example/prometheus-operator-crd/$f" "$out/$f"
  done
fi

# Rebuilt when its sources (and so the pinned module) change.
validator_src="$here/bundle-validate"
validator_sum=$(cat "$validator_src/main.go" "$validator_src/go.mod" "$validator_src/go.sum" | sha256sum | cut -c1-16)
if [ "$(cat "$out/bundle-validate.sources" 2>/dev/null)" != "$validator_sum" ] || [ ! -x "$out/bundle-validate" ]; then
  log "building the OLM bundle validator ($(sed -n 's/^require github.com\/operator-framework\/api //p' "$validator_src/go.mod"); first time only, a few minutes)"
  (cd "$validator_src" && GOFLAGS=-mod=readonly go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$out/bundle-validate" .)
  echo "$validator_sum" >"$out/bundle-validate.sources"
fi

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

"$out/helm" version --short >&2
echo "$out"
