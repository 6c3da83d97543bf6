"""The port of a slice's JAX coordination service: held for it, never guessed.

Every other server of a host binds port 0 and prints the port it got. JAX's
coordination service cannot: `jax.distributed.initialize` binds the address it is
given and reports nothing back, and every host of the slice must know that address
before any of them starts. Picking a free port and closing it before host 0 binds
would leave a window in which another process on the machine can take it.

So the launcher binds the port itself with ``SO_REUSEPORT`` and keeps that socket
open, never listening, for as long as the slice's host 0 lives. The kernel gives a
bound port to no one else (nor to a port-0 bind), while the coordination service,
a gRPC server that binds with ``SO_REUSEPORT`` as the same user, shares it; the held
socket accepts nothing, so every connection reaches the service. The embedded
launcher holds each worker's port the same way, so that the sidecar, which must be
told its worker's address, can start beside the worker instead of after it.
"""

from __future__ import annotations

import socket

from pathways_wire import host_port


class HeldPort:
    """A port on ``ip`` that stays this process's until `release`."""

    def __init__(self, ip: str, what: str = "coordinator") -> None:
        self._sock = socket.socket(host_port.family(ip), socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self._sock.bind((ip, 0))
        except OSError as err:
            self._sock.close()
            raise RuntimeError(f"cannot hold a {what} port on {ip}: {err}") from err
        self.ip = ip
        self.port = int(self._sock.getsockname()[1])

    @property
    def address(self) -> str:
        return host_port.join(self.ip, self.port)

    def release(self) -> None:
        self._sock.close()
