"""The operator touches an object only when its controller reference is the slice's own uid."""

from __future__ import annotations

from collections.abc import Mapping

from pathways_operator.core.ownership import (
    Ownership,
    OwnerRef,
    describe_controller,
    owner_refs,
    ownership,
)

SLICE = {"kind": "VirtualSlice", "name": "x", "uid": "uid-now"}


def refs(*entries: Mapping[str, object]) -> tuple[OwnerRef, ...]:
    return owner_refs({"ownerReferences": list(entries)})


def judge(*entries: Mapping[str, object]) -> Ownership:
    return ownership(refs(*entries), kind="VirtualSlice", name="x", uid="uid-now")


def test_controlled_by_this_slice_is_owned() -> None:
    assert judge({**SLICE, "controller": True}) is Ownership.OWNED


def test_a_same_named_object_without_owner_is_foreign() -> None:
    assert judge() is Ownership.FOREIGN


def test_a_plain_owner_reference_without_controller_is_not_ownership() -> None:
    # Anyone can add a non-controller reference to the slice; it proves nothing.
    assert judge({**SLICE, "controller": False}) is Ownership.FOREIGN
    assert judge(SLICE) is Ownership.FOREIGN


def test_controlled_by_something_else_is_foreign() -> None:
    assert judge({"kind": "Deployment", "name": "x", "uid": "uid-now", "controller": True}) is Ownership.FOREIGN
    assert judge({"kind": "VirtualSlice", "name": "other", "uid": "u2", "controller": True}) is Ownership.FOREIGN


def test_an_earlier_slice_of_the_same_name_is_told_apart() -> None:
    assert judge({**SLICE, "uid": "uid-before", "controller": True}) is Ownership.EARLIER


def test_an_empty_uid_never_owns() -> None:
    empty = refs({**SLICE, "uid": "", "controller": True})
    assert ownership(empty, kind="VirtualSlice", name="x", uid="") is not Ownership.OWNED


def test_messages_name_the_controller() -> None:
    assert describe_controller(refs()) == "no controller"
    assert describe_controller(refs({"kind": "Job", "name": "j", "uid": "1", "controller": True})) == "controlled by Job j"
