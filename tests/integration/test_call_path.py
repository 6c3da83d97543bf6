"""One program call, small and large: values inline in the call's messages or Put and fetched.

Inputs and outputs of at most `INLINE_BYTES` travel in `Run` (and back in its
reply); larger ones are Put to the hosts and fetched from them. A call mixes
both freely, on single-host and multi-host slices alike, with the same results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from pathways.runtime import INLINE_BYTES

pytestmark = pytest.mark.timeout(300)


def test_small_and_large_values_in_one_call_on_a_single_host_slice(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=1)
    scale = pw.jit(lambda x, s: x * s, slice=vslice)
    total = pw.jit(lambda x: x.sum(keepdims=True), slice=vslice)

    @pw.program(name="mixed")
    def mixed(big: Any, s: Any) -> Any:
        y = scale(big, s)
        return y, total(y), s

    big = np.arange(INLINE_BYTES // 4 + 1024, dtype=np.float32)  # Put, and fetched back
    s = np.full((), 2.0, np.float32)  # inline
    y, summed, s_out = mixed(big, s)
    np.testing.assert_allclose(y, big * 2.0)
    np.testing.assert_allclose(summed, [float((big * 2.0).sum())], rtol=1e-5)
    np.testing.assert_array_equal(s_out, s)
    # all small: one round trip; results are the caller's to keep (writable)
    small = np.arange(8, dtype=np.float32)
    y_small, summed_small, _ = mixed(small, s)
    np.testing.assert_allclose(y_small, small * 2.0)
    y_small += 1.0
    np.testing.assert_allclose(summed_small, [56.0])


def test_small_values_on_a_multi_host_slice_are_fetched(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)  # two hosts of 4
    double = pw.jit(lambda x: x * 2.0, slice=vslice, in_shardings=P("x"), out_shardings=P("x"))

    @pw.program(name="sharded-small")
    def sharded(x: Any) -> Any:
        return double(x)

    x = np.arange(16, dtype=np.float32)
    np.testing.assert_allclose(sharded(x), x * 2.0)
    np.testing.assert_allclose(sharded(x + 1.0), (x + 1.0) * 2.0)
