"""A slice's phase comes from what the operator observes, never from the status it reads back."""

from __future__ import annotations

import pytest

from pathways_operator.core.phases import SlicePhase
from pathways_operator.core.slice_phase import (
    SliceObservation,
    SliceRecord,
    current_generation,
    observed_phase,
    parse_record,
)

_S = SlicePhase
WHOLE = SliceObservation(placed=True, hosts=2, pods=2, registered=True)


@pytest.mark.parametrize(
    ("observed", "phase"),
    [
        (SliceObservation(), _S.PENDING),
        (WHOLE, _S.READY),
        (SliceObservation(placed=True, hosts=2, pods=1, registered=True), _S.LAUNCHING),
        (SliceObservation(placed=True, hosts=2, pods=2, registered=False), _S.LAUNCHING),
        (SliceObservation(placed=True, hosts=2), _S.LAUNCHING),
        (SliceObservation(draining=True), _S.RECOVERING),
        (SliceObservation(draining=True, preempted=True), _S.PENDING),
        (SliceObservation(suspended=True), _S.SUSPENDED),
        (SliceObservation(suspended=True, draining=True), _S.RECOVERING),
        (SliceObservation(failure="pod x-1 failed; recreated 3 times"), _S.FAILED),
        (SliceObservation(failure="restarts exhausted", placed=True, hosts=2, pods=2, registered=True), _S.FAILED),
    ],
)
def test_phase_follows_the_observations(observed: SliceObservation, phase: SlicePhase) -> None:
    assert observed_phase(observed) is phase


def test_a_whole_registered_gang_is_ready_whatever_status_says() -> None:
    # The observation has no status input at all: a forged status.phase=Failed cannot reach it.
    assert "phase" not in SliceObservation.__dataclass_fields__
    assert observed_phase(WHOLE) is _S.READY


def test_only_the_recorded_failure_makes_a_slice_failed() -> None:
    assert observed_phase(SliceObservation(failure="")) is _S.PENDING
    assert observed_phase(SliceObservation(failure="gone")) is _S.FAILED


@pytest.mark.parametrize(
    ("restarts", "failure", "record"),
    [
        ("2", None, SliceRecord(2, "")),
        (None, None, SliceRecord(0, "")),
        ("", "", SliceRecord(0, "")),
        ("-1", None, SliceRecord(0, "")),
        ("lots", None, SliceRecord(0, "")),
        (" 3 ", " pod x-0 failed ", SliceRecord(3, "pod x-0 failed")),
    ],
)
def test_record_reads_its_annotations_and_ignores_garbage(
    restarts: str | None, failure: str | None, record: SliceRecord
) -> None:
    assert parse_record(restarts, failure) == record


def test_running_pods_say_which_generation_is_current_whatever_is_recorded() -> None:
    assert current_generation(99, [(0, False), (0, False)]) == 0
    assert current_generation(0, [(2, False)]) == 2


def test_record_counts_while_no_gang_runs() -> None:
    assert current_generation(3, []) == 3
    # Recreating: the record says 3, the old gang of 2 is being deleted.
    assert current_generation(3, [(2, True), (2, True)]) == 3
    # A pod still existing keeps its generation used, even if the record is behind.
    assert current_generation(0, [(4, True)]) == 4
