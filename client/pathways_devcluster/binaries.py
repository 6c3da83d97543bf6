"""Where the control plane's binaries and helm are, and what to do when they are not there.

``make controlplane`` (``tests/cluster/toolchain/build.sh``) builds etcd and the
Kubernetes control plane from source through the Go module proxy into a cache outside
the repository (``KPW_CACHE``, default ``~/.cache/kube-pathways``); ``find_binaries``
finds them there, or raises ``MissingBinariesError`` saying how to build them, so the
cluster tier and ``make dev-cluster`` fail with instructions instead of skipping.
``make helm`` builds the helm version that ``build_helm.sh`` pins; ``find_helm`` finds it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pathways_devcluster.components import ControlPlaneError

K8S_VERSION = "v1.34.4"
ETCD_VERSION = "3.6.6"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "cluster" / "toolchain" / "build.sh"
BUILD_HELM = REPO_ROOT / "tests" / "cluster" / "toolchain" / "build_helm.sh"


class MissingBinariesError(ControlPlaneError):
    """The control-plane binaries have not been built."""


def cache_dir() -> Path:
    return Path(os.environ.get("KPW_CACHE", str(Path.home() / ".cache" / "kube-pathways")))


def binaries_dir() -> Path:
    return cache_dir() / f"k8s-{K8S_VERSION}" / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Paths of the four binaries; raises ``MissingBinariesError`` saying how to build them."""
    bin_dir = bin_dir or binaries_dir()
    found = {name: bin_dir / name for name in COMPONENTS}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    if missing:
        go = shutil.which("go") or (
            "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
        )
        go_note = (
            f"Go found at {go}."
            if go
            else "Go is not installed: install Go >= 1.24 (https://go.dev/dl/) first."
        )
        raise MissingBinariesError(
            f"the cluster test tier needs etcd {ETCD_VERSION} and Kubernetes {K8S_VERSION} "
            f"control-plane binaries in {bin_dir}; missing: {', '.join(missing)}. "
            f"Build them once with `make controlplane` (runs {BUILD_SCRIPT.relative_to(REPO_ROOT)}; "
            f"~8 minutes cold, cached outside the repository; KPW_CACHE moves the cache). "
            f"{go_note}"
        )
    return found


def pinned_helm_version() -> str:
    """The helm version ``make helm`` builds (``HELM_VERSION=`` in ``build_helm.sh``)."""
    match = re.search(r"^HELM_VERSION=(v[0-9.]+)$", BUILD_HELM.read_text(), re.M)
    if match is None:
        raise ControlPlaneError(f"{BUILD_HELM} pins no HELM_VERSION=v<major>.<minor>.<patch>")
    return match.group(1)


def find_helm() -> Path:
    """The pinned helm binary; raises ``MissingBinariesError`` saying how to build it."""
    version = pinned_helm_version()
    binary = cache_dir() / f"helm-{version}" / "bin" / "helm"
    if not os.access(binary, os.X_OK):
        raise MissingBinariesError(
            f"helm {version} is not at {binary}: build it once with `make helm` (runs "
            f"{BUILD_HELM.relative_to(REPO_ROOT)}: `go install helm.sh/helm/v3/cmd/helm@{version}` "
            "through the Go module proxy, ~3 minutes cold; needs Go >= 1.26)"
        )
    return binary
