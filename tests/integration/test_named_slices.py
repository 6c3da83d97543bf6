"""A named slice is one slice for every ask of its name: an ask it cannot answer (another
size, island or host size) is refused naming the slice as it is, also where the client
bound the name already and used to reuse it without asking."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pathways as pw

pytestmark = pytest.mark.timeout(300)


def doubled_on(vslice: pw.VirtualSlice) -> Any:
    double = pw.jit(lambda x: x * 2.0, slice=vslice)
    return pw.program(lambda x: double(x))(np.ones(vslice.devices_count, np.float32))


@pytest.mark.parametrize(
    ("ask", "refusal"),
    [({"devices": 8}, "slice 'pool' has 4 devices; a program asked for 8"),
     ({"devices": 4, "island": "island-b"},
      "slice 'pool' is on island 'island-a'; a program pinned it to island 'island-b'"),
     ({"devices": 4, "devices_per_host": 2}, "slice 'pool' has 4 devices per host; a program asked for 2")],
    ids=["size", "island", "host size"],
)
def test_an_ask_the_named_slice_cannot_answer_is_refused_naming_the_slice_as_it_is(
    runtime: pw.Runtime, ask: dict[str, Any], refusal: str
) -> None:
    first = pw.make_virtual_device_set().add_slice(devices=4, name="pool", island="island-a")
    np.testing.assert_array_equal(np.asarray(doubled_on(first)), np.full(4, 2.0, np.float32))

    other = pw.make_virtual_device_set().add_slice(name="pool", **ask)
    with pytest.raises(pw.InvalidProgramError, match=refusal):
        doubled_on(other)

    same = pw.make_virtual_device_set().add_slice(devices=4, name="pool")  # no pins: the slice as it is
    np.testing.assert_array_equal(np.asarray(doubled_on(same)), np.full(4, 2.0, np.float32))
