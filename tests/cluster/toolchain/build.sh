#!/usr/bin/env bash
# Builds the real control plane that tests/cluster runs against: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, from source through the Go module proxy
# (no Docker, no kind, no downloads of release tarballs).
#
# Output: ${KPW_CACHE:-$HOME/.cache/kube-pathways}/k8s-v1.34.4/bin/<name>
# Idempotent: a binary that is present and reports the pinned version is kept.
# Cold: ~8 minutes on 2 cores, ~0.7 GB of modules, ~2 GB of Go build cache (both in
# Go's default locations, outside the repository). `make controlplane` runs this.
set -euo pipefail

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.6
here="$(cd "$(dirname "$0")" && pwd)"
cache="${KPW_CACHE:-$HOME/.cache/kube-pathways}"
bin="$cache/k8s-${K8S_VERSION}/bin"

log() { echo "[controlplane build $(date +%H:%M:%S)] $*"; }

# shellcheck source=require_go.sh
. "$here/require_go.sh"
require_go "The cluster test tier builds etcd and Kubernetes ${K8S_VERSION}" 1.24 controlplane
log "using $(go version)"

# A binary is good when it runs and reports the pinned version.
is_good() {  # name expected-version-substring
  local path="$bin/$1"
  [ -x "$path" ] || return 1
  local out
  out="$("$path" --version 2>&1)" || return 1
  case "$out" in *"$2"*) return 0 ;; *) return 1 ;; esac
}

mkdir -p "$bin"
export GOFLAGS="-buildvcs=false -mod=readonly"

k8s_missing=()
for name in kube-apiserver kube-controller-manager kube-scheduler; do
  if is_good "$name" "$K8S_VERSION"; then
    log "$name: present ($bin/$name)"
  else
    k8s_missing+=("$name")
  fi
done
etcd_missing=0
if is_good etcd "${ETCD_VERSION#v}"; then
  log "etcd: present ($bin/etcd)"
else
  etcd_missing=1
fi

# Build into a scratch dir next to the output, then move: an interrupted build never
# leaves a half-written binary that a later run would take as good.
scratch="$(mktemp -d "$cache/build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

if [ "$etcd_missing" = 1 ]; then
  log "etcd ${ETCD_VERSION}: building (about 1 minute cold)"
  start=$SECONDS
  (cd "$here/etcd" && go build -trimpath -o "$scratch/etcd" go.etcd.io/etcd/server/v3)
  mv -f "$scratch/etcd" "$bin/etcd"
  log "etcd: built in $((SECONDS - start)) s"
fi

if [ "${#k8s_missing[@]}" -gt 0 ]; then
  log "${k8s_missing[*]} ${K8S_VERSION}: building (about 8 minutes cold on 2 cores)"
  start=$SECONDS
  ldflags="-X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  pkgs=()
  for name in "${k8s_missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  (cd "$here/kubernetes" && go build -trimpath -ldflags "$ldflags" -o "$scratch/" "${pkgs[@]}")
  for name in "${k8s_missing[@]}"; do mv -f "$scratch/$name" "$bin/$name"; done
  log "${k8s_missing[*]}: built in $((SECONDS - start)) s"
fi

for pair in "etcd:${ETCD_VERSION#v}" "kube-apiserver:$K8S_VERSION" \
            "kube-controller-manager:$K8S_VERSION" "kube-scheduler:$K8S_VERSION"; do
  name="${pair%%:*}"
  if ! is_good "$name" "${pair#*:}"; then
    echo "build.sh: $bin/$name does not report version ${pair#*:}:" >&2
    "$bin/$name" --version >&2 || true
    exit 1
  fi
done
log "ready: $bin"
