"""A two-host slice whose hosts have IPv6 addresses forms its JAX job and computes.

On an IPv6 cluster a host pod's addresses come from ``$(POD_IP):PORT`` bare
(``fd00::5:8477``); gRPC, JAX's coordination service and the session ports need the
host in brackets and an IPv6 socket. Real processes on ``::1``: both workers and
sidecars are given bare addresses, as pods are, and print bracketed ones; the slice
runs a computation with cross-host collectives, its input put and its outputs fetched
over the sidecars' gRPC and session ports.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pathways_wire import pathways_pb2 as pb
from tests.integration.test_host import (
    B_MESH, F32, X, ControlStream, computation, fetch, grants, health, launch, program, put, start_slice,
    stop_hosts, wait_for,
)

pytestmark = pytest.mark.timeout(240)


def test_a_slice_on_ipv6_addresses_forms_its_jax_job_and_runs_collectives(tmp_path: Path) -> None:
    hosts = start_slice("ipv6", ["::1", "::1"], 4, tmp_path)
    streams: list[ControlStream] = []
    try:
        addresses = [h.address for h in hosts]
        assert all(a.startswith("[::1]:") for a in addresses), addresses
        assert [health(a).worker_ready for a in addresses] == [True, True]
        assert all(health(a).data_address.startswith("[::1]:") for a in addresses)

        def f(x: jax.Array) -> tuple[jax.Array, jax.Array]:
            return jnp.sum(x, axis=0), x * 10.0  # a psum across the hosts, and a value that stays split

        prog = program("v6", [
            computation(0, "collect", "b", f, [(-1, 0)], [(X, F32, P("x"))], (P(), P("x")), B_MESH),
        ], num_inputs=1)
        streams = [ControlStream(a) for a in addresses]
        for address, ctl in zip(addresses, streams, strict=True):
            def said_hello(ctl: ControlStream = ctl, address: str = address) -> bool:
                return bool(ctl.hello == address)

            wait_for("hello", said_hello)
            ctl.send(load=pb.HostProgram(program_id="v6", program=prog, slice="b"))
            ctl.send(launch=launch("v1", "v6", outputs=[(0, 0), (0, 1)]))
            ctl.send(grants=grants("v1", [(1, 0)]))
        x = np.arange(64, dtype=np.float32).reshape(X)
        for address in addresses:
            put(address, "v1", (-1, 0), x)
        for ctl in streams:
            assert [c.ok for c in ctl.wait("v1", 1, timeout_s=60)] == [True]
        np.testing.assert_array_equal(fetch(addresses, "v1", (0, 0)), x.sum(axis=0))
        np.testing.assert_array_equal(fetch(addresses, "v1", (0, 1)), x * 10.0)
        for ctl in streams:
            ctl.send(release=pb.ReleaseCall(call_id="v1"))
        for log in (log for h in hosts for log in h.logs):
            assert "not usable" not in log.read_text(), f"{log}: a session port fell back to gRPC"
    finally:
        for ctl in streams:
            ctl.close()
        stop_hosts(hosts)
