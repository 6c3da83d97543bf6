"""Where gangs come from: the embedded and Kubernetes strategies, up to the point a host would start."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pathways_wire import ir
from pathways_operator.controller import Controller, ControllerError, EmbeddedGangs, Host, HostRequest, KubernetesGangs
from pathways_operator.controller.gangs import gang_requests, slice_key
from tests.unit.builders import island
from tests.unit.controller_builders import slice_record


class RecordingLauncher:
    """A launcher that must not be asked: the tests stop before any host starts."""

    def __init__(self) -> None:
        self.launched: list[HostRequest] = []

    def launch(self, requests: Sequence[HostRequest]) -> Sequence[Host]:
        self.launched.extend(requests)
        raise AssertionError("no host may be launched here")

    def stop(self, hosts: Sequence[Host]) -> None:
        raise AssertionError("no host may be stopped here")


def test_each_runtime_gets_its_own_gang_strategy() -> None:
    embedded = Controller.embedded(lambda: island("island-a", 1, 4), RecordingLauncher())
    kubernetes = Controller.kubernetes(lambda: [])
    assert isinstance(embedded.gangs, EmbeddedGangs)
    assert isinstance(kubernetes.gangs, KubernetesGangs)


def test_a_slice_named_like_its_id_is_shared_and_any_other_is_its_clients_own() -> None:
    assert slice_key(ir.SliceDecl("train", "train", 8), "client-1") == "train"
    assert slice_key(ir.SliceDecl("v0", "train", 8), "client-1") == "client-1/v0"


def test_a_gang_asks_for_one_host_per_placed_machine_with_the_slice_token() -> None:
    rec = slice_record("a", 2, token="tok")
    assert gang_requests(rec) == [
        HostRequest("a", "a-phys", 0, 2, 4, "island-a-m0", "tok"),
        HostRequest("a", "a-phys", 1, 2, 4, "island-a-m1", "tok"),
    ]


def test_an_embedded_slice_no_island_can_hold_is_refused_before_any_host_starts() -> None:
    launcher = RecordingLauncher()
    controller = Controller.embedded(lambda: island("island-a", 2, 4), launcher)
    with pytest.raises(ControllerError) as err:
        controller.create_slice(ir.SliceDecl("big", "big", 64), "client-1", timeout_s=0)
    assert err.value.code == "FAILED_PRECONDITION"
    assert "big" in str(err.value)
    assert launcher.launched == []
    assert list(controller.describe().slices) == []


def test_an_embedded_slice_that_must_wait_for_room_is_refused_when_its_time_is_up() -> None:
    launcher = RecordingLauncher()
    controller = Controller.embedded(lambda: island("island-a", 2, 4, used=(4, 4)), launcher)
    with pytest.raises(ControllerError) as err:
        controller.create_slice(ir.SliceDecl("s", "s", 4), "client-1", timeout_s=0)
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert "waited 0 s for room" in str(err.value)
    assert launcher.launched == []


def test_a_virtual_slice_the_operator_has_not_registered_says_why() -> None:
    controller = Controller.kubernetes(lambda: [], explain_missing=lambda key: f"{key} waits for devices")
    with pytest.raises(ControllerError) as err:
        controller.create_slice(ir.SliceDecl("train", "train", 8), "driver", timeout_s=0, namespace="ml")
    assert err.value.code == "UNAVAILABLE"
    assert str(err.value) == "VirtualSlice ml/train is not Ready: ml/train waits for devices"


def test_forgetting_an_unknown_virtual_slice_changes_nothing() -> None:
    controller = Controller.kubernetes(lambda: [])
    controller.gangs.gang_lost("ml/train", "pods lost")
    controller.gangs.unregister_gang("ml/train")
    assert list(controller.describe().slices) == []
