"""Virtual devices and virtual slices.

A program never names physical hosts. It asks a `VirtualDeviceSet` for slices
of N virtual devices (`add_slice(devices=N)`), and the resource manager maps
each slice onto a gang of hosts of one island when the slice is first used.
The mapping may change (a failed gang is relaunched elsewhere) without the
program noticing: computations refer to the virtual slice only.
"""

from __future__ import annotations

import itertools
import re
import sys
import weakref
from dataclasses import dataclass, field

from jax.sharding import AbstractMesh

from pathways_wire.errors import InvalidProgramError
from pathways_wire.ir import SliceDecl

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_ids = itertools.count()


@dataclass(frozen=True)
class VirtualDevice:
    slice: VirtualSlice
    index: int

    def __repr__(self) -> str:
        return f"VirtualDevice({self.slice.name}:{self.index})"


@dataclass(eq=False)
class VirtualSlice:
    """A slice of `devices` virtual devices, placed all-or-nothing on one island."""

    name: str
    devices_count: int
    devices_per_host: int = 0
    island: str = ""
    shared: bool = False
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            self.id = self.name if self.shared else f"{self.name}-{next(_ids)}"
        # a slice nobody can reach any more gives its devices back
        self._finalizer = weakref.finalize(self, _release, self.id)

    def release(self) -> None:
        """Give the slice's hosts back now; it is placed again if used again."""
        _release(self.id, wait=True)

    @property
    def devices(self) -> list[VirtualDevice]:
        return [VirtualDevice(self, i) for i in range(self.devices_count)]

    def mesh(
        self, axis_names: tuple[str, ...] = ("x",), shape: tuple[int, ...] | None = None
    ) -> AbstractMesh:
        """The slice's device mesh, for `jax.sharding` specs of `pw.jit`."""
        if shape is None:
            if len(axis_names) != 1:
                raise InvalidProgramError(
                    f"slice '{self.name}': give mesh shape for axes {axis_names}"
                )
            shape = (self.devices_count,)
        size = 1
        for d in shape:
            size *= d
        if size != self.devices_count or len(shape) != len(axis_names):
            raise InvalidProgramError(
                f"slice '{self.name}' has {self.devices_count} devices; mesh shape "
                f"{shape} with axes {axis_names} does not match"
            )
        return AbstractMesh(tuple(shape), tuple(axis_names))

    def decl(self) -> SliceDecl:
        return SliceDecl(
            id=self.id,
            name=self.name,
            devices=self.devices_count,
            devices_per_host=self.devices_per_host,
            island=self.island,
        )

    def __repr__(self) -> str:
        return f"VirtualSlice({self.name!r}, devices={self.devices_count})"


class VirtualDeviceSet:
    """Where a program asks for virtual slices (paper §4.1)."""

    def __init__(self) -> None:
        self.slices: list[VirtualSlice] = []

    def add_slice(
        self,
        devices: int,
        *,
        name: str | None = None,
        devices_per_host: int | None = None,
        island: str | None = None,
    ) -> VirtualSlice:
        """Reserve a slice of `devices` virtual devices.

        A slice given a `name` is shared: every program (from any client) that
        names it runs on the same gang, and the island scheduler interleaves
        them. Unnamed slices are private to this device set.
        """
        if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
            raise InvalidProgramError(
                f"add_slice(devices={devices!r}): devices must be a positive integer"
            )
        if devices_per_host is not None and (devices_per_host < 1 or devices % devices_per_host):
            raise InvalidProgramError(
                f"add_slice(devices={devices}, devices_per_host={devices_per_host}): "
                "devices must be a positive multiple of devices_per_host"
            )
        if name is not None and not _NAME.match(name):
            raise InvalidProgramError(
                f"add_slice(name={name!r}): use lowercase letters, digits and '-', "
                "at most 42 characters"
            )
        vslice = VirtualSlice(
            name=name or f"slice{next(_ids)}",
            devices_count=devices,
            devices_per_host=devices_per_host or 0,
            island=island or "",
            shared=name is not None,
        )
        self.slices.append(vslice)
        return vslice

    def release(self) -> None:
        """Give back every slice of this set."""
        for vslice in self.slices:
            vslice.release()


def _release(slice_id: str, wait: bool = False) -> None:
    if "pathways.runtime" not in sys.modules:
        return  # no runtime was ever started (e.g. `pathways compile`): nothing was placed
    from pathways.runtime import release_virtual_slice

    release_virtual_slice(slice_id, wait=wait)


def make_virtual_device_set() -> VirtualDeviceSet:
    return VirtualDeviceSet()


def slice_of_devices(devices: object) -> VirtualSlice:
    """The one slice that a list of virtual devices covers exactly."""
    if isinstance(devices, VirtualSlice):
        return devices
    if not isinstance(devices, (list, tuple)) or not devices:
        raise InvalidProgramError(
            f"devices={devices!r}: pass a slice's `.devices` (a non-empty list of VirtualDevice)"
        )
    slices = {d.slice.id: d.slice for d in devices if isinstance(d, VirtualDevice)}
    if len(slices) != 1 or len(devices) != len({(d.slice.id, d.index) for d in devices}):
        raise InvalidProgramError(
            "devices must be distinct virtual devices of one slice "
            f"(got {len(devices)} devices from {len(slices)} slices)"
        )
    (vslice,) = slices.values()
    if len(devices) != vslice.devices_count:
        raise InvalidProgramError(
            f"devices cover {len(devices)} of the {vslice.devices_count} devices of slice "
            f"'{vslice.name}'; a function runs on a whole slice — add a slice of "
            f"{len(devices)} devices instead"
        )
    return vslice
