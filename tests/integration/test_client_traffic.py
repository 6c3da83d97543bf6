"""`Runtime.traffic`: the value bytes that pass through the client, counted where they pass.

Inline inputs and outputs count once; a large input counts once per host it is Put
to; an output counts once, when the client first asks for its bytes; an output that
is a program input passes nothing; a handle passed to a call passes nothing either
(used in place on its slice, sent host to host to another), so a training loop's
traffic is its batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from pathways.runtime import INLINE_BYTES

pytestmark = pytest.mark.timeout(300)


def test_a_call_counts_its_inputs_sent_and_its_outputs_received(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    scale = pw.jit(lambda x, s: x * s, slice=vslice)

    @pw.program(name="traffic-single")
    def scaled(big: Any, s: Any) -> Any:
        return scale(big, s), s

    big = np.arange(INLINE_BYTES // 4 + 1024, dtype=np.float32)
    s = np.full((), 3.0, np.float32)
    before = runtime.traffic
    y, s_out = scaled(big, s)
    np.testing.assert_allclose(y, big * 3.0)  # fetched here, where the client asks for it
    np.testing.assert_array_equal(s_out, s)
    used = runtime.traffic - before
    assert used.sent == big.nbytes + s.nbytes
    assert used.received == y.nbytes
    assert used.total == used.sent + used.received


def test_a_replicated_input_is_sent_to_every_host_of_the_slice(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)  # two hosts of 4
    add = pw.jit(lambda w, x: x + w.sum(), slice=vslice, in_shardings=(None, P("x")),
                 out_shardings=P("x"))

    @pw.program(name="traffic-replicated")
    def added(w: Any, x: Any) -> Any:
        return add(w, x)

    w = np.ones(INLINE_BYTES // 4 + 1024, dtype=np.float32)  # Put to both hosts
    x = np.arange(8, dtype=np.float32)
    before = runtime.traffic
    out = added(w, x)
    np.testing.assert_allclose(out, x + float(w.sum()))
    used = runtime.traffic - before
    assert used.sent == 2 * w.nbytes + x.nbytes
    assert used.received == out.nbytes
