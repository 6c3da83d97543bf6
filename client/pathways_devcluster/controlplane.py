"""A real Kubernetes control plane from local binaries, for the cluster test tier.

CI machines have no Docker engine, so kind is out. Instead ``ControlPlane`` starts the
real thing from binaries that ``tests/cluster/toolchain/build.sh`` (``make controlplane``)
builds through the Go module proxy and caches outside the repository:

1. etcd on loopback port 0 (it logs the client port it got), its data in the run directory;
2. kube-apiserver on ``https://127.0.0.1:<port>``: a throw-away CA signs its serving
   certificate, an RSA key pair (openssl) signs and verifies service-account tokens, a
   static token file authenticates the admin (group ``system:masters``), the
   controller-manager and the scheduler, and authorization is ``RBAC,Node`` -- so RBAC
   rules shipped by the project are enforced exactly as in a real cluster; it asks the
   node agent for pod logs as it would a kubelet, with a client certificate of that CA;
3. kube-controller-manager, with every controller but node IPAM (pods get loopback
   addresses from the node agent, not from a Node's podCIDR): one service account per
   controller; the CA published as ``kube-root-ca.crt`` so in-cluster clients can verify
   the API server; node lifecycle on, so a Node whose Lease and status stop being renewed
   goes NotReady, is tainted ``node.kubernetes.io/unreachable`` and its pods are evicted;
4. kube-scheduler.

Node failure is quicker here than in a default cluster, so that tests see it in seconds:
a Node is NotReady ``node_grace_seconds`` (default 20 s; Kubernetes' is 50 s) after its
last heartbeat, checked every 2 s, and the API server gives pods the default
tolerations for ``not-ready`` and ``unreachable`` of ``toleration_seconds`` (default
10 s; Kubernetes' is 300 s), after which the taint manager evicts them.

The API server, the controller-manager and the scheduler cannot bind port 0 and report
it; their ports are reserved outside the kernel's ephemeral range (see ``ports``).
Each is started only after the previous one answers its health endpoint; a component
that dies or does not become healthy in time raises ``ControlPlaneError`` carrying the
tail of its log. The kubelet is the one piece that is not real: see ``node_agent``.

Processes run in their own sessions and die with their parent (see ``processes``);
``stop`` (or leaving the ``with`` block) terminates them in reverse order.

The module runs to about 430 lines because ``ControlPlane`` is the order above: each
component's flags name the files and ports of the ones before it; its certificates,
ports and processes already live in ``pki``, ``ports`` and ``processes``.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathways_devcluster import processes
from pathways_devcluster.binaries import COMPONENTS, find_binaries
from pathways_devcluster.components import Component, ControlPlaneError
from pathways_devcluster.pki import write_kubeconfig, write_pki
from pathways_devcluster.ports import ReservedPort, reserve_port

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
NODE_GRACE_SECONDS = 20
"""Seconds without a heartbeat before a Node is NotReady (``--node-monitor-grace-period``)."""
TOLERATION_SECONDS = 10
"""Default ``tolerationSeconds`` of pods for the not-ready and unreachable taints."""
ETCD_CLIENT_PORT = re.compile(
    r'"msg":"serving client traffic insecurely[^\n]*"address":"127\.0\.0\.1:(\d+)"'
)
"""etcd's log line for its client listener, with the port that ``:0`` became."""


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
        node_grace_seconds: int = NODE_GRACE_SECONDS,
        toleration_seconds: int = TOLERATION_SECONDS,
    ) -> None:
        self._binaries = find_binaries(bin_dir)
        self.node_grace_seconds = node_grace_seconds
        self.toleration_seconds = toleration_seconds
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="kpw-cp-"))
        self.start_timeout = start_timeout
        self._ports: list[ReservedPort] = []
        self.apiserver_port = self._reserve().port
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.admin_token = secrets.token_hex(16)
        self._components: dict[str, Component] = {}
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

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._started:
            return self
        self._started = True
        try:
            self._prepare()
            for name in COMPONENTS:
                component = self._components[name] = self._component(name)
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
        for reservation in self._ports:
            reservation.release()
        self._ports.clear()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def restart(self, component: str, *, down_seconds: float = 0.0) -> None:
        """Stops one component, keeps it down ``down_seconds``, starts it on the same port.

        For fault tests: clients (operator, node agent) must ride out an API server restart.
        """
        comp = self._components[component]
        comp.stop()
        time.sleep(max(0.0, down_seconds))
        if comp.port is not None:  # it bound port 0 first: its clients know the port it got
            comp.argv = self._etcd(comp.port).argv
        comp.start()
        comp.wait_healthy(self.start_timeout)

    def pids(self) -> dict[str, int]:
        """The PIDs of the components that run, by name."""
        return {name: c.popen.pid for name, c in self._components.items() if c.popen is not None}

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
        """Credentials and kubeconfigs; the components are made as their turn comes."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        write_pki(self.pki_dir)
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
        for name, (token, user, _) in tokens.items():
            path = self.kubeconfig if name == "admin" else self.run_dir / f"{name}.kubeconfig"
            write_kubeconfig(path, server=self.server, ca=self.ca_file, token=token, user=user)

    def _component(self, name: str) -> Component:
        if name == "etcd":
            return self._etcd()
        if name == "kube-apiserver":
            return self._apiserver(self._components["etcd"].port)
        if name == "kube-controller-manager":
            return self._secondary(name, [
                "--controllers=*,-nodeipam",
                "--node-monitor-period=2s",
                f"--node-monitor-grace-period={self.node_grace_seconds}s",
                "--use-service-account-credentials",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
                f"--root-ca-file={self.pki_dir / 'ca.crt'}",
                f"--cluster-signing-cert-file={self.pki_dir / 'ca.crt'}",
                f"--cluster-signing-key-file={self.pki_dir / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            ])  # fmt: skip
        return self._secondary(name, ["--leader-elect=false"])

    def _etcd(self, client_port: int = 0) -> Component:
        """etcd on port 0 (client and peer); it logs the client port it got."""
        any_port = "http://127.0.0.1:0"
        client_url = f"http://127.0.0.1:{client_port}"
        return Component(
            name="etcd",
            argv=[
                str(self._binaries["etcd"]),
                "--name=kpw-test",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={any_port}",
                f"--initial-advertise-peer-urls={any_port}",
                f"--initial-cluster=kpw-test={any_port}",
                "--unsafe-no-fsync",
                "--log-level=info",  # the line that reports the client port is at info
            ],
            log=self.log_file("etcd"),
            health_url="http://127.0.0.1:{port}/health",
            reports_port=ETCD_CLIENT_PORT,
        )

    def _apiserver(self, etcd_port: int | None) -> Component:
        pki = self.pki_dir
        return Component(
            name="kube-apiserver",
            argv=[
                str(self._binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
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
                f"--default-not-ready-toleration-seconds={self.toleration_seconds}",
                f"--default-unreachable-toleration-seconds={self.toleration_seconds}",
                "--profiling=false",
                f"--cert-dir={self.run_dir / 'apiserver-certs'}",
                # Pod logs: the node agent serves them on Node.status.daemonEndpoints, at
                # the Node's InternalIP (its Hostname does not resolve), to this certificate
                # only; its serving certificate is its own, self-signed, so it is not verified.
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
            ],
            log=self.log_file("kube-apiserver"),
            health_url=f"{self.server}/readyz",
            health_token=self.admin_token,
            verify_ca=self.ca_file,
            # After SIGTERM the API server stops listening at once but keeps open watch
            # connections until its 60 s shutdown timeout; nothing is lost by not waiting.
            stop_grace_seconds=2.0,
        )

    def _secondary(self, name: str, flags: list[str]) -> Component:
        """kube-controller-manager or kube-scheduler: a client of the API server."""
        port = self._reserve().port
        kubeconfig = self.run_dir / f"{name}.kubeconfig"
        short = "kcm" if name == "kube-controller-manager" else "scheduler"
        return Component(
            name=name,
            argv=[
                str(self._binaries[name]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / f'{short}-certs'}",
                *flags,
                "--profiling=false",
            ],
            log=self.log_file(name),
            health_url=f"https://127.0.0.1:{port}/healthz",
        )

    def _reserve(self) -> ReservedPort:
        reservation = reserve_port()
        self._ports.append(reservation)
        return reservation


def main() -> None:
    """``python -m pathways_devcluster.controlplane``: start, print the kubeconfig path, wait for ^C."""
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
