#!/usr/bin/env bash
# Renders the chart into plain manifests for people without Helm (default: deploy/nodemedic.yaml)
# and copies the generated CRDs into the chart. CI fails when the committed files drift.
#   usage: render-manifests.sh [output file]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
. "$root/scripts/versions.env"
out=${1:-$root/deploy/nodemedic.yaml}
tools=$(bash "$root/scripts/build-tools.sh" 2>/dev/null)
{
  cat <<'HEADER'
# Rendered from charts/nodemedic with its default values (make manifests); do not edit.
#   kubectl apply --server-side -f deploy/crds/ && kubectl apply -f deploy/nodemedic.yaml
apiVersion: v1
kind: Namespace
metadata:
  name: workload-availability
---
HEADER
  "$tools/helm" template nodemedic "$root/charts/nodemedic" --namespace workload-availability \
    --kube-version "$KUBERNETES_VERSION"
} > "$out"
