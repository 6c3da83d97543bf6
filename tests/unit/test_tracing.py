"""Tracing `@pw.program` into the IR: no processes, no runtime."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways as pw
from tests.paper_program import paper_program
from pathways_wire import ir


def devices(n: int) -> list[pw.VirtualDevice]:
    return pw.make_virtual_device_set().add_slice(devices=n).devices


def test_paper_program_traces_into_four_computations_over_three_slices() -> None:
    paper = paper_program(devices)
    a, b, c, f = paper.a, paper.b, paper.c, paper.f

    traced = f.trace(np.array([1.0, 2.0]))
    prog = traced.ir
    assert [comp.slice for comp in prog.computations] == [
        a.slice.id, b.slice.id, c.slice.id, a.slice.id
    ]
    assert prog.computations[1].inputs == (ir.ValueRef(0, 0),)
    assert prog.computations[3].inputs == (ir.ValueRef(2, 0),)
    assert prog.outputs == (ir.ValueRef(1, 0), ir.ValueRef(3, 0))
    assert prog.inputs == (ir.TensorSpec((2,), "float32"),), "float64 is canonicalized"
    assert len(prog.slices) == 3
    # same shapes: cached, no re-trace, no re-export
    assert f.trace(np.array([5.0, 6.0])) is traced
    assert f.trace_count == 1 and a.compile_count == 1
    # new shapes: a new trace
    with pytest.raises(pw.InvalidProgramError):
        f.trace(np.array([1.0, 2.0, 3.0]))


def test_ir_round_trips_through_the_wire_format() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=4)
    fn = pw.jit(lambda x, y: (x @ y, x.sum()), slice=s, in_shardings=(P("x"), None),
                out_shardings=(P("x"), None))

    @pw.program
    def g(x, y):  # type: ignore[no-untyped-def]
        return fn(x, y)

    prog = g.trace(np.ones((8, 3), np.float32), np.ones((3, 2), np.float32)).ir
    back = ir.Program.from_proto(prog.to_proto())
    assert back.fingerprint == prog.fingerprint
    assert back.computations[0].outputs == (ir.TensorSpec((8, 2), "float32"), ir.TensorSpec((), "float32"))
    assert back.computations[0].mesh_shape == (4,)
    exported = jax.export.deserialize(bytearray(back.computations[0].artifact))
    assert exported.nr_devices == 4


def test_shape_mismatch_between_producer_and_consumer_names_both() -> None:
    make = pw.pmap(lambda x: x.repeat(3), devices=devices(2), )
    s = pw.make_virtual_device_set().add_slice(devices=2)
    producer = pw.jit(lambda x: x.reshape(3, 2), slice=s)
    consumer = pw.pmap(lambda x: x * 2.0, devices=devices(2))
    del make

    @pw.program
    def bad(v):  # type: ignore[no-untyped-def]
        return consumer(producer(v))

    with pytest.raises(pw.InvalidProgramError) as info:
        bad.trace(np.ones(6, np.float32))
    text = str(info.value)
    assert "float32[3, 2]" in text and "leading dimension of 2" in text, text
    assert "<lambda>" in text or "lambda@" in text, text
    assert "output 0" in text, text


def test_host_callbacks_are_refused_at_trace_time() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)

    def noisy(x: jax.Array) -> jax.Array:
        jax.debug.print("x = {}", x)
        return x + 1

    fn = pw.jit(noisy, slice=s)

    @pw.program
    def p(x):  # type: ignore[no-untyped-def]
        return fn(x)

    with pytest.raises(pw.InvalidProgramError) as info:
        p.trace(np.ones(2, np.float32))
    assert "callback" in str(info.value).lower(), str(info.value)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_add_slice_rejects_bad_device_counts(bad: object) -> None:
    with pytest.raises(pw.InvalidProgramError) as info:
        pw.make_virtual_device_set().add_slice(devices=bad)  # type: ignore[arg-type]
    assert "devices" in str(info.value)


def test_pmap_devices_must_cover_one_whole_slice() -> None:
    ds = pw.make_virtual_device_set()
    s1, s2 = ds.add_slice(devices=2), ds.add_slice(devices=2)
    with pytest.raises(pw.InvalidProgramError, match="one slice"):
        pw.pmap(lambda x: x, devices=s1.devices[:1] + s2.devices[:1])
    with pytest.raises(pw.InvalidProgramError, match="cover 1 of the 2"):
        pw.pmap(lambda x: x, devices=s1.devices[:1])


def test_symbolic_values_refuse_python_control_flow() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)
    inc = pw.jit(lambda x: x + 1, slice=s)

    @pw.program
    def p(x):  # type: ignore[no-untyped-def]
        y = inc(x)
        if y:
            return y
        return y

    with pytest.raises(pw.InvalidProgramError, match="control flow"):
        p.trace(np.ones(1, np.float32))


def test_program_weight_must_be_positive() -> None:
    with pytest.raises(pw.InvalidProgramError, match="weight"):
        pw.program(lambda x: x, weight=0)


def test_scalar_arguments_and_constants_keep_their_rank() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)
    scale = pw.jit(lambda x, k: x * k, slice=s)

    @pw.program
    def g(x, k):  # type: ignore[no-untyped-def]
        return scale(x, k), 2.0

    for k in (np.float32(3.0), np.array(3.0), 3.0):
        prog = g.trace(np.ones((2,), np.float32), k).ir
        # the returned constant 2.0 is a third input, a scalar too
        assert prog.inputs == (ir.TensorSpec((2,), "float32"),) + (ir.TensorSpec((), "float32"),) * 2
    assert prog.computations[0].outputs == (ir.TensorSpec((2,), "float32"),)
    compiled = g.compiled((np.ones((2,), np.float32), np.float32(3.0)))
    assert [a.shape for a in compiled.inputs] == [(2,), (), ()]


@pytest.mark.parametrize(
    ("bad", "named"),
    [(np.array(["a", "b"]), "'<U1'"), ("text", "'<U4'"), (np.array([object()]), "'|O'"),
     (np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f4")]), "numpy kind 'V'")],
)
def test_a_non_numeric_argument_is_refused_naming_its_place_and_dtype(bad: object, named: str) -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)
    ident = pw.jit(lambda x: x, slice=s)

    @pw.program
    def g(x, params):  # type: ignore[no-untyped-def]
        return ident(x)

    with pytest.raises(pw.InvalidProgramError) as err:
        g.trace(np.ones(2, np.float32), {"lr": np.float32(0.1), "w": bad})
    assert "program 'g' argument args[1]['w']" in str(err.value)
    assert named in str(err.value)
    with pytest.raises(pw.InvalidProgramError, match=r"args\[1\]\['w'\]"):
        g.compiled((np.ones(2, np.float32), {"lr": np.float32(0.1), "w": bad}))


@pytest.mark.parametrize(
    ("fn", "shardings", "cause"),
    [(lambda x: x @ x, None, "TypeError: dot_general requires contracting dimensions"),
     (lambda x: x, P("y"), "ValueError: Resource axis: y")],
    ids=["shape error in the function", "unknown mesh axis"],
)
def test_a_jit_function_jax_refuses_is_an_invalid_program_naming_function_and_inputs(
    fn: object, shardings: object, cause: str
) -> None:
    s = pw.make_virtual_device_set().add_slice(devices=2)
    bad = pw.jit(fn, slice=s, in_shardings=shardings)  # type: ignore[arg-type]

    @pw.program
    def p(x):  # type: ignore[no-untyped-def]
        return bad(x)

    with pytest.raises(pw.InvalidProgramError) as info:
        p.trace(np.ones((2, 3), np.float32))
    text = str(info.value)
    assert "cannot be compiled for inputs (float32[2, 3])" in text and "jit over 2 devices" in text, text
    assert cause in text, text
    assert info.value.__cause__ is not None, "JAX's own error stays chained"


def test_a_program_called_inside_another_programs_trace_says_to_call_its_body() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)
    inc = pw.jit(lambda x: x + 1, slice=s)

    @pw.program
    def inner(x):  # type: ignore[no-untyped-def]
        return inc(x)

    @pw.program
    def outer(x):  # type: ignore[no-untyped-def]
        return inner(x)

    with pytest.raises(pw.InvalidProgramError, match="program 'inner' called inside another program's trace"):
        outer.trace(np.ones(2, np.float32))


def test_a_program_called_with_keywords_says_to_pass_them_positionally() -> None:
    s = pw.make_virtual_device_set().add_slice(devices=1)
    inc = pw.jit(lambda x: x + 1, slice=s)

    @pw.program
    def p(x, k):  # type: ignore[no-untyped-def]
        return inc(x) * k

    with pytest.raises(pw.InvalidProgramError, match=r"program 'p': pass arguments positionally \(got keywords \['k'\]\)"):
        p(np.ones(2, np.float32), k=2.0)


def _doubling() -> pw.ProgramFunction:
    """Program ``g``: one computation that doubles its one argument, on a 1-device slice."""
    double = pw.jit(lambda x: x * 2, slice=pw.make_virtual_device_set().add_slice(devices=1))

    @pw.program
    def g(x):  # type: ignore[no-untyped-def]
        return double(x)

    return g


def test_a_big_endian_argument_enters_the_program_in_native_byte_order() -> None:
    g = _doubling()
    x = np.arange(4, dtype=">f4")
    assert g.trace(x).ir.inputs == (ir.TensorSpec((4,), "float32"),)
    (given,) = g.compiled((x,)).inputs
    assert given.dtype.isnative
    np.testing.assert_array_equal(given, [0.0, 1.0, 2.0, 3.0])


def test_a_computation_given_no_arrays_that_fails_to_compile_says_it_had_none() -> None:
    g = _doubling()
    with pytest.raises(pw.InvalidProgramError) as err:
        g.trace(None)
    assert "NoneType" in str(err.value)
    assert str(err.value).endswith("[in program 'g': no array inputs]")
