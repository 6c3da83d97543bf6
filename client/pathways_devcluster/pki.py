"""The test control plane's credentials: a throw-away CA and the kubeconfigs that use it.

``write_pki`` makes, with openssl, a CA (valid 7 days), the API server's serving
certificate for 127.0.0.1 and the in-cluster names of the ``kubernetes`` Service, the
client certificate the API server presents to a node's kubelet endpoint (`KUBELET_CLIENT`:
the node agent serves container logs only to it), and the RSA key pair that signs and
verifies service-account tokens. ``write_kubeconfig``
writes a self-contained kubeconfig (the CA inlined) for a bearer token, which is how the
admin, the controller-manager, the scheduler and service accounts under test log in.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import yaml

from pathways_devcluster.components import ControlPlaneError


KUBELET_CLIENT = "kube-apiserver-kubelet-client"
"""The common name of the API server's client certificate towards the kubelets."""


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def write_pki(pki: Path) -> None:
    """CA, API server serving and kubelet-client certificates, and the service-account key pair."""
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
    _signed(
        pki, "apiserver", "/CN=kube-apiserver",
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n",
    )  # fmt: skip
    _signed(pki, "kubelet-client", f"/O=system:masters/CN={KUBELET_CLIENT}", "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def _signed(pki: Path, name: str, subject: str, extensions: str) -> None:
    """``<name>.key`` and ``<name>.crt`` for ``subject``, signed by the CA, a leaf with ``extensions``."""
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
        cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n" + extensions
    )
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "7", "-extfile", f"{name}.ext",
        cwd=pki,
    )  # fmt: skip


def write_kubeconfig(path: Path, *, server: str, ca: Path, token: str, user: str) -> Path:
    """A self-contained kubeconfig (CA inlined) that kubectl and the python client read."""
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
