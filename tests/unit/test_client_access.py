"""Who may use which slice: a program's token grants its own VirtualSlices, nothing else."""

from __future__ import annotations

from pathways_operator.core.client_access import ClientScope, Grants, slice_refusal, unauthenticated

TRAIN = ClientScope.program("ns", "train", ["train-main", "shared"])


def test_a_program_may_use_its_own_slices_in_its_namespace() -> None:
    assert slice_refusal(TRAIN, "ns", "train-main") is None
    assert slice_refusal(TRAIN, "ns", "shared") is None


def test_another_programs_slice_is_refused_naming_the_program_and_the_slice() -> None:
    assert slice_refusal(TRAIN, "ns", "eval-main") == (
        "program ns/train may use only its own slices (shared, train-main); slice ns/eval-main "
        "is not one of its spec.slices"
    )


def test_a_slice_of_the_same_name_in_another_namespace_is_refused() -> None:
    refusal = slice_refusal(TRAIN, "other", "shared")
    assert refusal is not None and "only VirtualSlices of namespace ns" in refusal and "other/shared" in refusal


def test_the_embedded_runtimes_client_may_use_any_slice() -> None:
    local = ClientScope.everything("the embedded runtime's client")
    assert slice_refusal(local, "", "") is None
    assert slice_refusal(local, "ns", "eval-main") is None


def test_unauthenticated_callers_are_told_which_credential_is_missing() -> None:
    assert "no client token was presented (gRPC metadata x-pathways-client-token)" in unauthenticated(
        False, "x-pathways-client-token")
    assert "belongs to no running PathwaysProgram" in unauthenticated(True, "x-pathways-client-token")


def test_a_program_binds_only_slices_it_placed_and_runs_only_what_it_loaded() -> None:
    evaluator = ClientScope.program("ns", "eval", ["eval-main"])
    grants = Grants()
    grants.slice_placed(TRAIN, "s1", "ns", "train-main")
    grants.slice_placed(evaluator, "s2", "ns", "eval-main")
    assert grants.slice_refusal(TRAIN, "s1") is None
    assert grants.slice_refusal(TRAIN, "s2") == (
        "program ns/train did not place slice s2 (VirtualSlice ns/eval-main): ask for one of its own slices "
        "with CreateSlice first"
    )
    grants.program_loaded(TRAIN, "p1")
    assert grants.program_refusal(TRAIN, "p1") is None
    assert grants.program_refusal(evaluator, "p1") == (
        "program ns/eval did not load program p1: load it with LoadProgram first")
    grants.call_started(TRAIN, "c1")
    assert grants.call_refusal(evaluator, "c1") == "program ns/eval did not start call c1"
    assert grants.call_refusal(TRAIN, "c1") is None


def test_a_client_id_belongs_to_the_program_that_first_used_it() -> None:
    evaluator = ClientScope.program("ns", "eval", ["eval-main"])
    grants = Grants()
    grants.client_used(TRAIN, "client-train-1")
    assert grants.client_refusal(TRAIN, "client-train-1") is None
    assert grants.client_refusal(evaluator, "client-train-1") == (
        "program ns/eval may not act for client 'client-train-1', which program ns/train uses: "
        "name its own client id"
    )
    assert grants.client_refusal(evaluator, "client-eval-1") is None
    grants.client_used(evaluator, "client-train-1")  # a later use does not take the id over
    assert grants.client_refusal(evaluator, "client-train-1") is not None


def test_waits_that_hold_a_thread_are_bounded_per_client_and_counted_off_as_they_end() -> None:
    evaluator = ClientScope.program("ns", "eval", ["eval-main"])
    grants = Grants()
    assert grants.wait_refusal(TRAIN, 2) is None
    assert grants.wait_refusal(TRAIN, 2) is None
    refusal = grants.wait_refusal(TRAIN, 2)
    assert refusal is not None and "program ns/train has 2 waits" in refusal and "calls port" in refusal
    assert grants.wait_refusal(evaluator, 2) is None  # another client's bound is its own
    grants.wait_ended(TRAIN)
    assert grants.wait_refusal(TRAIN, 2) is None
    for _ in range(3):
        grants.wait_ended(TRAIN)
    assert grants.wait_refusal(TRAIN, 1) is None  # ended more than begun: never below none
