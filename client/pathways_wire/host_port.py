"""``HOST:PORT`` addresses, IPv4, IPv6 and names alike.

Every process of the runtime names the others by ``HOST:PORT``. An IPv6 host is
written in brackets (``[fd00::5]:8477``), as gRPC, JAX's coordination service and
URLs want it; a Kubernetes pod's own address comes from ``$(POD_IP):PORT`` in its
environment, which leaves an IPv6 address bare (``fd00::5:8477``), so a bare one is
read too: the port is what follows the last colon. A listening socket takes the
address family of its host.
"""

from __future__ import annotations

import socket


def join(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split(address: str, what: str = "address") -> tuple[str, int]:
    """The host (without brackets) and port of ``HOST:PORT``; ValueError naming ``what``
    and the address when it is not one with a port in 0..65535."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]") if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or "[" in host or "]" in host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what} {address!r} is not HOST:PORT with a port in 0..65535 "
                         "(an IPv6 host in brackets: [fd00::5]:8477)")
    return host, int(port)


def normalized(address: str, what: str = "address") -> str:
    """``address`` as ``join`` writes it: a bare IPv6 host put in brackets."""
    return join(*split(address, what))


def family(host: str) -> socket.AddressFamily:
    """The address family a socket listening on ``host`` needs."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
