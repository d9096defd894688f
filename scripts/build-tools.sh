#!/usr/bin/env bash
# Builds and fetches what the chart and its tests need, once, into the cache outside the repo:
#   helm                             (helm.sh/helm/v3)
#   ServiceMonitor and PrometheusRule CRDs (github.com/prometheus-operator/prometheus-operator)
#   bundle-validate                  the Operator Framework's bundle validation (scripts/bundle-validate,
#                                    on github.com/operator-framework/api)
# Helm and the validator build in the control plane's Go module (scripts/go-module.sh): they link
# the Kubernetes libraries its build compiled. scripts/build-olm.sh adds OLM to the same folder.
# Idempotent: present files are kept. Prints the tools directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
# shellcheck source=go-env.sh
. "$here/go-env.sh"
# shellcheck source=go-module.sh
. "$here/go-module.sh"

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
  module=$(shared_module)
  (cd "$module" && go build "${shared_build_flags[@]}" -ldflags "$ldflags" -o "$out/helm" helm.sh/helm/v3/cmd/helm)
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

# Rebuilt when its source or the API module's version changes.
validator_src="$here/bundle-validate/main.go"
validator_sum=$( (cat "$validator_src"; echo "$OPERATOR_FRAMEWORK_API_VERSION") | sha256sum | cut -c1-16)
if [ "$(cat "$out/bundle-validate.sources" 2>/dev/null)" != "$validator_sum" ] || [ ! -x "$out/bundle-validate" ]; then
  log "building the OLM bundle validator (github.com/operator-framework/api v$OPERATOR_FRAMEWORK_API_VERSION)"
  module=$(shared_module)
  mkdir -p "$module/bundle-validate"
  cp "$validator_src" "$module/bundle-validate/main.go"
  (cd "$module" && go build "${shared_build_flags[@]}" -ldflags "-s -w" -o "$out/bundle-validate" ./bundle-validate)
  echo "$validator_sum" >"$out/bundle-validate.sources"
fi

"$out/helm" version --short >&2
echo "$out"
