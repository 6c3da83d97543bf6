"""Which block of a client input each host reads, and reading a held block (pathways_wire.host_blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from pathways_wire.host_blocks import Block, HeldBlock, Reading, device_blocks, host_blocks, host_needs, union

HOSTS = ("h0:1", "h1:1")


def reading(spec: tuple[tuple[str, ...], ...], mesh_shape: tuple[int, ...] = (8,),
            mesh_axes: tuple[str, ...] = ("x",), hosts: tuple[str, ...] = HOSTS) -> Reading:
    return Reading(hosts, spec, mesh_shape, mesh_axes)


def test_a_replicated_input_is_needed_whole_by_every_host() -> None:
    assert host_blocks((256, 512), reading(())) == (Block.whole((256, 512)),) * 2


def test_a_row_sharded_input_gives_each_host_its_rows() -> None:
    assert host_blocks((256, 512), reading((("x",),))) == (
        Block((0, 0), (128, 512)),
        Block((128, 0), (256, 512)),
    )


def test_an_input_sharded_on_a_later_axis_gives_each_host_its_columns() -> None:
    assert host_blocks((6, 16), reading(((), ("x",)))) == (
        Block((0, 0), (6, 8)),
        Block((0, 8), (6, 16)),
    )


def test_on_a_2d_mesh_a_host_reads_the_rows_of_its_mesh_rows_whatever_the_columns_split() -> None:
    # mesh (2, 4): host 0 holds mesh row 0, host 1 mesh row 1
    by_rows = reading((("data",),), mesh_shape=(2, 4), mesh_axes=("data", "model"))
    assert host_blocks((8, 4), by_rows) == (Block((0, 0), (4, 4)), Block((4, 0), (8, 4)))
    both = reading((("data",), ("model",)), mesh_shape=(2, 4), mesh_axes=("data", "model"))
    assert host_blocks((8, 4), both) == (Block((0, 0), (4, 4)), Block((4, 0), (8, 4)))


def test_a_split_that_interleaves_hosts_falls_back_to_the_whole_value() -> None:
    # mesh (4, 2): host 0 holds data {0, 1} x model {0, 1}; splitting over ("model", "data")
    # gives it shards 0, 1 (elements 0-3) and 4, 5 (elements 8-11): two blocks, not one
    spec = reading((("model", "data"),), mesh_shape=(4, 2), mesh_axes=("data", "model"))
    whole = Block.whole((16,))
    assert host_blocks((16,), spec) == (whole, whole)


def test_a_host_reading_two_disjoint_blocks_gets_the_whole_value() -> None:
    assert union([Block((0,), (2,)), Block((4,), (6,))], (8,)) == Block.whole((8,))


def test_adjacent_blocks_join_into_one() -> None:
    assert union([Block((0, 0), (2, 4)), Block((2, 0), (4, 4))], (8, 4)) == Block((0, 0), (4, 4))
    assert union([Block((0, 0), (2, 2)), Block((0, 2), (2, 4)), Block((2, 0), (4, 4))], (4, 4)) == Block(
        (0, 0), (4, 4)
    )
    assert union([Block((0, 0), (2, 2)), Block((2, 2), (4, 4))], (4, 4)) == Block.whole((4, 4))


def test_an_input_read_by_two_shardings_gets_their_union_per_host() -> None:
    rows, replicated = reading((("x",),)), reading(())
    assert host_needs((8, 2), [rows, rows]) == {"h0:1": Block((0, 0), (4, 2)), "h1:1": Block((4, 0), (8, 2))}
    assert host_needs((8, 2), [rows, replicated]) == {a: Block.whole((8, 2)) for a in HOSTS}


def test_an_input_read_by_two_slices_gets_each_slices_blocks_on_its_own_hosts() -> None:
    other = ("h2:1", "h3:1", "h4:1", "h5:1")
    needs = host_needs((8,), [reading((("x",),)), reading((("x",),), mesh_shape=(4,), hosts=other)])
    assert needs == {
        "h0:1": Block((0,), (4,)), "h1:1": Block((4,), (8,)),
        "h2:1": Block((0,), (2,)), "h3:1": Block((2,), (4,)),
        "h4:1": Block((4,), (6,)), "h5:1": Block((6,), (8,)),
    }


def test_shards_that_do_not_divide_the_value_are_sent_whole() -> None:
    assert device_blocks((10,), (("x",),), (8,), ("x",)) is None
    assert host_blocks((10,), reading((("x",),))) == (Block.whole((10,)),) * 2


def test_a_spec_naming_an_axis_the_mesh_lacks_is_sent_whole() -> None:
    assert host_blocks((8,), reading((("y",),))) == (Block.whole((8,)),) * 2


def test_a_single_host_needs_the_whole_value() -> None:
    assert host_blocks((8,), reading((("x",),), hosts=("h0:1",))) == (Block.whole((8,)),)


def test_a_held_block_answers_indices_inside_it() -> None:
    value = np.arange(32).reshape(8, 4)
    held = HeldBlock((8, 4), (4, 0), value[4:8])
    assert held.stop == (8, 4)
    np.testing.assert_array_equal(held.data[held.local_index((slice(6, 8), slice(None)))], value[6:8])
    np.testing.assert_array_equal(held.data[held.local_index((slice(4, 6),))], value[4:6])


def test_a_held_block_refuses_an_index_outside_it_naming_both() -> None:
    held = HeldBlock((8, 4), (4, 0), np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"reach outside the block \[4, 0\]..\[8, 4\]"):
        held.local_index((slice(2, 6), slice(None)))
