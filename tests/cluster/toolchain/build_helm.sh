#!/usr/bin/env bash
# Builds the pinned helm v3 client that tests/cluster/test_chart.py runs, from source
# through the Go module proxy (`go install`, no release tarballs, no Docker).
#
# Output: ${KPW_CACHE:-$HOME/.cache/kube-pathways}/helm-v3.22.0/bin/helm
# Idempotent: a binary that is present and reports the pinned version is kept.
# Cold: about 3 minutes on 2 cores (~250 MB of modules in Go's module cache).
# helm v3.22.0 needs Go >= 1.26 (older Go fetches that toolchain itself when
# GOTOOLCHAIN allows it). `make helm` runs this.
set -euo pipefail

HELM_VERSION=v3.22.0
cache="${KPW_CACHE:-$HOME/.cache/kube-pathways}"
bin="$cache/helm-${HELM_VERSION}/bin"

log() { echo "[helm build $(date +%H:%M:%S)] $*"; }

is_good() {
  [ -x "$bin/helm" ] || return 1
  local out
  out="$("$bin/helm" version --template '{{.Version}}' 2>&1)" || return 1
  [ "$out" = "$HELM_VERSION" ]
}

if is_good; then
  log "helm: present ($bin/helm)"
  exit 0
fi

# shellcheck source=require_go.sh
. "$(cd "$(dirname "$0")" && pwd)/require_go.sh"
require_go "The chart tests build helm ${HELM_VERSION}" 1.26 helm
log "helm ${HELM_VERSION}: building with $(go version) (about 3 minutes cold)"
start=$SECONDS

# Install into a scratch dir next to the output, then move: an interrupted build never
# leaves a half-written binary that a later run would take as good.
mkdir -p "$cache"
scratch="$(mktemp -d "$cache/helm-build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
ldflags="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
GOBIN="$scratch" GOFLAGS="-buildvcs=false" \
  go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
mkdir -p "$bin"
mv -f "$scratch/helm" "$bin/helm"

if ! is_good; then
  echo "build_helm.sh: $bin/helm does not report version ${HELM_VERSION}:" >&2
  "$bin/helm" version >&2 || true
  exit 1
fi
log "helm: built in $((SECONDS - start)) s: $bin/helm"
