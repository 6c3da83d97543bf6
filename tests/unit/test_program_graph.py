"""Program graph validation: every problem named by node and field, cycles shown as they flow."""

from __future__ import annotations

import pytest

from pathways_operator.core.island_scheduler import ScheduledComputation
from pathways_operator.core.program_graph import (
    GraphError,
    GraphNode,
    InvalidGraph,
    scheduled_computations,
    topological_order,
    validate_graph,
)

SLICES = {"enc", "dec"}


def node(name: str, slice_: str = "enc", *inputs: str) -> GraphNode:
    return GraphNode(name, slice_, tuple(inputs))


def test_valid_graph_has_no_errors() -> None:
    nodes = [node("embed", "enc", "tokens"), node("encode", "enc", "embed"), node("decode", "dec", "encode", "embed")]
    assert validate_graph(nodes, SLICES, arguments={"tokens"}) == []


def test_unknown_slice_names_node_field_and_declared_slices() -> None:
    (err,) = validate_graph([node("a", "gpu")], SLICES)
    assert err == GraphError(
        "a",
        "nodes[0].slice",
        "node 'a' runs on slice 'gpu', which the program does not declare in spec.slices "
        "(declared: dec, enc)",
    )


def test_unknown_input_is_located() -> None:
    (err,) = validate_graph([node("a"), node("b", "enc", "a", "ghost")], SLICES)
    assert err.node == "b"
    assert err.field == "nodes[1].inputs[1]"
    assert "'ghost', which is neither a node nor a program argument" in err.message


def test_duplicate_and_empty_names() -> None:
    errors = validate_graph([node("a"), node("a"), node("")], SLICES)
    assert [e.field for e in errors] == ["nodes[1].name", "nodes[2].name"]
    assert "defined twice (first at nodes[0])" in errors[0].message


def test_node_named_like_an_argument() -> None:
    (err,) = validate_graph([node("x")], SLICES, arguments={"x"})
    assert "name of a program argument" in err.message


def test_self_loop() -> None:
    (err,) = validate_graph([node("a", "enc", "a")], SLICES)
    assert err.field == "nodes[0].inputs[0]"
    assert "consumes its own output" in err.message


def test_cycle_is_shown_in_dataflow_order_from_first_declared_node() -> None:
    # a reads c, b reads a, c reads b: data flows a -> b -> c -> a.
    nodes = [node("start"), node("a", "enc", "c", "start"), node("b", "dec", "a"), node("c", "enc", "b")]
    (err,) = validate_graph(nodes, SLICES)
    assert err.node == "a"
    assert err.field == "nodes[1].inputs"
    assert err.message == "nodes form a cycle (outputs flow a -> b -> c -> a)"


def test_all_problems_reported_at_once() -> None:
    nodes = [node("a", "tpu", "b"), node("b", "enc", "a", "nope")]
    assert len(validate_graph(nodes, SLICES)) == 3  # slice, unknown input, cycle


def test_topological_order_keeps_declared_order_where_possible() -> None:
    nodes = [node("late", "enc", "mid"), node("first"), node("mid", "dec", "first"), node("free")]
    assert [n.name for n in topological_order(nodes, SLICES)] == ["first", "mid", "late", "free"]


def test_topological_order_raises_with_every_error() -> None:
    with pytest.raises(InvalidGraph) as caught:
        topological_order([node("a", "x", "a")], SLICES)
    assert len(caught.value.errors) == 2
    assert "nodes[0].slice" in str(caught.value) and "nodes[0].inputs[0]" in str(caught.value)


def test_scheduled_computations_number_nodes_topologically_on_physical_slices() -> None:
    nodes = [node("loss", "dec", "fwd", "labels"), node("fwd", "enc", "x")]
    comps = scheduled_computations(nodes, {"enc": "team-a-enc", "dec": "shared-dec"}, arguments={"x", "labels"})
    assert comps == [
        ScheduledComputation(0, "team-a-enc", ()),
        ScheduledComputation(1, "shared-dec", (0,)),
    ]


def test_deep_chain_does_not_hit_recursion_limits() -> None:
    nodes = [node("n0")] + [node(f"n{i}", "enc", f"n{i - 1}") for i in range(1, 5000)]
    nodes.append(node("n0b", "enc", "n4999"))
    nodes[0] = node("n0", "enc", "n0b")
    (err,) = validate_graph(nodes, SLICES)
    assert err.message.startswith("nodes form a cycle (outputs flow n0 -> n1 -> n2")
