"""`Runtime.traffic`: the value bytes that pass through the client, counted where they pass.

Inline inputs and outputs count once; a large input counts once per host it is Put
to, each host of a multi-host slice getting only the block its devices read (a replicated
input: all of it; a batch split by rows: its rows); an output counts once, when the client first asks for its bytes; an output that
is a program input passes nothing; a handle passed to a call passes nothing either
(used in place on its slice, sent host to host to another), so a training loop's
traffic is its batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
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


def sgd_step(w: Any, x: Any, y: Any) -> tuple[Any, Any]:
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * grad, loss


def test_a_row_sharded_batch_sends_each_host_of_the_slice_only_its_rows(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)  # two hosts of 4
    step = pw.jit(sgd_step, slice=vslice, in_shardings=(None, P("x"), P("x")), out_shardings=(None, None))

    @pw.program(name="traffic-data-parallel")
    def train(w: Any, x: Any, y: Any) -> Any:
        return step(w, x, y)

    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 96)).astype(np.float32) / 16  # inline
    batches = [
        (rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((256, 96)).astype(np.float32))
        for _ in range(2)
    ]
    assert all(x.nbytes > INLINE_BYTES and y.nbytes > INLINE_BYTES for x, y in batches)
    expected_w: Any = w
    params: Any = w
    for x, y in batches:
        before = runtime.traffic
        params, loss = train(params, x, y)
        expected_w, expected_loss = jax.jit(sgd_step)(expected_w, x, y)
        np.testing.assert_allclose(np.asarray(loss), np.asarray(expected_loss), rtol=1e-5)
        sent = (runtime.traffic - before).sent
        passed_w = w.nbytes if x is batches[0][0] else 0  # later steps pass the handle
        assert sent == passed_w + x.nbytes + y.nbytes, "each row of the batch went to one host, once"
    np.testing.assert_allclose(np.asarray(params), np.asarray(expected_w), rtol=1e-5, atol=1e-6)


def test_an_input_split_by_columns_sends_each_host_its_columns(runtime: pw.Runtime) -> None:
    vslice = pw.make_virtual_device_set().add_slice(devices=8)  # two hosts of 4
    colsum = pw.jit(lambda x: x.sum(axis=0) * 2.0, slice=vslice, in_shardings=P(None, "x"),
                    out_shardings=P("x"))

    @pw.program(name="traffic-columns")
    def summed(x: Any) -> Any:
        return colsum(x)

    x = np.arange(64 * 512, dtype=np.float32).reshape(64, 512)
    before = runtime.traffic
    out = summed(x)
    np.testing.assert_allclose(np.asarray(out), x.sum(axis=0) * 2.0)
    assert (runtime.traffic - before).sent == x.nbytes
