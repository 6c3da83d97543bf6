"""Soak: many programs through one operator; nothing is left behind and it does not grow.

``PATHWAYS_SOAK_PROGRAMS`` programs (10 in ``make test``, 100 in ``make soak``) of mixed
sizes run in waves of ``WAVE``: most bring their own inline slice of 2 or 4 devices,
every third shares the VirtualSlice ``pool``. Afterwards: every program Succeeded with
the paper example's results; the shared slice's sidecars and workers hold no bytes
(Health ``store_bytes``/``worker_store_bytes``); once the programs are deleted no pod,
inline slice or results ConfigMap is left in the namespace; and the operator's resident
memory grew by at most ``RSS_GROWTH_BOUND_MIB`` over the run (drivers are separate
processes, so this is the operator's own bookkeeping).
"""

from __future__ import annotations

import json
import os
import time

import grpc
import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import call_metadata
from pathways_wire.kube_names import SIDECAR_PORT
from tests.cluster.builders import inline_slice, program, ref_slice, virtual_slice
from tests.cluster.harness import Objects, OperatorProcess

PROGRAMS = int(os.environ.get("PATHWAYS_SOAK_PROGRAMS", "10"))
WAVE = 4
RSS_GROWTH_BOUND_MIB = 150.0


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _store_bytes(pod_ip: str, token: str) -> tuple[int, int]:
    with grpc.insecure_channel(f"{pod_ip}:{SIDECAR_PORT}") as channel:
        reply = pb_grpc.DataflowStub(channel).Health(pb.HealthRequest(), timeout=10, metadata=call_metadata(token))
    assert reply.detailed, f"the sidecar at {pod_ip} did not take the slice's token: its stores are not told"
    return int(reply.store_bytes), int(reply.worker_store_bytes)


@pytest.mark.timeout(120 + 40 * PROGRAMS, func_only=True)
def test_soak_leaves_nothing_behind(objects: Objects, operator: OperatorProcess) -> None:
    assert operator.process is not None
    pid = operator.process.pid
    objects.apply(virtual_slice("pool", 4))
    objects.wait_slice("pool", "Ready", 120, operator)
    rss_before = _rss_mib(pid)
    started = time.monotonic()
    names = [f"soak-{i}" for i in range(PROGRAMS)]
    for first in range(0, PROGRAMS, WAVE):
        wave = names[first:first + WAVE]
        for i, name in enumerate(wave, start=first):
            where = ref_slice("main", "pool") if i % 3 == 0 else inline_slice("main", 2 if i % 2 else 4)
            objects.apply(program(name, "examples.programs:paper_example", where, steps=1 + i % 3))
        for name in wave:
            done = objects.wait_program(name, {"Succeeded", "Failed"}, 240, operator)
            assert done["status"]["phase"] == "Succeeded", (name, done["status"].get("message"))
            data = objects.configmap(done["status"]["results"]["configMap"])
            devices = len(json.loads(data["y"]))
            assert json.loads(data["y"]) == [2.0 * k + 1 for k in range(1, devices + 1)]
    elapsed = time.monotonic() - started
    rss_after = _rss_mib(pid)
    print(f"\nsoak: {PROGRAMS} programs in {elapsed:.0f} s; operator RSS {rss_before:.0f} -> "
          f"{rss_after:.0f} MiB (bound +{RSS_GROWTH_BOUND_MIB:.0f})")

    pool_hosts = objects.slice("pool")["status"]["hosts"]
    token = objects.slice_token("pool")
    held = {h["pod"]: _store_bytes(h["podIP"], token) for h in pool_hosts}
    assert all(b == (0, 0) for b in held.values()), f"bytes left in the shared slice's stores: {held}"

    for name in names:
        objects.delete("pathwaysprograms", name)
    objects.cluster.poll(
        lambda: not objects.pods("pathways.dev/slice,pathways.dev/slice!=pool")
        and [s["metadata"]["name"] for s in objects.custom.list_namespaced_custom_object(
            "pathways.dev", "v1alpha1", objects.namespace, "virtualslices")["items"]] == ["pool"]
        and not [c for c in objects.core.list_namespaced_config_map(objects.namespace).items
                 if c.metadata.name.startswith("soak-")],
        timeout=120, interval=1.0, what="pods, inline slices and results ConfigMaps of the soak deleted",
    )
    assert operator.alive()
    assert rss_after - rss_before <= RSS_GROWTH_BOUND_MIB, (rss_before, rss_after)
