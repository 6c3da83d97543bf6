#!/usr/bin/env bash
# Regenerates the go.mod/go.sum of the two tools modules from upstream. Run only when
# bumping versions; build.sh uses the committed files and needs no regeneration.
#
# k8s.io/kubernetes is not meant to be required as a library: its go.mod points every
# staging module (k8s.io/api, k8s.io/client-go, ...) at ./staging/src/..., and those
# replace directives do not apply to a module that requires it. So the tools module
# replaces each staging module with its published v0.X.Y tag, taken from the
# `=> ./staging/src/k8s.io/X` lines of that exact kubernetes version's go.mod.
set -euo pipefail
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.6}"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v go >/dev/null || { echo "regenerate.sh: go not found; install Go >= 1.24" >&2; exit 1; }

modfile="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
cd "$here/kubernetes"
{
  echo "module kube-pathways.test/toolchain/kubernetes"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes ${K8S_VERSION}"
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/src/k8s.io/.*#\t\1 => \1 '"${STAGING_VERSION}"'#p' "$modfile"
  echo ")"
} > go.mod
rm -f go.sum
go mod tidy

cd "$here/etcd"
printf 'module kube-pathways.test/toolchain/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
rm -f go.sum
go mod tidy
echo "regenerate.sh: kubernetes ${K8S_VERSION} (staging ${STAGING_VERSION}), etcd ${ETCD_VERSION}: done"
