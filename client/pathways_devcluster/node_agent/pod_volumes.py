"""Pod volumes for containers that are plain local processes.

The node agent, a stand-in for the kubelet and not a kubelet, materializes each
volume of a pod as a directory of its own:
``emptyDir`` (under ``/dev/shm``, see ``shm_root``, when ``medium: Memory``, so shared-memory transport between
a pod's containers behaves as on a node), ``secret``, ``configMap``, ``downwardAPI`` and
``projected`` (including the bound ``serviceAccountToken`` that every pod gets through the
ServiceAccount admission plugin, so in-cluster clients authenticate for real) are written
file by file; ``hostPath`` is the host path itself.

Processes share the host's filesystem, so each container must still be made to see its
``volumeMounts`` at their ``mountPath``. Two ways, picked once per agent by
``detect_mount_mode`` (``KPW_NODE_AGENT_MOUNTS=namespace|rewrite`` forces one):

``namespace`` (used when this process may create mount namespaces, i.e. as root -- it
works in the sandbox these tests were written in): each container starts as
``unshare --mount --propagation private`` + a bind mount of every volume onto its
mountPath (read-only when asked), then ``exec``\\s the command. The container sees the real
paths (``/var/run/secrets/kubernetes.io/serviceaccount/token`` included); nothing leaks
to the host except empty mount-point directories, which the agent removes on exit.

``rewrite`` (fallback, unprivileged): no mounts. Each mount is exported as
``KPW_MOUNT_<MOUNTPATH>`` (upper-cased, non-alphanumerics as ``_``) and every env value
or argument that equals or begins with a mountPath is rewritten to the materialized
directory. Code that builds paths at run time must use the env var in this mode.

The image of every container is the host itself: the checkout and this interpreter's
installation (the *image paths* the agent passes in). A real image's files lie outside
any volume, but here where they lie is an accident of where the checkout is, so a volume
on an ancestor of an image path (the chart's emptyDir on ``/tmp`` while the checkout is
under ``/tmp``) must not hide it: rewriting leaves paths inside such an image path alone,
and in a namespace the image path is first bound into the volume's directory, which is
then bound recursively onto its mountPath so that it shows through. A volume at or below
an image path still hides what it covers, as in Kubernetes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pathways_devcluster.node_agent.pod_env import (
    ContainerConfigError,
    ObjectSource,
    Pod,
    PodNetwork,
    TokenRequest,
    configmap_data,
    decoded_secret_data,
    field_ref,
)

MountMode = Literal["namespace", "rewrite"]

_SHM = Path("/dev/shm")


def shm_root(pod_subnet: str) -> Path:
    """Where an agent keeps ``medium: Memory`` emptyDirs: ``/dev/shm/kpw-<pod subnet>``.

    The subnet is the agent's own while it runs (``ip_pool``), so whoever stops or
    kills an agent, or claims its subnet next, may remove what an agent left there.
    """
    return _SHM / f"kpw-{pod_subnet}"


def detect_mount_mode(scratch: Path) -> MountMode:
    """``namespace`` when a private mount namespace with a bind mount works here."""
    forced = os.environ.get("KPW_NODE_AGENT_MOUNTS")
    if forced in ("namespace", "rewrite"):
        return forced  # type: ignore[return-value]
    if shutil.which("unshare") is None:
        return "rewrite"
    scratch.mkdir(parents=True, exist_ok=True)
    probe = Path(tempfile.mkdtemp(prefix="mount-probe-", dir=scratch))
    try:
        (probe / "src").mkdir()
        (probe / "dst").mkdir()
        (probe / "src" / "marker").write_text("ok")
        result = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                'mount --bind "$0/src" "$0/dst" && test -f "$0/dst/marker"',
                str(probe),
            ],  # fmt: skip
            capture_output=True,
            timeout=10,
            check=False,
        )
        ok = result.returncode == 0 and not (probe / "dst" / "marker").exists()
        return "namespace" if ok else "rewrite"
    except (OSError, subprocess.SubprocessError):
        return "rewrite"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def mount_env_name(mount_path: str) -> str:
    return "KPW_MOUNT_" + re.sub(r"[^A-Za-z0-9]+", "_", mount_path).strip("_").upper()


@dataclass(frozen=True)
class Mount:
    """One volumeMount of one container, resolved to a host path.

    ``recursive`` binds carry the mounts below ``source`` along: a volume that an image
    path shows through, and the image path's own bind (see ``mount_order``).
    """

    source: Path
    target: str
    read_only: bool
    recursive: bool = False

    @property
    def bind_flags(self) -> str:
        """How the namespace wrapper binds it: ``bind`` or ``rbind``, ``,ro`` when read-only."""
        return ("rbind" if self.recursive else "bind") + (",ro" if self.read_only else "")


def _write_file(path: Path, data: bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode if mode is not None else 0o644)
    tmp.replace(path)


class PodVolumes:
    """The materialized volumes of one pod (by uid), under ``root/<uid>/<volume>``."""

    def __init__(
        self, pod: Pod, root: Path, source: ObjectSource, net: PodNetwork, memory_root: Path
    ) -> None:
        self._pod = pod
        self._uid = str(pod["metadata"]["uid"])
        self._namespace = str(pod["metadata"]["namespace"])
        self._root = root / self._uid
        self._shm_root = memory_root / self._uid
        self._source = source
        self._net = net
        self.paths: dict[str, Path] = {}

    def materialize(self) -> None:
        """Writes every volume; raises ``ContainerConfigError`` while a referent is missing."""
        for volume in self._pod["spec"].get("volumes") or []:
            self.paths[volume["name"]] = self._materialize(volume)

    def _materialize(self, volume: Mapping[str, Any]) -> Path:
        name = str(volume["name"])
        if "hostPath" in volume:
            path = Path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            return path
        memory = (volume.get("emptyDir") or {}).get("medium") == "Memory"
        base = self._shm_root if memory and _SHM.is_dir() else self._root
        path = base / name
        path.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            return path
        if "secret" in volume:
            spec = volume["secret"]
            self._write_keyed(path, "secret", spec.get("secretName", ""), spec)
        elif "configMap" in volume:
            spec = volume["configMap"]
            self._write_keyed(path, "configmap", spec.get("name", ""), spec)
        elif "downwardAPI" in volume:
            spec = volume["downwardAPI"]
            self._write_downward(path, spec.get("items") or [], spec.get("defaultMode"))
        elif "projected" in volume:
            spec = volume["projected"]
            for projection in spec.get("sources") or []:
                self._write_projection(path, projection, spec.get("defaultMode"))
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise ContainerConfigError(
                f"volume {name!r}: type {kinds} is not supported by the node agent "
                "(emptyDir, secret, configMap, downwardAPI, projected, hostPath are)"
            )
        return path

    def _write_keyed(
        self,
        path: Path,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        default_mode: int | None = None,
    ) -> None:
        if kind == "secret":
            obj = self._source.get_secret(self._namespace, name)
            data = decoded_secret_data(obj) if obj is not None else None
        else:
            obj = self._source.get_configmap(self._namespace, name)
            data = configmap_data(obj) if obj is not None else None
        if data is None:
            if spec.get("optional", False):
                return
            raise ContainerConfigError(f'{kind} "{name}" not found')
        mode = spec.get("defaultMode", default_mode)
        items = spec.get("items")
        if items is None:
            for key, value in data.items():
                _write_file(path / key, value, mode)
            return
        for item in items:
            if item["key"] not in data:
                if spec.get("optional", False):
                    continue
                raise ContainerConfigError(f'{kind} "{name}" has no key {item["key"]!r}')
            _write_file(path / item["path"], data[item["key"]], item.get("mode", mode))

    def _write_downward(
        self, path: Path, items: Sequence[Mapping[str, Any]], mode: int | None
    ) -> None:
        for item in items:
            if "fieldRef" not in item:
                raise ContainerConfigError(
                    f"downwardAPI item {item.get('path')!r}: only fieldRef is supported"
                )
            value = field_ref(self._pod, item["fieldRef"]["fieldPath"], self._net)
            _write_file(path / item["path"], value.encode(), item.get("mode", mode))

    def _write_projection(
        self, path: Path, projection: Mapping[str, Any], mode: int | None
    ) -> None:
        if "secret" in projection:
            spec = projection["secret"]
            self._write_keyed(path, "secret", spec.get("name", ""), spec, mode)
        elif "configMap" in projection:
            spec = projection["configMap"]
            self._write_keyed(path, "configmap", spec.get("name", ""), spec, mode)
        elif "downwardAPI" in projection:
            self._write_downward(path, projection["downwardAPI"].get("items") or [], mode)
        elif "serviceAccountToken" in projection:
            spec = projection["serviceAccountToken"]
            meta = self._pod["metadata"]
            token = self._source.request_token(
                self._namespace,
                self._pod["spec"].get("serviceAccountName") or "default",
                TokenRequest(
                    audiences=[spec["audience"]] if spec.get("audience") else [],
                    expiration_seconds=int(spec.get("expirationSeconds", 3600)),
                    pod_name=meta["name"],
                    pod_uid=meta["uid"],
                ),
            )
            _write_file(path / spec["path"], token.encode(), mode if mode is not None else 0o600)
        else:
            raise ContainerConfigError(
                f"projected source {sorted(projection)} is not supported by the node agent"
            )

    def mounts_for(self, container: Mapping[str, Any]) -> list[Mount]:
        mounts = []
        for vm in container.get("volumeMounts") or []:
            source = self.paths[vm["name"]]
            if vm.get("subPath"):
                source = source / vm["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            mounts.append(Mount(source, vm["mountPath"], bool(vm.get("readOnly", False))))
        return mounts

    def cleanup(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
        shutil.rmtree(self._shm_root, ignore_errors=True)


class MountPoints:
    """Creates missing mount-point paths on the host and removes them again at exit."""

    def __init__(self) -> None:
        self._created: list[Path] = []

    def ensure(self, mount: Mount) -> None:
        target = Path(mount.target)
        if target.exists():
            return
        missing = [target]
        missing.extend(p for p in target.parents if not p.exists())
        if mount.source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        self._created.extend(missing)

    def remove_created(self) -> None:
        """Removes what ``ensure`` created, deepest first, when still empty."""
        for path in sorted(set(self._created), key=lambda p: len(p.parts), reverse=True):
            try:
                if path.is_dir():
                    path.rmdir()
                elif path.is_file() and path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
        self._created.clear()


_NAMESPACE_SCRIPT = (
    'while [ "$1" != "--" ]; do '
    'mount "--${3%,ro}" "$1" "$2" || exit 126; '
    'case "$3" in *,ro) mount -o remount,bind,ro "$2" || exit 126;; esac; '
    'shift 3; done; shift; exec "$@"'
)


def _under(path: str | Path, root: str) -> bool:
    root = root.rstrip("/") or "/"
    text = str(path)
    return root == "/" or text == root or text.startswith(root + "/")


def shown_through(target: str, image_paths: Sequence[str]) -> list[str]:
    """The image paths that a volume on ``target`` must not hide: those strictly below it.

    Only the outermost: the others show through along with the one they lie in.
    """
    target = target.rstrip("/") or "/"
    below = {p for p in image_paths if p != target and _under(p, target)}
    return sorted(p for p in below if not any(q != p and _under(p, q) for q in below))


def _rewrite(value: str, mounts: Sequence[Mount], image_paths: Sequence[str]) -> str:
    for m in sorted(mounts, key=lambda m: len(m.target), reverse=True):
        target = m.target.rstrip("/") or "/"
        if value == target or value.startswith(target + "/"):
            if any(_under(value, p) for p in shown_through(target, image_paths)):
                return value
            return str(m.source) + value[len(target) :]
    return value


def mount_order(mounts: Sequence[Mount], image_paths: Sequence[str] = ()) -> list[Mount]:
    """The binds to make, in order, so that no mount hides what a later one needs.

    A mount whose target covers another mount's source (an emptyDir on ``/tmp`` while
    the agent keeps volumes under ``/tmp``) goes after it; otherwise parents go before
    the targets nested in them. A volume on an ancestor of an image path is preceded by
    a bind of that image path to the same place inside the volume's source, and is
    itself bound recursively, so the image path shows through it.
    """

    def covers_a_source(m: Mount) -> bool:
        return any(o is not m and _under(o.source, m.target) for o in mounts)

    binds: list[Mount] = []
    for m in sorted(mounts, key=lambda m: (covers_a_source(m), len(Path(m.target).parts))):
        shown = shown_through(m.target, image_paths)
        for path in shown:
            inside = m.source / Path(path).relative_to(m.target)
            binds.append(Mount(Path(path), str(inside), read_only=False, recursive=True))
        binds.append(Mount(m.source, m.target, m.read_only, recursive=m.recursive or bool(shown)))
    return binds


def apply_mounts(
    argv: Sequence[str],
    env: Mapping[str, str],
    mounts: Sequence[Mount],
    mode: MountMode,
    mount_points: MountPoints,
    image_paths: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The argv and env that make a process see ``mounts`` (see the module docstring)."""
    if not mounts:
        return list(argv), dict(env)
    if mode == "namespace":
        wrapped = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
        wrapped += [_NAMESPACE_SCRIPT, "kpw-mount"]
        for m in mount_order(mounts, image_paths):
            mount_points.ensure(m)
            wrapped += [str(m.source), m.target, m.bind_flags]
        return wrapped + ["--", *argv], dict(env)
    new_env = {k: _rewrite(v, mounts, image_paths) for k, v in env.items()}
    new_env.update({mount_env_name(m.target): str(m.source) for m in mounts})
    return [_rewrite(a, mounts, image_paths) for a in argv], new_env


def host_path(path: str, mounts: Sequence[Mount], image_paths: Sequence[str] = ()) -> str:
    """Where a container path (e.g. ``workingDir``) lies on the host, before any mount."""
    return _rewrite(path, mounts, image_paths)
