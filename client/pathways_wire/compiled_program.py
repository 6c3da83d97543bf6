"""A traced program as Kubernetes objects: what ``pathways compile`` writes and ``submit`` applies.

It lives below the client so that the operator reads and checks a compiled program without
importing the user API or JAX; :meth:`pathways.tracing.ProgramFunction.compiled` makes one.

A ``PathwaysProgram`` whose ``spec.source`` is ``configMapRef`` needs none of the user's
Python: everything that runs is in the ConfigMap it names -- the dataflow IR, the
``jax.export`` artifacts of its computations, and the arrays to call it with. This module
is the one place that knows that ConfigMap's layout, both ways (:meth:`CompiledProgram.
to_config_map` and :meth:`CompiledProgram.from_config_map`), so the CLI that writes it and
whatever runs it cannot disagree.

Layout (``pathways.dev/format: compiled-program/v1``)::

    data:
      program.json            what a human or `kubectl describe` needs: name, fingerprint,
                              slices, computations, input and output specs
    binaryData:
      program.pb              the IR: a serialized pathways_wire Program whose computations
                              carry their artifact's fingerprint but not its bytes
      <sha256>.jaxexport      each distinct artifact (serialized StableHLO), by fingerprint
      inputs.npz              the program's inputs in IR order (arr_0, arr_1, ...):
                              the example arguments plus constants captured at trace time

``program.json`` also carries the program's ``feeds``: which flat outputs of a step become
which flat inputs of the next (a training step's new parameters its next parameters).
A runner carries them from step to step as handles, so they stay on the hosts; inputs
nothing feeds are the stored ones at every step.

The PathwaysProgram names each slice by the IR's slice id (``spec.slices[].name``), so
a runner maps IR slices to VirtualSlices without guessing: a slice the program named
(``add_slice(name=...)``, shared) becomes ``ref: <name>``, an unnamed one an inline
``template`` with the same devices, devices per host and island.

Running it (the operator and ``python -m pathways.driver --compiled-program``):
:meth:`CompiledProgram.from_config_map` refuses anything edited since compile time (the
IR's fingerprint covers every artifact; inputs must match the IR's input specs), and
:meth:`CompiledProgram.bound_to` renames each IR slice to its VirtualSlice, keeping ids.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

import numpy as np

from pathways_wire import ir
from pathways_wire.errors import InvalidProgramError
from pathways_wire.kube_names import MANAGED_BY_LABEL, PROGRAM_LABEL
from pathways_wire import pathways_pb2 as pb
from pathways_wire.wording import plural

FORMAT = "compiled-program/v1"
FORMAT_ANNOTATION = "pathways.dev/format"
FINGERPRINT_ANNOTATION = "pathways.dev/program-fingerprint"
MANAGED_BY = "pathways-cli"
PROGRAM_KEY = "program.pb"
SUMMARY_KEY = "program.json"
INPUTS_KEY = "inputs.npz"
ARTIFACT_SUFFIX = ".jaxexport"
CONFIG_MAP_LIMIT = 1 << 20
"""Bytes a ConfigMap may hold (data + binaryData), as the API server enforces."""

T = TypeVar("T")

_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def resource_name(text: str, suffix: str = "") -> str:
    """``text`` as a Kubernetes object name (DNS-1123 label), leaving room for ``suffix``."""
    name = _DNS_LABEL.sub("-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[: 63 - len(suffix)].strip("-")
    if not name:
        raise InvalidProgramError(
            f"{text!r} gives no usable Kubernetes name: pass --name (lowercase letters, digits, '-')"
        )
    return name + suffix


@dataclass(frozen=True)
class Feed:
    """Flat output ``output`` of a step is flat input ``input`` of the next step."""

    output: int
    input: int


def feeds_problem(program: ir.Program, feeds: tuple[Feed, ...], field: str = "feeds") -> str | None:
    """What is wrong with ``feeds`` for ``program`` (None: nothing): each names an output
    and an input that exist and agree in shape and dtype, and no input is fed twice."""
    fed: dict[int, int] = {}
    for k, feed in enumerate(feeds):
        where = f"{field}[{k}] (output {feed.output} -> input {feed.input})"
        if not 0 <= feed.output < len(program.outputs):
            return f"{where}: the program has {plural(len(program.outputs), 'output')}; name one of 0..{len(program.outputs) - 1}"
        if not 0 <= feed.input < len(program.inputs):
            return f"{where}: the program has {plural(len(program.inputs), 'input')}; name one of 0..{len(program.inputs) - 1}"
        if feed.input in fed:
            return f"{where}: input {feed.input} is already fed by output {fed[feed.input]}; feed each input once"
        fed[feed.input] = feed.output
        made, taken = program.spec_of(program.outputs[feed.output]), program.inputs[feed.input]
        if made != taken:
            return f"{where}: the output is {made} but the input takes {taken}; feed an input of the output's shape and dtype"
    return None


@dataclass(frozen=True)
class CompiledProgram:
    """One traced signature of a program, with the inputs to run it on and the ``feeds``
    that carry a step's outputs into the next step's inputs."""

    program: ir.Program
    inputs: tuple[np.ndarray, ...]
    weight: float = 1.0
    feeds: tuple[Feed, ...] = ()

    def __post_init__(self) -> None:
        problem = feeds_problem(self.program, self.feeds)
        if problem:
            raise InvalidProgramError(f"program '{self.program.name}': {problem}")

    def next_inputs(self, inputs: list[T], outputs: list[T]) -> list[T]:
        """The inputs of the step after the one that took ``inputs`` and gave ``outputs``."""
        following = list(inputs)
        for feed in self.feeds:
            following[feed.input] = outputs[feed.output]
        return following

    # -- the ConfigMap -------------------------------------------------------------------

    def artifacts(self) -> dict[str, bytes]:
        """Distinct artifacts by fingerprint (a function called twice is stored once)."""
        return {c.fingerprint: c.artifact for c in self.program.computations}

    def summary(self) -> dict[str, Any]:
        p = self.program
        return {
            "format": FORMAT,
            "name": p.name,
            "fingerprint": p.fingerprint,
            "weight": self.weight,
            "slices": [
                {"id": s.id, "name": s.name, "devices": s.devices, "devicesPerHost": s.devices_per_host,
                 "island": s.island, "shared": is_shared(s)}
                for s in p.slices
            ],  # fmt: skip
            "computations": [
                {"index": c.index, "name": c.name, "slice": c.slice,
                 "artifact": c.fingerprint + ARTIFACT_SUFFIX,
                 "inputs": [str(v) for v in c.inputs], "outputs": [str(s) for s in c.outputs]}
                for c in p.computations
            ],  # fmt: skip
            "inputs": [str(s) for s in p.inputs],
            "outputs": [f"{ref} {p.spec_of(ref)}" for ref in p.outputs],
            "feeds": [{"output": f.output, "input": f.input} for f in self.feeds],
        }

    def to_config_map(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The ConfigMap holding this program; raises when it would exceed the API's 1 MiB."""
        message = self.program.to_proto()
        for comp in message.computations:
            comp.artifact = b""
        buffer = io.BytesIO()
        np.savez(buffer, *self.inputs)
        binary = {PROGRAM_KEY: message.SerializeToString(), INPUTS_KEY: buffer.getvalue()}
        binary.update({fp + ARTIFACT_SUFFIX: art for fp, art in self.artifacts().items()})
        summary = json.dumps(self.summary(), indent=1)
        size = sum(len(v) for v in binary.values()) + len(summary)
        if size > CONFIG_MAP_LIMIT:
            inputs = sum(a.nbytes for a in self.inputs)
            raise InvalidProgramError(
                f"program '{self.program.name}' compiles to {size} bytes ({inputs} of them "
                f"inputs); a ConfigMap holds at most {CONFIG_MAP_LIMIT}: make example_args() "
                "smaller, or package the program in the worker image and use "
                "spec.source.entrypoint"
            )
        metadata = _metadata(name, namespace)
        metadata["labels"] = {PROGRAM_LABEL: resource_name(self.program.name), MANAGED_BY_LABEL: MANAGED_BY}
        metadata["annotations"] = {FORMAT_ANNOTATION: FORMAT, FINGERPRINT_ANNOTATION: self.program.fingerprint}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {SUMMARY_KEY: summary},
            "binaryData": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(binary.items())},
        }

    @classmethod
    def from_config_map(cls, obj: Mapping[str, Any]) -> CompiledProgram:
        """The program a ConfigMap written by :meth:`to_config_map` holds, checked whole."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        where = f"ConfigMap {namespace + '/' if namespace else ''}{meta.get('name', '?')}"
        fmt = (meta.get("annotations") or {}).get(FORMAT_ANNOTATION)
        if fmt != FORMAT:
            raise InvalidProgramError(
                f"{where} is not a compiled program (annotation {FORMAT_ANNOTATION}={fmt!r}, "
                f"expected {FORMAT!r}): write it with `pathways compile`"
            )
        binary = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        for key in (PROGRAM_KEY, INPUTS_KEY):
            if key not in binary:
                raise InvalidProgramError(f"{where} has no binaryData key {key!r}: compile it again")
        message = pb.Program.FromString(binary[PROGRAM_KEY])
        for comp in message.computations:
            key = comp.fingerprint + ARTIFACT_SUFFIX
            if key not in binary:
                raise InvalidProgramError(
                    f"{where}: computation {comp.index} '{comp.name}' needs artifact {key}, "
                    "which is missing: compile it again"
                )
            comp.artifact = binary[key]
        program = ir.Program.from_proto(message)
        if program.fingerprint != message.fingerprint:
            raise InvalidProgramError(
                f"{where}: the IR's fingerprint {program.fingerprint[:12]} does not match the "
                f"recorded {message.fingerprint[:12]} (edited by hand?): compile it again"
            )
        with np.load(io.BytesIO(binary[INPUTS_KEY]), allow_pickle=False) as npz:
            inputs = tuple(npz[f"arr_{i}"] for i in range(len(npz.files)))
        if len(inputs) != len(program.inputs):
            raise InvalidProgramError(
                f"{where}: binaryData {INPUTS_KEY} holds {plural(len(inputs), 'input')} for a program of "
                f"{len(program.inputs)}: compile it again"
            )
        for i, (array, spec) in enumerate(zip(inputs, program.inputs)):
            got = ir.TensorSpec.of(array.shape, array.dtype)
            if got != spec:
                raise InvalidProgramError(
                    f"{where}: binaryData {INPUTS_KEY} input {i} is {got} ({array.nbytes} bytes) "
                    f"but the program takes {spec} ({spec.nbytes} bytes): compile it again"
                )
        summary = json.loads((obj.get("data") or {}).get(SUMMARY_KEY) or "{}")
        feeds = _read_feeds(summary.get("feeds") or [], f"{where}: data {SUMMARY_KEY} feeds")
        problem = feeds_problem(program, feeds, f"data {SUMMARY_KEY} feeds")
        if problem:
            raise InvalidProgramError(f"{where}: {problem}")
        return cls(program, inputs, float(summary.get("weight", 1.0)), feeds)

    # -- running it ----------------------------------------------------------------------

    def bound_to(self, slices: Mapping[str, tuple[str, int]]) -> ir.Program:
        """The program with each IR slice bound to a VirtualSlice: id -> (name, devices).

        Binding keeps each slice's id (computations name it) and gives it the VirtualSlice's
        name, which is what the controller attaches to on Kubernetes.
        """
        bound = []
        for decl in self.program.slices:
            found = slices.get(decl.id)
            if found is None:
                given = ", ".join(sorted(slices)) or "none"
                raise InvalidProgramError(
                    f"the compiled program runs on slice {decl.id!r}, which spec.slices does not "
                    f"name (it names: {given}); add an entry with name: {decl.id}"
                )
            name, devices = found
            if devices != decl.devices:
                raise InvalidProgramError(
                    f"spec.slices {decl.id!r}: VirtualSlice {name} has {plural(devices, 'device')}; the "
                    f"compiled program needs {decl.devices}; give it {plural(decl.devices, 'device')}"
                )
            bound.append(dataclasses.replace(decl, name=name))
        return dataclasses.replace(self.program, slices=tuple(bound))

    def output_names(self) -> list[str]:
        """Result keys of the program's flat outputs: ``output_0``, ``output_1``, ..."""
        return [f"output_{i}" for i in range(len(self.program.outputs))]

    # -- the PathwaysProgram -------------------------------------------------------------

    def to_program(
        self, name: str, config_map: str, namespace: str | None = None, steps: int = 1
    ) -> dict[str, Any]:
        """The PathwaysProgram that runs this program from ConfigMap ``config_map``."""
        slices: list[dict[str, Any]] = []
        for decl in self.program.slices:
            if is_shared(decl):
                slices.append({"name": decl.id, "ref": decl.name})
                continue
            template: dict[str, Any] = {"devices": decl.devices}
            if decl.devices_per_host:
                template["devicesPerHost"] = decl.devices_per_host
            if decl.island:
                template["island"] = decl.island
            slices.append({"name": decl.id, "template": template})
        metadata = _metadata(name, namespace)
        metadata["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
        metadata["annotations"] = {FINGERPRINT_ANNOTATION: self.program.fingerprint}
        return {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "PathwaysProgram",
            "metadata": metadata,
            "spec": {
                "slices": slices,
                "source": {"configMapRef": {"name": config_map}},
                "steps": steps,
                "weight": self.weight,
            },
        }


def _read_feeds(raw: Any, where: str) -> tuple[Feed, ...]:
    entries = raw if isinstance(raw, list) else None
    feeds: list[Feed] = []
    for entry in entries or []:
        output, input_ = (entry.get("output"), entry.get("input")) if isinstance(entry, dict) else (None, None)
        if not (_is_index(output) and _is_index(input_)):
            entries = None
            break
        feeds.append(Feed(output, input_))
    if entries is None:
        raise InvalidProgramError(
            f"{where} must be a list of {{\"output\": N, \"input\": M}} with integer indices, "
            f"got {json.dumps(raw)[:200]}: compile it again"
        )
    return tuple(feeds)


def _is_index(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    return {"name": name, "namespace": namespace} if namespace else {"name": name}


def is_shared(decl: ir.SliceDecl) -> bool:
    """A slice the program named (``add_slice(name=...)``): its id is its name."""
    return decl.id == decl.name
