"""What a PathwaysProgram's spec needs that the schema cannot check, read from where it lives.

* The entrypoint is allowed (``--allowed-entrypoints`` prefixes) and importable
  where the operator runs drivers.
* A ``spec.source.configMapRef`` program has its ConfigMap read and checked whole
  (:class:`pathways_wire.compiled_program.CompiledProgram`: format, IR fingerprint,
  artifacts, inputs' shapes), once per resourceVersion; its IR slices must be
  exactly ``spec.slices``' names, with the devices it was compiled for.
* Names fit the labels and VirtualSlices derived from them (objects stored
  before the CRD refused them), and ``spec.checkpoint.volume`` stays inside
  the namespace's directory.
* Each ``spec.slices`` entry is read: a ``ref`` to a VirtualSlice that does not
  exist yet makes the program wait (as a Pod waits for its ConfigMap), a
  ``template`` slice that exists and is not the program's is refused.

A bad spec raises :class:`InvalidProgram` with a message naming the field;
the program machine fails the program with it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from pathways_wire.compiled_program import CompiledProgram
from pathways_wire.errors import InvalidProgramError
from pathways_operator.core.checkpoint_paths import CheckpointPathError, checkpoint_path
from pathways_operator.core.object_names import program_name_problem
from pathways_operator.core.program_look import ProgramSliceFact
from pathways_operator.core.reasons import Reason
from pathways_operator.k8s.cluster_api import ClusterApi, Json
from pathways_operator.k8s.pathways_program import ProgramObject
from pathways_wire.kube_names import PROGRAM_LABEL
from pathways_operator.k8s.virtual_slice import VirtualSliceObject


class InvalidProgram(Exception):
    """The spec is wrong in a way the schema cannot catch; the message names the field."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class ProgramSlices:
    """The program's slices as read: facts for the machine, and the objects found."""

    facts: tuple[ProgramSliceFact, ...]
    found: dict[str, VirtualSliceObject | None]
    """Each slice name -> its VirtualSlice (None: absent or going away, made again from the template)."""
    absent_inline: tuple[tuple[int, str], ...]
    missing: tuple[str, ...]


def check_names(program: ProgramObject) -> None:
    """Names too long for the labels and VirtualSlices derived from them (stored before the CRD refused them)."""
    templates = [(i, e.name) for i, e in enumerate(program.spec.slices) if e.template is not None]
    problem = program_name_problem(program.name, templates)
    if problem is not None:
        raise InvalidProgram(Reason.INVALID_SPEC, problem)


def checkpoint_dir(program: ProgramObject, root: Path | None) -> Path | None:
    """``<checkpoint-root>/<namespace>/<spec.checkpoint.volume>/<program>-<uid8>``, or None.

    Raises InvalidProgram, naming spec.checkpoint.volume, for a volume that would leave
    the namespace's directory (:func:`checkpoint_paths.checkpoint_path`).
    """
    checkpoint = program.spec.checkpoint
    if checkpoint is None or root is None:
        return None
    try:
        where = checkpoint_path(PurePosixPath(root), program.namespace, checkpoint.volume, program.name, program.uid)
    except CheckpointPathError as err:
        raise InvalidProgram(Reason.INVALID_SPEC, str(err)) from None
    return Path(where)


def check_entrypoint(entrypoint: str | None, allowed: Sequence[str], *, importable_here: bool = True) -> None:
    """The entrypoint is given, starts with an allowed prefix (an empty list allows any), and,
    for drivers the operator runs as its own child processes, is importable here.

    A driver pod imports it from its own image: there, a module that is missing fails
    the program when the driver starts (exit status 2, naming the module).
    """
    if not entrypoint:
        raise InvalidProgram(
            Reason.INVALID_SPEC,
            "spec.source.entrypoint is missing; give package.module:function",
        )
    allowed_text = ", ".join(repr(p) for p in allowed)
    if allowed and not any(entrypoint.startswith(prefix) for prefix in allowed):
        raise InvalidProgram(
            Reason.INVALID_SPEC,
            f"spec.source.entrypoint {entrypoint!r} is not allowed: this operator runs only "
            f"entrypoints starting with {allowed_text} (operator flag --allowed-entrypoints)",
        )
    if not importable_here:
        return
    module, _, function = entrypoint.partition(":")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found or not function:
        raise InvalidProgram(
            Reason.INVALID_SPEC,
            f"spec.source.entrypoint {entrypoint!r}: module {module!r} is not importable where "
            "the operator runs its drivers; install the package in the operator's image",
        )


class CompiledPrograms:
    """The checked compiled program of each ``configMapRef`` program, parsed once per resourceVersion."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api
        self._by_key: dict[str, tuple[str, Json, CompiledProgram]] = {}
        """Program key -> (resourceVersion, ConfigMap, parsed) of its checked compiled program."""

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def config_map(self, key: str) -> Json:
        """The ConfigMap the program was last checked against (what its driver runs)."""
        return self._by_key[key][1]

    def check(self, program: ProgramObject, config_map: str) -> None:
        """Reads and checks the program's ConfigMap (parsed once per resourceVersion)."""
        raw = self._api.get_configmap(program.namespace, config_map)
        if raw is None:
            self._by_key.pop(program.key, None)
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.source.configMapRef.name: ConfigMap {config_map!r} does not exist in namespace "
                f"{program.namespace}; create it with `pathways compile` (or `pathways submit`)",
            )
        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._by_key.get(program.key)
        if cached is None or cached[0] != version or not version:
            try:
                compiled = CompiledProgram.from_config_map(raw)
            except (InvalidProgramError, ValueError, TypeError) as err:
                self._by_key.pop(program.key, None)
                raise InvalidProgram(
                    Reason.INVALID_SPEC, f"spec.source.configMapRef: {err}"
                ) from None
            self._by_key[program.key] = (version, raw, compiled)
        if program.spec.args:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                "spec.args: a compiled program runs on the inputs stored in its ConfigMap and "
                "takes no args; remove spec.args, or compile it again with other example_args()",
            )
        ids = {d.id for d in self._by_key[program.key][2].program.slices}
        names = [e.name for e in program.spec.slices]
        for i, entry in enumerate(program.spec.slices):
            if entry.name not in ids:
                raise InvalidProgram(
                    Reason.INVALID_SPEC,
                    f"spec.slices[{i}].name: the compiled program has no slice {entry.name!r} "
                    f"(its slices: {', '.join(sorted(ids))}); use the names `pathways compile` wrote",
                )
        missing = sorted(ids - set(names))
        if missing:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.slices: the compiled program runs on slice {missing[0]!r}, which spec.slices "
                f"does not name; add an entry with name: {missing[0]}",
            )

    def check_slices(self, program: ProgramObject, slices: dict[str, VirtualSliceObject | None]) -> None:
        """A compiled program's slices must have the devices it was compiled for."""
        if program.spec.config_map is None:
            return
        compiled = self._by_key[program.key][2]
        bound = {n: (s.name, s.spec.devices) for n, s in slices.items() if s is not None}
        try:
            compiled.bound_to({d.id: bound.get(d.id, ("", d.devices)) for d in compiled.program.slices})
        except InvalidProgramError as err:
            raise InvalidProgram(Reason.INVALID_SPEC, str(err)) from None


def read_slices(api: ClusterApi, program: ProgramObject) -> ProgramSlices:
    """Each slice of the program as it stands; raises InvalidProgram for a template slice not its own."""
    found: dict[str, VirtualSliceObject | None] = {}
    facts: list[ProgramSliceFact] = []
    absent: list[tuple[int, str]] = []
    missing: list[str] = []
    for i, entry in enumerate(program.spec.slices):
        if entry.ref is not None:
            raw = api.get_slice(program.namespace, entry.ref)
            if raw is None:
                missing.append(
                    f"VirtualSlice {entry.ref!r} (spec.slices[{i}].ref) does not exist in "
                    f"namespace {program.namespace}"
                )
                continue
            vslice = VirtualSliceObject.from_manifest(raw)
            found[entry.name] = vslice
            facts.append(_fact(entry.name, vslice))
            continue
        assert entry.template is not None  # the CRD requires exactly one of ref and template
        name = program.inline_slice_name(entry.name)
        raw = api.get_slice(program.namespace, name)
        if raw is None:
            absent.append((i, name))
            found[entry.name] = None
            facts.append(ProgramSliceFact(entry.name, name, exists=False))
            continue
        vslice = VirtualSliceObject.from_manifest(raw)
        if vslice.labels.get(PROGRAM_LABEL) == program.name and vslice.deleting:
            found[entry.name] = None  # ours, going away (suspended or ended): made again on resume
            facts.append(ProgramSliceFact(entry.name, name, exists=False))
            continue
        if vslice.labels.get(PROGRAM_LABEL) != program.name or vslice.deleting:
            raise InvalidProgram(
                Reason.INVALID_SPEC,
                f"spec.slices[{i}].template: VirtualSlice {name!r} already exists and does not "
                "belong to this program; rename the slice or delete that VirtualSlice",
            )
        found[entry.name] = vslice
        facts.append(_fact(entry.name, vslice))
    return ProgramSlices(tuple(facts), found, tuple(absent), tuple(missing))


def _fact(name: str, vslice: VirtualSliceObject) -> ProgramSliceFact:
    status = vslice.status
    return ProgramSliceFact(name, vslice.name, True, status.phase, status.restarts, vslice.spec.devices,
                            status.conditions)
