"""Call progress and gang states, decided without a controller, a host or a clock."""

from __future__ import annotations

import pytest

from pathways_operator.core.call_tracking import (
    HOST_FAILURE_GRACE_S,
    CallProgress,
    InvalidTransition,
    check_gang_move,
)


def call(total: int = 2) -> CallProgress:
    return CallProgress(call_id="c1", program="train", slices=frozenset({"s-1"}), total=total)


def test_a_grant_is_done_only_when_every_host_of_the_gang_reported_it() -> None:
    progress = call(total=1)
    progress.granted(("s-1", 0), hosts=2)
    first = progress.report(("s-1", 0), "h0", ok=True, error="", node=0)
    assert first is not None and not first.grant_done and progress.running
    second = progress.report(("s-1", 0), "h1", ok=True, error="", node=0)
    assert second is not None and second.grant_done
    assert progress.state == "succeeded" and progress.completed == 1 and progress.waiting == {}


def test_a_report_for_a_grant_not_waited_for_changes_nothing() -> None:
    progress = call()
    assert progress.report(("s-1", 7), "h0", ok=True, error="", node=0) is None
    assert progress.completed == 0 and progress.running


def test_a_failed_report_on_a_one_host_gang_fails_the_call_at_once() -> None:
    progress = call()
    progress.granted(("s-1", 0), hosts=1)
    failed = progress.report(("s-1", 0), "h0", ok=False, error="", node=3)
    assert failed is not None and failed.grant_done and failed.failed_now == "computation 3 failed on h0"
    assert progress.state == "failed" and progress.message == "computation 3 failed on h0"


def test_the_first_failure_on_a_multi_host_gang_fails_the_call_once_every_host_reported() -> None:
    progress = call()
    progress.granted(("s-1", 0), hosts=2)
    held = progress.report(("s-1", 0), "h0", ok=False, error="", node=3, now=10.0)
    assert held is not None and held.failed_now == "" and progress.running
    again = progress.report(("s-1", 0), "h1", ok=False, error="boom", node=3, now=10.5)
    assert again is not None and again.grant_done and again.failed_now == "computation 3 failed on h0"
    assert progress.state == "failed" and progress.message == "computation 3 failed on h0"
    assert progress.completed == 0 and progress.due(99.0) == ""


def test_a_held_failure_fails_the_call_when_its_grace_ends_without_news_of_a_dead_host() -> None:
    progress = call()
    progress.granted(("s-1", 0), hosts=2)
    progress.report(("s-1", 0), "h0", ok=False, error="gloo: connection closed by peer", node=0, now=10.0)
    assert progress.due(10.0 + HOST_FAILURE_GRACE_S / 2) == "" and progress.running
    assert progress.due(10.0 + HOST_FAILURE_GRACE_S) == "gloo: connection closed by peer"
    assert progress.state == "failed"


def test_a_dead_host_reported_within_the_grace_names_the_call_failure() -> None:
    progress = call()
    progress.granted(("s-1", 0), hosts=2)
    progress.report(("s-1", 0), "h0", ok=False, error="gloo: connection closed by peer", node=0, now=10.0)
    progress.fail("host h1 of slice 's' failed (killed by signal 9)")  # the gang was lost
    assert progress.message == "host h1 of slice 's' failed (killed by signal 9)"
    assert progress.due(10.0 + HOST_FAILURE_GRACE_S) == ""


def test_a_finished_call_cannot_move_again_and_the_error_names_it() -> None:
    progress = call(total=1)
    progress.granted(("s-1", 0), hosts=1)
    progress.report(("s-1", 0), "h0", ok=True, error="", node=0)
    with pytest.raises(InvalidTransition, match=r"program 'train' call c1: cannot move from 'succeeded' to 'failed'"):
        progress.fail("late")


def test_stragglers_name_the_hosts_that_owe_grants_and_forgetting_a_slice_clears_them() -> None:
    progress = call(total=3)
    progress.granted(("s-1", 0), hosts=2)
    progress.granted(("s-1", 1), hosts=2)
    progress.report(("s-1", 0), "h0", ok=True, error="", node=0)
    hosts = {"s-1": [("h0", "h0 (10.0.0.1:1)"), ("h1", "h1 (10.0.0.2:1)")]}
    said = progress.stragglers(hosts)
    assert said == (
        "0/3 computations done; waiting on host h0 (10.0.0.1:1) has not completed grant(s) [1]; "
        "host h1 (10.0.0.2:1) has not completed grant(s) [0, 1]"
    )
    progress.forget_slice("s-1")
    assert progress.waiting == {} and progress.reported == {}
    assert progress.stragglers(hosts).endswith("the rest are not granted yet "
                                               "(waiting for their inputs or behind other programs on the slice)")


def test_gang_moves_follow_the_declared_transitions() -> None:
    assert check_gang_move("train", "launching", "ready") == "ready"
    assert check_gang_move("train", "ready", "lost") == "lost"
    assert check_gang_move("train", "lost", "ready") == "ready"
    assert check_gang_move("train", "lost", "failed") == "failed"
    with pytest.raises(InvalidTransition, match=r"slice 'train' gang: cannot move from 'released' to 'ready'"):
        check_gang_move("train", "released", "ready")
    with pytest.raises(InvalidTransition):
        check_gang_move("train", "launching", "lost")


def test_a_run_reported_by_every_host_is_done_as_its_grants_reported_one_by_one() -> None:
    progress = call(total=4)
    progress.granted_run("s-1", 10, 4, hosts=2)
    assert progress.report_run("s-1", 10, 4, "h0") == ([], "")
    assert progress.running and progress.completed == 0
    assert progress.report_run("s-1", 9, 6, "h1") == ([10, 11, 12, 13], ""), "seqs not waited for are passed over"
    assert progress.state == "succeeded" and progress.waiting == {} and progress.reported == {}


def test_a_run_that_completes_a_grant_with_a_held_failure_fails_the_call_with_it() -> None:
    progress = call(total=3)
    progress.granted_run("s-1", 0, 3, hosts=2)
    progress.report(("s-1", 0), "h0", ok=False, error="gloo: peer went away", node=0, now=10.0)
    progress.report_run("s-1", 1, 2, "h0")
    done, failed_now = progress.report_run("s-1", 0, 3, "h1")
    assert done == [0, 1, 2] and failed_now == "gloo: peer went away"
    assert progress.state == "failed" and progress.message == "gloo: peer went away"
