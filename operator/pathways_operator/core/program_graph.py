"""Validation of a program's dataflow graph before anything is scheduled.

A PathwaysProgram's IR is a graph of compiled computations, each placed on one
of the program's named slices and consuming the outputs of other nodes or the
program's own arguments. The island scheduler needs it acyclic and in
topological order; the operator needs to reject a bad manifest with a message
that names the node and the field, as a schema would, rather than fail later
on a host. :func:`validate_graph` collects every problem in one pass (so a user
fixes them all at once) and :func:`scheduled_computations` turns a valid graph
into the scheduler's input for one call.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Collection, Mapping, Sequence

from pathways_operator.core.island_scheduler import ScheduledComputation


@dataclasses.dataclass(frozen=True)
class GraphNode:
    """One computation of the program: runs on ``slice`` and reads ``inputs``."""

    name: str
    slice: str
    """A name from the program's ``spec.slices``."""
    inputs: tuple[str, ...] = ()
    """Names of other nodes, or of program arguments."""


@dataclasses.dataclass(frozen=True)
class GraphError:
    """One problem, located like a schema error: ``nodes[3].inputs[1]``."""

    node: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidGraph(ValueError):
    """The graph has the problems in ``errors``; the message lists them all."""

    def __init__(self, errors: Sequence[GraphError]) -> None:
        self.errors = tuple(errors)
        super().__init__(
            f"program graph has {len(self.errors)} problem(s): " + "; ".join(map(str, self.errors))
        )


def validate_graph(
    nodes: Sequence[GraphNode],
    slices: Collection[str],
    arguments: Collection[str] = (),
) -> list[GraphError]:
    """Every problem of the graph: empty or repeated names, unknown slices or inputs, cycles.

    An empty list means the graph is valid. Arguments and nodes share one
    namespace, so a node may not take an argument's name.
    """
    errors: list[GraphError] = []
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not node.name:
            errors.append(GraphError(node.name, f"{where}.name", "node name must not be empty"))
        elif node.name in index:
            errors.append(
                GraphError(
                    node.name,
                    f"{where}.name",
                    f"node {node.name!r} is defined twice (first at nodes[{index[node.name]}])",
                )
            )
        elif node.name in arguments:
            errors.append(
                GraphError(
                    node.name,
                    f"{where}.name",
                    f"node {node.name!r} has the name of a program argument; rename one of them",
                )
            )
        else:
            index[node.name] = i
        if node.slice not in slices:
            known = ", ".join(sorted(slices)) or "none"
            errors.append(
                GraphError(
                    node.name,
                    f"{where}.slice",
                    f"node {node.name!r} runs on slice {node.slice!r}, which the program does "
                    f"not declare in spec.slices (declared: {known})",
                )
            )
    for i, node in enumerate(nodes):
        for j, name in enumerate(node.inputs):
            if name == node.name:
                errors.append(
                    GraphError(
                        node.name,
                        f"nodes[{i}].inputs[{j}]",
                        f"node {node.name!r} consumes its own output",
                    )
                )
            elif name not in index and name not in arguments:
                errors.append(
                    GraphError(
                        node.name,
                        f"nodes[{i}].inputs[{j}]",
                        f"node {node.name!r} reads {name!r}, which is neither a node nor a "
                        "program argument",
                    )
                )
    cycle = _find_cycle(nodes, index)
    if cycle:
        # The search walks from consumers to inputs; show it the way data flows,
        # starting from the node declared first so the message is stable.
        flow = cycle[::-1]
        start = min(range(len(flow)), key=lambda k: index[flow[k]])
        flow = flow[start:] + flow[:start]
        errors.append(
            GraphError(
                flow[0],
                f"nodes[{index[flow[0]]}].inputs",
                "nodes form a cycle (outputs flow " + " -> ".join(flow + [flow[0]]) + ")",
            )
        )
    return errors


def topological_order(
    nodes: Sequence[GraphNode],
    slices: Collection[str],
    arguments: Collection[str] = (),
) -> list[GraphNode]:
    """The nodes in an order where inputs come first; declared order is kept where it can be.

    Raises :class:`InvalidGraph` carrying every problem when the graph is invalid.
    """
    errors = validate_graph(nodes, slices, arguments)
    if errors:
        raise InvalidGraph(errors)
    by_name = {n.name: n for n in nodes}
    position = {n.name: i for i, n in enumerate(nodes)}
    waiting_on = {n.name: {i for i in n.inputs if i in by_name} for n in nodes}
    consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
    for n in nodes:
        for i in set(n.inputs):
            if i in by_name:
                consumers[i].append(n.name)
    ready = [position[name] for name, deps in waiting_on.items() if not deps]
    heapq.heapify(ready)
    order: list[GraphNode] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for consumer in consumers[node.name]:
            waiting_on[consumer].discard(node.name)
            if not waiting_on[consumer]:
                heapq.heappush(ready, position[consumer])
    return order


def scheduled_computations(
    nodes: Sequence[GraphNode],
    physical_slices: Mapping[str, str],
    arguments: Collection[str] = (),
) -> list[ScheduledComputation]:
    """The island scheduler's input for one call: nodes numbered in topological order.

    ``physical_slices`` maps the program's slice names to VirtualSlice names.
    """
    ordered = topological_order(nodes, physical_slices.keys(), arguments)
    number = {n.name: i for i, n in enumerate(ordered)}
    return [
        ScheduledComputation(
            node=number[n.name],
            slice_id=physical_slices[n.slice],
            deps=tuple(sorted({number[i] for i in n.inputs if i in number})),
        )
        for n in ordered
    ]


def _find_cycle(nodes: Sequence[GraphNode], index: Mapping[str, int]) -> list[str]:
    """One cycle through known nodes as a path of names, or [] (iterative DFS, no recursion limit)."""
    inputs = {n.name: [i for i in n.inputs if i in index and i != n.name] for n in nodes if n.name in index}
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in inputs:
        if root in state:
            continue
        path: list[str] = [root]
        iters = [iter(inputs[root])]
        state[root] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(inputs[nxt]))
    return []
