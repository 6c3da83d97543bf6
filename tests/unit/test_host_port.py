"""HOST:PORT addresses: IPv6 hosts in brackets, a pod's bare IPv6 address read too."""

from __future__ import annotations

import socket

import pytest

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
