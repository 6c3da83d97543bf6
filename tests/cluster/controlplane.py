"""A real Kubernetes control plane from local binaries, for the cluster test tier.

CI machines have no Docker engine, so kind is out. Instead ``ControlPlane`` starts the
real thing from binaries that ``tests/cluster/toolchain/build.sh`` (``make controlplane``)
builds through the Go module proxy and caches outside the repository:

1. etcd on two free loopback ports, its data in the run directory;
2. kube-apiserver on ``https://127.0.0.1:<port>``: a throw-away CA signs its serving
   certificate, an RSA key pair (openssl) signs and verifies service-account tokens, a
   static token file authenticates the admin (group ``system:masters``), the
   controller-manager and the scheduler, and authorization is ``RBAC,Node`` -- so RBAC
   rules shipped by the project are enforced exactly as in a real cluster;
3. kube-controller-manager (all controllers but node IPAM and node lifecycle, which need a
   real kubelet and cloud; one service account per controller; the CA published as
   ``kube-root-ca.crt`` so in-cluster clients can verify the API server);
4. kube-scheduler.

Each is started only after the previous one answers its health endpoint; a component
that dies or does not become healthy in time raises ``ControlPlaneError`` carrying the
tail of its log. The kubelet is the one piece that is not real: see ``kubelet``.

Processes run in their own sessions and die with their parent (see ``processes``);
``stop`` (or leaving the ``with`` block) terminates them in reverse order.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml

from tests.cluster import processes

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

K8S_VERSION = "v1.34.4"
ETCD_VERSION = "3.6.6"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "cluster" / "toolchain" / "build.sh"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used."""


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


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class _Component:
    """One control-plane process: how to start it and how to tell it is healthy."""

    name: str
    argv: list[str]
    log: Path
    health_url: str
    health_token: str | None = None
    verify_ca: Path | None = None
    stop_grace_seconds: float = 10.0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.popen = processes.spawn(self.argv, log=self.log, append_log=True)

    def stop(self) -> None:
        if self.popen is not None:
            processes.stop(self.popen, self.stop_grace_seconds)
            self.popen = None

    def failure(self, why: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name} {why}; log {self.log} ends with:\n{processes.log_tail(self.log)}"
        )

    def wait_healthy(self, timeout: float) -> float:
        """Polls the health endpoint until it answers 200 "ok"; returns the seconds taken."""
        start = time.monotonic()
        deadline = start + timeout
        if self.verify_ca is not None:
            context = ssl.create_default_context(cafile=str(self.verify_ca))
        else:  # the component's own self-signed serving certificate
            context = ssl._create_unverified_context()
        headers = {"Authorization": f"Bearer {self.health_token}"} if self.health_token else {}
        last = "no answer yet"
        while True:
            assert self.popen is not None
            code = self.popen.poll()
            if code is not None:
                raise self.failure(f"exited with status {code} while starting")
            try:
                req = urllib.request.Request(self.health_url, headers=headers)
                with urllib.request.urlopen(req, timeout=2.0, context=context) as resp:
                    body = resp.read().decode("utf-8", "replace")
                    if resp.status == 200 and ("ok" in body or '"health":"true"' in body):
                        return time.monotonic() - start
                    last = f"HTTP {resp.status}: {body[:200]}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300].decode('utf-8', 'replace')}"
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            if not processes.wait_until(deadline, 0.2):
                raise self.failure(
                    f"not healthy at {self.health_url} within {timeout:.0f} s (last: {last})"
                )


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _write_pki(pki: Path) -> None:
    """CA, API server serving certificate (for 127.0.0.1) and the service-account key pair."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the cluster test tier needs the `openssl` command")
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "7", "-subj", "/CN=kube-pathways-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=pki,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out",
        "apiserver.csr", "-subj", "/CN=kube-apiserver",
        cwd=pki,
    )  # fmt: skip
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "apiserver.crt", "-days", "7", "-extfile", "apiserver.ext",
        cwd=pki,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, *, server: str, ca: Path, token: str, user: str) -> Path:
    """A self-contained kubeconfig (CA inlined) that kubectl and the python client read."""
    import base64

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kube-pathways-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "kube-pathways-test", "user": user}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

    ``with ControlPlane(run_dir) as cp:`` starts everything (bounded by ``start_timeout``
    per component) and stops it on exit. ``cp.kubeconfig`` is an admin kubeconfig;
    ``cp.make_user_kubeconfig(sa, ns)`` one for a service account, to test RBAC.
    """

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        bin_dir: Path | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self._binaries = find_binaries(bin_dir)
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="kpw-cp-"))
        self.start_timeout = start_timeout
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.admin_token = secrets.token_hex(16)
        self._components: dict[str, _Component] = {}
        self._started = False
        self.startup_seconds: dict[str, float] = {}

    # -- paths --------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.run_dir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (group system:masters)."""
        return self.run_dir / "admin.kubeconfig"

    def log_file(self, component: str) -> Path:
        return self.run_dir / "logs" / f"{component}.log"

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._started:
            return self
        self._started = True
        try:
            self._prepare()
            for name in COMPONENTS:
                component = self._components[name]
                component.start()
                self.startup_seconds[name] = component.wait_healthy(self.start_timeout)
            started = time.monotonic()
            self.wait_namespace_ready("default", timeout=self.start_timeout)
            self.startup_seconds["default-namespace"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stops every component (reverse start order); idempotent."""
        for name in reversed(COMPONENTS):
            component = self._components.get(name)
            if component is not None:
                component.stop()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def restart(self, component: str, *, down_seconds: float = 0.0) -> None:
        """Stops one component, keeps it down ``down_seconds``, starts it on the same port.

        For fault tests: clients (operator, node agent) must ride out an API server restart.
        """
        comp = self._components[component]
        comp.stop()
        time.sleep(max(0.0, down_seconds))
        comp.start()
        comp.wait_healthy(self.start_timeout)

    def alive(self) -> dict[str, bool]:
        return {
            name: c.popen is not None and c.popen.poll() is None
            for name, c in self._components.items()
        }

    def wait_namespace_ready(self, namespace: str, timeout: float = 30.0) -> None:
        """Waits until the controllers have given ``namespace`` what pods need.

        A pod can only be created once its service account exists (ServiceAccount
        admission), and its API-access volume only mounts once ``kube-root-ca.crt`` is
        published; on a fresh namespace both take the controller-manager a moment.
        """
        deadline = time.monotonic() + timeout
        needed = {
            "serviceaccount default": f"/api/v1/namespaces/{namespace}/serviceaccounts/default",
            "configmap kube-root-ca.crt": f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt",
        }
        while needed:
            for what, path in list(needed.items()):
                try:
                    self.request("GET", path)
                    del needed[what]
                except ControlPlaneError:
                    pass
            if needed and not processes.wait_until(deadline, 0.2):
                raise self._components["kube-controller-manager"].failure(
                    f"did not create {', '.join(needed)} in namespace {namespace!r} "
                    f"within {timeout:.0f} s"
                )

    # -- clients ------------------------------------------------------------------------

    def api_client(self) -> ApiClient:
        """A fresh admin ``kubernetes.client.ApiClient``."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        return client.ApiClient(configuration)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 15.0) -> Any:
        """One admin REST call (JSON in, JSON out) without the python client."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise ControlPlaneError(
                f"{method} {path} -> HTTP {e.code}: {e.read().decode('utf-8', 'replace')}"
            ) from None

    def make_user_kubeconfig(
        self,
        serviceaccount: str,
        namespace: str,
        *,
        expiration_seconds: int = 3600,
        path: Path | None = None,
    ) -> Path:
        """Kubeconfig authenticating as ``system:serviceaccount:<namespace>:<serviceaccount>``.

        The token comes from the TokenRequest API, as a pod's projected token would; the
        service account must exist. Use it to check that a Role grants what is needed
        and no more.
        """
        token_request = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{serviceaccount}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [], "expirationSeconds": expiration_seconds},
            },
        )
        token = token_request["status"]["token"]
        path = path or self.run_dir / "users" / f"{namespace}_{serviceaccount}.kubeconfig"
        return write_kubeconfig(
            path,
            server=self.server,
            ca=self.ca_file,
            token=token,
            user=f"system:serviceaccount:{namespace}:{serviceaccount}",
        )

    # -- configuration ------------------------------------------------------------------

    def _prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        _write_pki(self.pki_dir)
        pki = self.pki_dir
        tokens = {
            "admin": (self.admin_token, "admin", "system:masters"),
            "kube-controller-manager": (
                secrets.token_hex(16),
                "system:kube-controller-manager",
                "",
            ),
            "kube-scheduler": (secrets.token_hex(16), "system:kube-scheduler", ""),
        }
        (pki / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"{groups}"\n' for tok, user, groups in tokens.values())
        )
        (pki / "tokens.csv").chmod(0o600)
        write_kubeconfig(
            self.kubeconfig,
            server=self.server,
            ca=self.ca_file,
            token=self.admin_token,
            user="admin",
        )
        kubeconfigs = {
            name: write_kubeconfig(
                self.run_dir / f"{name}.kubeconfig",
                server=self.server,
                ca=self.ca_file,
                token=tokens[name][0],
                user=tokens[name][1],
            )
            for name in ("kube-controller-manager", "kube-scheduler")
        }

        etcd_client, etcd_peer = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        b = self._binaries
        self._components["etcd"] = _Component(
            name="etcd",
            argv=[
                str(b["etcd"]),
                "--name=kpw-test",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=kpw-test=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            log=self.log_file("etcd"),
            health_url=f"{etcd_url}/health",
        )
        self._components["kube-apiserver"] = _Component(
            name="kube-apiserver",
            argv=[
                str(b["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC,Node",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # The default reconciler would publish 127.0.0.1 as the endpoint of the
                # `kubernetes` Service, which Endpoints validation rejects (loopback).
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            ],
            log=self.log_file("kube-apiserver"),
            health_url=f"{self.server}/readyz",
            health_token=self.admin_token,
            verify_ca=self.ca_file,
            # After SIGTERM the API server stops listening at once but keeps open watch
            # connections until its 60 s shutdown timeout; nothing is lost by not waiting.
            stop_grace_seconds=2.0,
        )
        kcm_port, sched_port = free_port(), free_port()
        kcm_kc = str(kubeconfigs["kube-controller-manager"])
        self._components["kube-controller-manager"] = _Component(
            name="kube-controller-manager",
            argv=[
                str(b["kube-controller-manager"]),
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.run_dir / 'kcm-certs'}",
                "--controllers=*,-nodeipam,-nodelifecycle",
                "--use-service-account-credentials",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--profiling=false",
            ],
            log=self.log_file("kube-controller-manager"),
            health_url=f"https://127.0.0.1:{kcm_port}/healthz",
        )
        sched_kc = str(kubeconfigs["kube-scheduler"])
        self._components["kube-scheduler"] = _Component(
            name="kube-scheduler",
            argv=[
                str(b["kube-scheduler"]),
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--cert-dir={self.run_dir / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
            ],
            log=self.log_file("kube-scheduler"),
            health_url=f"https://127.0.0.1:{sched_port}/healthz",
        )


def main() -> None:
    """``python -m tests.cluster.controlplane``: start, print the kubeconfig path, wait for ^C."""
    import signal

    cp = ControlPlane(Path(tempfile.mkdtemp(prefix="kpw-cp-")))
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with cp:
        print(
            f"control plane ready in {sum(cp.startup_seconds.values()):.1f} s: {cp.startup_seconds}"
        )
        print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        while not stopping:
            time.sleep(0.5)


if __name__ == "__main__":
    main()
