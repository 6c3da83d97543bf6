"""HOST:PORT addresses: IPv6 hosts in brackets, a pod's bare IPv6 address read too, and a
client's controller address checked before it connects."""

from __future__ import annotations

import re
import socket

import pytest

import pathways as pw
from pathways_wire import host_port


@pytest.mark.parametrize(("host", "port", "address"), [
    ("10.0.0.7", 8477, "10.0.0.7:8477"),
    ("fd00::5", 8477, "[fd00::5]:8477"),
    ("[fd00::5]", 8477, "[fd00::5]:8477"),
    ("::1", 0, "[::1]:0"),
    ("driver.ns.svc", 50051, "driver.ns.svc:50051"),
])
def test_join_writes_an_ipv6_host_in_brackets(host: str, port: int, address: str) -> None:
    assert host_port.join(host, port) == address


@pytest.mark.parametrize(("address", "host", "port"), [
    ("10.0.0.7:8477", "10.0.0.7", 8477),
    ("[fd00::5]:8477", "fd00::5", 8477),
    ("fd00::5:8477", "fd00::5", 8477),  # $(POD_IP):PORT on an IPv6 cluster
    ("[::1]:0", "::1", 0),
    ("localhost:65535", "localhost", 65535),
])
def test_split_reads_bracketed_and_bare_hosts(address: str, host: str, port: int) -> None:
    assert host_port.split(address) == (host, port)
    assert host_port.normalized(address) == host_port.join(host, port)


@pytest.mark.parametrize("address", ["", "nowhere", ":8477", "10.0.0.7:", "10.0.0.7:port", "10.0.0.7:70000",
                                     "[fd00::5]", "[fd00::5:8477", "fd00::5]:8477"])
def test_split_refuses_what_is_not_host_port_naming_it(address: str) -> None:
    with pytest.raises(ValueError, match=rf"--worker {address!r} is not HOST:PORT".replace("[", r"\[")):
        host_port.split(address, "--worker")


def test_a_listening_socket_takes_its_hosts_family() -> None:
    assert host_port.family("127.0.0.1") is socket.AF_INET
    assert host_port.family("::1") is socket.AF_INET6
    with socket.create_server(("::1", 0), family=host_port.family("::1")) as server:
        assert server.getsockname()[0] == "::1"


@pytest.mark.parametrize(("given", "env", "named"), [
    ("nonsense", {}, "connect(address): the controller address 'nonsense'"),
    ("127.0.0.1:abc", {}, "connect(address): the controller address '127.0.0.1:abc'"),
    (None, {"PATHWAYS_CONTROLLER": "oops"}, "PATHWAYS_CONTROLLER: the controller address 'oops'"),
])
def test_connect_refuses_a_controller_address_that_is_not_host_port_naming_where_it_came_from(
    given: str | None, env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(pw.RuntimeUnavailableError, match=re.escape(named) + " is not HOST:PORT"):
        pw.connect(given)
