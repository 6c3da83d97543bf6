"""Container logs for the API server, served as a kubelet serves them, so ``kubectl logs`` works.

The API server fetches a pod's log from its node's kubelet: ``GET https://<InternalIP>:
<status.daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<namespace>/<pod>/<container>``,
with the query ``kubectl logs`` gives it (``tailLines``, ``limitBytes``, ``follow``,
``previous``; ``timestamps`` and ``sinceSeconds`` are taken and ignored: the agent's log
files keep no times). The agent serves that one path on a port of its own (bound to 0),
over TLS, to the API server's client certificate alone: one signed by the CA of the
agent's kubeconfig, with the common name ``pki.KUBELET_CLIENT``. A pod on this machine's
loopback, or anyone else, gets no log from it. Its own serving certificate is self-signed
(made with openssl when it starts), and the API server is run without
``--kubelet-certificate-authority``, so it does not check it.

A container's log is the file the agent writes for its current run
(`containers.container_log_path`, the highest restart), or with ``previous`` the run
before. ``follow`` sends what is appended until that run's process has exited and the
file is drained, the client goes away, or the agent stops.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pathways_devcluster.node_agent.containers import container_log_path, container_pid_path
from pathways_devcluster.pki import KUBELET_CLIENT

log = logging.getLogger(__name__)

FOLLOW_POLL_S = 0.25
"""How often a followed log is checked for more."""
SOCKET_TIMEOUT_S = 60.0
"""Bound on a connection's TLS handshake, on reading its request and on each write."""
CHUNK = 64 * 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_RUN = re.compile(r"^(?P<container>.+)\.log(?:\.(?P<restart>[0-9]+))?$")


class LogRequestError(Exception):
    """A request the endpoint refuses: its HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogRequest:
    """What a ``GET /containerLogs/...`` asks for."""

    namespace: str
    pod: str
    container: str
    tail_lines: int | None = None
    limit_bytes: int | None = None
    follow: bool = False
    previous: bool = False


def _flag(query: dict[str, list[str]], name: str) -> bool:
    value = query.get(name, ["false"])[-1].lower()
    if value not in ("true", "false", "1", "0", ""):
        raise LogRequestError(400, f"query {name}={value!r}: expected true or false")
    return value in ("true", "1")


def _count(query: dict[str, list[str]], name: str, least: int) -> int | None:
    if name not in query:
        return None
    text = query[name][-1]
    if not text.isdigit() or int(text) < least:
        raise LogRequestError(400, f"query {name}={text!r}: expected an integer of at least {least}")
    return int(text)


def parse_log_request(target: str) -> LogRequest:
    """The request in a request line's target, or a `LogRequestError` (404 for another path)."""
    parts = urlsplit(target)
    segments = [unquote(s) for s in parts.path.split("/")]
    if len(segments) != 5 or segments[:2] != ["", "containerLogs"]:
        raise LogRequestError(404, f"{parts.path}: this node serves only /containerLogs/<namespace>/<pod>/<container>")
    namespace, pod, container = segments[2:]
    for what, name in (("namespace", namespace), ("pod", pod), ("container", container)):
        if not _NAME.match(name):
            raise LogRequestError(400, f"{what} {name!r} is not a Kubernetes object name")
    query = parse_qs(parts.query, keep_blank_values=True)
    return LogRequest(
        namespace, pod, container,
        tail_lines=_count(query, "tailLines", 0),
        limit_bytes=_count(query, "limitBytes", 1),
        follow=_flag(query, "follow"),
        previous=_flag(query, "previous"),
    )  # fmt: skip


def chosen_run(file_names: list[str], container: str, previous: bool) -> str | None:
    """Of a pod directory's file names, the log of the container's current run (the highest
    restart), or with ``previous`` of the run before it; None where there is none."""
    runs = []
    for name in file_names:
        found = _RUN.match(name)
        if found and found["container"] == container:
            runs.append((int(found["restart"] or 0), name))
    runs.sort()
    wanted = len(runs) - (2 if previous else 1)
    return runs[wanted][1] if wanted >= 0 else None


def tail(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines of ``data`` (a last line without its newline counts as one)."""
    if lines == 0:
        return b""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = end
    for _ in range(lines):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return data
    return data[start + 1:]


def common_names(peer: Any) -> list[str]:
    """The common names in the subject of a peer certificate as `ssl.SSLSocket.getpeercert` gives it."""
    subject = (peer or {}).get("subject", ())
    return [str(pair[1]) for rdn in subject for pair in rdn if pair[0] == "commonName"]


def serving_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with openssl in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "serving.crt", directory / "serving.key"
    result = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "7", "-subj", "/CN=kpw-node-agent",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"openssl could not make the node agent's serving certificate: {result.stderr}")
    key.chmod(0o600)
    return cert, key


class ContainerLogs:
    """The HTTPS endpoint: `start` binds and serves; `port` goes into each Node's status."""

    def __init__(self, state_dir: Path, client_ca: str, stop: threading.Event) -> None:
        self.state_dir = state_dir
        self.stop = stop
        cert, key = serving_certificate(state_dir / "serving")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED  # fails closed: no certificate, no log
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # the handshake is the connection's own thread's (`Handler.setup`), not the accept loop's
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="container-logs", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("container logs served on 127.0.0.1:%d to %s", self.port, KUBELET_CLIENT)

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()  # waits for a serve_forever that runs, forever for one that never did
        self._server.server_close()

    def log_file(self, request: LogRequest) -> Path:
        pod_dir = container_log_path(self.state_dir, request.namespace, request.pod, request.container).parent
        try:
            names = os.listdir(pod_dir)
        except OSError:
            names = []
        chosen = chosen_run(names, request.container, request.previous)
        if chosen is None:
            which = "previous run" if request.previous else "log"
            raise LogRequestError(  # 400, as a kubelet's: the API server passes its words on
                400, f"container {request.container} of pod {request.namespace}/{request.pod} has no {which} on this node"
            )
        return pod_dir / chosen

    def running(self, request: LogRequest, path: Path) -> bool:
        """Whether the run that writes ``path`` may still write to it."""
        pod_dir = path.parent
        if chosen_run(os.listdir(pod_dir), request.container, False) != path.name:
            return False  # a later run has started
        try:
            pid = int(container_pid_path(self.state_dir, request.namespace, request.pod, request.container).read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A connection that failed (no certificate, gone mid-answer) is logged, not printed."""
        log.debug("container logs: a connection from %s failed", client_address, exc_info=True)


def _handler(logs: ContainerLogs) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def setup(self) -> None:
            self.request.settimeout(SOCKET_TIMEOUT_S)
            self.request.do_handshake()  # refuses a client without a certificate of the cluster CA
            super().setup()

        def log_message(self, format: str, *args: object) -> None:
            log.debug("container logs: " + format, *args)

        def do_GET(self) -> None:
            try:
                self._authorize()
                request = parse_log_request(self.path)
                path = logs.log_file(request)
            except LogRequestError as err:
                self._refuse(err.status, str(err))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                _send_log(path, request, self._chunk, lambda: not logs.stop.is_set() and logs.running(request, path))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                self.close_connection = True

        def _authorize(self) -> None:
            peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            if common_names(peer) != [KUBELET_CLIENT]:
                raise LogRequestError(403, f"logs are served to the API server ({KUBELET_CLIENT}) only")

        def _chunk(self, data: bytes) -> None:
            if data:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        def _refuse(self, status: int, message: str) -> None:
            body = (message + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _send_log(path: Path, request: LogRequest, send: Callable[[bytes], None], may_grow: Callable[[], bool]) -> None:
    """The log at ``path`` as ``request`` asks, through ``send``; with ``follow``, then what
    is appended while ``may_grow()``, and what was appended before it said no."""
    left = request.limit_bytes if request.limit_bytes is not None else -1
    with open(path, "rb") as f:
        data = f.read()
        if request.tail_lines is not None:
            data = tail(data, request.tail_lines)
        while True:
            if left >= 0:
                data = data[:left]
                left -= len(data)
            send(data)
            if not request.follow or left == 0:
                return
            growing = may_grow()
            data = f.read(CHUNK)
            if data:
                continue
            if not growing:
                return
            time.sleep(FOLLOW_POLL_S)
