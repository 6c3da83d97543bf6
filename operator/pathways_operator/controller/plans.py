"""How one program call is laid out over its gangs' hosts, decided without I/O.

For every host, a `Launch` says which values it sends to which hosts of other
slices (with the receiving slice's token), which values it expects and from how
many senders, and which outputs it keeps; the `RunReply` tells the client
where to put its inputs (and, per slice reading each, its hosts in order, so
the client can send each host only the block it reads) and where its outputs live. The plan depends only on
the program and the gangs (slice id and generation), so it is made once per
program and set of gangs and then stamped with each call's id and its small
inputs. The island scheduler's grants, not the plan, decide when hosts run.

A program input that names an object (a handle the client passed back) is
placed per call (`place_object`): bound in place on the slice that holds it,
and sent host to host from the holding hosts to every other slice reading it.

A value sent to a multi-host slice that shards it goes to each of its hosts as
only the block that host's devices read (`destination_blocks`, from the input
shardings the client recorded in the program): each producer host sends a
destination just its pieces' parts inside that block.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pathways_wire import host_blocks, ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import client_token, route_token
from pathways_operator.controller.programs import PlanKey, ProgramRecord

INLINE_OUTPUT_BYTES = 64 << 10
"""Outputs up to this size come back inline with their completion (on a multi-host slice,
from host 0, if it holds them whole)."""


class SidecarHost(Protocol):
    @property
    def sidecar_address(self) -> str: ...


class PlannedGang(Protocol):
    """What planning needs of a slice's current gang."""

    @property
    def slice_id(self) -> str: ...

    @property
    def generation(self) -> int: ...

    @property
    def token(self) -> str: ...

    @property
    def hosts(self) -> Sequence[SidecarHost]: ...


def host_program(program: ir.Program, program_id: str, vslice: str) -> pb.HostProgram:
    """The program as one host of `vslice` sees it: only its own artifacts."""
    msg = program.to_proto()
    for comp in msg.computations:
        if comp.slice != vslice:
            comp.artifact = b""
    return pb.HostProgram(program_id=program_id, program=msg, slice=vslice)


def destination_blocks(
    program: ir.Program, value: ir.ValueRef, hosts: Mapping[str, Sequence[str]], destinations: Sequence[str]
) -> list[pb.Region]:
    """Per destination (same order), the block of `value` it must receive: the union of
    what its devices read for every computation of the slices in `hosts` (virtual slice
    id -> its sidecar addresses, host 0 first) that reads it; empty for the whole value.
    No blocks at all where every destination reads the whole value (nothing to cut).
    A reading whose sharding the program does not record reads it whole."""
    shape = program.spec_of(value).shape
    readings: list[host_blocks.Reading] = []
    for c in program.computations:
        if c.slice not in hosts:
            continue
        for position, ref in enumerate(c.inputs):
            if ref != value:
                continue
            axes = c.axes_of(position)
            readings.append(host_blocks.Reading(
                tuple(hosts[c.slice]),
                axes if axes is not None else (("",),) * max(len(shape), 1),
                c.mesh_shape,
                c.mesh_axes,
            ))
    needs = host_blocks.host_needs(shape, readings)
    blocks = [needs.get(a, host_blocks.Block.whole(shape)) for a in destinations]
    if all(b.is_whole(shape) for b in blocks):
        return []
    return [
        pb.Region() if b.is_whole(shape) else pb.Region(start=b.start, stop=b.stop) for b in blocks
    ]


def _by_host(addresses: Mapping[str, list[str]], by_slice: Mapping[str, str]) -> dict[str, str]:
    """Each host address of the slices in `by_slice` with its slice's form of the token:
    derived once per slice, not per host."""
    return {a: form for vid, form in by_slice.items() for a in addresses[vid]}


def plan_call(
    program: ir.Program,
    call_id: str,
    program_id: str,
    slices: Mapping[str, PlannedGang],
) -> tuple[pb.RunReply, dict[str, list[pb.Launch]]]:
    """Per-host launches for one call: routes, expected senders and outputs."""
    addresses = {vid: [h.sidecar_address for h in rec.hosts] for vid, rec in slices.items()}
    tokens = _by_host(addresses, {vid: client_token(rec.token) for vid, rec in slices.items()})
    consumers = program.consumers()
    producer_slice = {
        ir.ValueRef(c.index, i): c.slice
        for c in program.computations
        for i in range(len(c.outputs))
    }
    routes: dict[str, dict[ir.ValueRef, list[str]]] = defaultdict(dict)
    readers: dict[ir.ValueRef, dict[str, list[str]]] = defaultdict(dict)
    expects: dict[str, dict[ir.ValueRef, int]] = defaultdict(dict)
    input_hosts: dict[int, list[str]] = defaultdict(list)
    input_readers: dict[int, list[str]] = defaultdict(list)
    for ref, nodes in consumers.items():
        for node in nodes:
            target = program.computations[node].slice
            if ref.is_program_input:
                for a in addresses[target]:
                    if a not in input_hosts[ref.index]:
                        input_hosts[ref.index].append(a)
                if target not in input_readers[ref.index]:
                    input_readers[ref.index].append(target)
                continue
            source = producer_slice[ref]
            if source == target:
                continue
            dests = routes[source].setdefault(ref, [])
            readers[ref][target] = addresses[target]
            for a in addresses[target]:
                if a not in dests:
                    dests.append(a)
            expects[target][ref] = len(addresses[source])
    targets = {vid for reading in readers.values() for vid in reading}  # the slices routes send to
    route_tokens = _by_host(addresses, {vid: route_token(slices[vid].token) for vid in targets})
    outputs_by_slice: dict[str, list[ir.ValueRef]] = defaultdict(list)
    reply = pb.RunReply(host_tokens={a: t for a, t in tokens.items() if t})
    for ref in program.outputs:
        if ref.is_program_input:
            reply.outputs.add()
            continue
        source = producer_slice[ref]
        if ref not in outputs_by_slice[source]:
            outputs_by_slice[source].append(ref)
        reply.outputs.add(hosts=addresses[source], generation=slices[source].generation)
    for i in range(len(program.inputs)):
        reply.inputs.add(
            hosts=input_hosts.get(i, []),
            readers=[pb.InputReader(slice=vid, hosts=addresses[vid]) for vid in input_readers.get(i, [])],
        )
    launches: dict[str, list[pb.Launch]] = {}
    for vid in slices:
        launch = pb.Launch(
            call_id=call_id,
            program_id=program_id,
            routes=[
                pb.Route(
                    value=ref.to_proto(), destinations=dests,
                    destination_tokens=[route_tokens[a] for a in dests],
                    destination_blocks=destination_blocks(program, ref, readers[ref], dests),
                )
                for ref, dests in sorted(routes[vid].items())
            ],
            expects=[
                pb.Expect(value=ref.to_proto(), senders=n) for ref, n in sorted(expects[vid].items())
            ],
            outputs=[ref.to_proto() for ref in outputs_by_slice[vid]],
        )
        launches[vid] = [launch] * len(addresses[vid])
    return reply, launches


def call_launches(
    prec: ProgramRecord,
    slices: Mapping[str, PlannedGang],
    call_id: str,
    inputs: Sequence[pb.InlineValue],
) -> tuple[pb.RunReply, dict[str, list[pb.Launch]]]:
    """The call's launches: the program's plan for these gangs, stamped with the call.

    The plan is kept on `prec` until the gangs change; inputs ride with the
    launches of the slices that read them, so the reply leaves them nothing to Put."""
    gangs: PlanKey = tuple(sorted((vid, rec.slice_id, rec.generation) for vid, rec in slices.items()))
    if prec.launch_plan is None or prec.launch_plan[0] != gangs:
        reply, launches = plan_call(prec.program, "", prec.program_id, slices)
        for vid in slices:
            for launch in launches[vid]:
                launch.inline_output_bytes = INLINE_OUTPUT_BYTES
        prec.launch_plan = (gangs, reply, launches)
    _, template, planned = prec.launch_plan
    readers = prec.readers_of_inputs() if inputs else {}
    stamped: dict[str, list[pb.Launch]] = {}
    for vid, per_host in planned.items():
        launch = pb.Launch()
        launch.CopyFrom(per_host[0])
        launch.call_id = call_id
        launch.inputs.extend(x for x in inputs if vid in readers.get(x.value.index, ()))
        stamped[vid] = [launch] * len(per_host)
    reply = pb.RunReply()
    reply.CopyFrom(template)
    for x in inputs:
        if 0 <= x.value.index < len(reply.inputs):
            del reply.inputs[x.value.index].hosts[:]  # it came with the call
            del reply.inputs[x.value.index].readers[:]
    return reply, stamped


@dataclass
class ObjectPlacement:
    """Where one object input of a call comes from, per reading slice (virtual id)."""

    aliases: dict[str, pb.Alias] = field(default_factory=dict)
    """Slices holding the object: the input is the object, in place."""
    expects: dict[str, pb.Expect] = field(default_factory=dict)
    """Other slices: the input arrives from every host of the holding slice."""
    forward: pb.Forward | None = None
    """What the holding slice's hosts send, and to whom (None: nothing leaves them)."""


def place_object(
    program: ir.Program,
    call_id: str,
    index: int,
    obj: pb.ObjectRef,
    holder: PlannedGang,
    slices: Mapping[str, PlannedGang],
) -> ObjectPlacement:
    """Program input `index` of the call is the object `obj`, held by the gang `holder`.

    Each slice reading the input on the holder's gang uses the object in place;
    every other reading slice expects it from each of the holder's hosts, which
    send it on as the routed values of a program go (the receivers assemble it
    and take it in their own sharding)."""
    placed = ObjectPlacement()
    value = pb.ValueRef(node=ir.PROGRAM_INPUT, index=index)
    destinations: list[str] = []
    tokens: list[str] = []
    reading_hosts: dict[str, list[str]] = {}
    readers = sorted({
        c.slice for c in program.computations
        for v in c.inputs if v.is_program_input and v.index == index
    })
    for vid in readers:
        gang = slices[vid]
        if gang.slice_id == holder.slice_id:
            placed.aliases[vid] = pb.Alias(input=value, object=obj)
            continue
        placed.expects[vid] = pb.Expect(value=value, senders=len(holder.hosts))
        reading_hosts[vid] = [h.sidecar_address for h in gang.hosts]
        for host in gang.hosts:
            if host.sidecar_address not in destinations:
                destinations.append(host.sidecar_address)
                tokens.append(route_token(gang.token))
    if destinations:
        placed.forward = pb.Forward(
            object=obj, call_id=call_id, input=value, spec=program.inputs[index].to_proto(),
            destinations=destinations, destination_tokens=tokens,
            destination_blocks=destination_blocks(
                program, ir.ValueRef(ir.PROGRAM_INPUT, index), reading_hosts, destinations
            ),
        )
    return placed
