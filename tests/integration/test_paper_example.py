"""The program from the Pathways paper (§4.1), with pmap → pw.pmap, tpu_devices → devices."""

from __future__ import annotations

import numpy
import numpy as np
import pytest

import pathways as pw
from tests.paper_program import paper_program

pytestmark = pytest.mark.timeout(240)


def get_devices(n: int) -> list[pw.VirtualDevice]:
    device_set = pw.make_virtual_device_set()
    return device_set.add_slice(devices=n).devices


def test_paper_example(runtime: pw.Runtime) -> None:
    paper = paper_program(get_devices)
    a, b, c, f = paper.a, paper.b, paper.c, paper.f

    y, z = f(numpy.array([1.0, 2.0]))
    np.testing.assert_allclose(y, [3.0, 5.0])
    np.testing.assert_allclose(z, [2.0, 4.0])

    compiles = (a.compile_count, b.compile_count, c.compile_count)
    calls = runtime.calls
    y2, z2 = f(numpy.array([3.0, 4.0]))
    np.testing.assert_allclose(y2, [7.0, 9.0])
    np.testing.assert_allclose(z2, [6.0, 8.0])
    assert f.trace_count == 1, "a second call with the same shapes must not re-trace"
    assert (a.compile_count, b.compile_count, c.compile_count) == compiles
    assert runtime.calls == calls + 1


def test_op_by_op_call_outside_a_program(runtime: pw.Runtime) -> None:
    double = pw.pmap(lambda x: x * 2.0, devices=get_devices(2))
    np.testing.assert_allclose(double(np.array([1.5, -2.0], np.float32)), [3.0, -4.0])


def test_pmap_collective_inside_one_host(runtime: pw.Runtime) -> None:
    import jax

    total = pw.pmap(lambda x: jax.lax.psum(x, "i"), devices=get_devices(4), axis_name="i")
    np.testing.assert_allclose(total(np.arange(4, dtype=np.float32)), [6.0] * 4)
