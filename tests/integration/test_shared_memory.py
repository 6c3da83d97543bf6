"""Warm shared-memory files on a real tmpfs directory (pathways_worker.shared_memory).

Checked: shards written as one run are the value's bytes in C order; a sent
piece file stays as a spare that the next writer of its size takes (once); an
arrived value's file is kept while any view of it lives and becomes a spare
only once every view is gone; the pool's thread makes warm files of the sizes
asked for; a file that comes back as a spare is written through the mapping kept
from its last write, and read through the mapping its reader kept from its last
read; a value JAX adopted from such a mapping keeps its file until the array
goes; a reader keeps a bounded number of mappings, and a value whose mapping it
let go meanwhile stays readable; a mapping larger than the bound alone is the
caller's, not kept (nor closed under it); a kept mapping whose file is gone is let go; and
cleanup leaves nothing behind.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest

from pathways_wire import pathways_pb2 as pb
from pathways_wire.transfer import Piece
from pathways_worker.shared_memory import SWEEP_S, ShmDir, map_value
from pathways_worker.warm_pool import SPARES_PER_SIZE

MIB = 1 << 20


def shm_dir(tmp_path: Path, name: str) -> ShmDir:
    root = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path
    return ShmDir(str(root / f"test-shm-{os.getpid()}-{name}"), "t")


def spares(shm: ShmDir) -> list[str]:
    return sorted(n for n in os.listdir(shm.path) if "-spare-" in n)


def test_row_shards_written_as_one_run_are_the_value_in_c_order(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "run")
    try:
        value = np.arange(4 * 256 * 64, dtype=np.float32).reshape(4 * 256, 64)
        pieces = [Piece((r, 0), (r + 256, 64), value[r : r + 256]) for r in range(0, 1024, 256)]
        path = shm.write_run(pieces)
        assert np.array_equal(map_value(path, value.shape, value.dtype), value)
    finally:
        shm.cleanup()


def test_a_sent_piece_file_is_a_spare_the_next_writer_of_its_size_takes_once(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "sent")
    try:
        data = np.full(MIB, 7, np.uint8)
        path = shm.write_piece(Piece((0,), (MIB,), data))
        exported = pb.Exported(pieces=[pb.Piece(start=[0], stop=[MIB], path=path, nbytes=MIB)])
        shm.recycle_pieces(exported)
        assert not os.path.exists(path)
        assert len(spares(shm)) == 1
        taken = shm.new_file("piece", MIB)
        assert spares(shm) == []
        assert os.path.getsize(taken) == MIB
        assert shm.claim_spare(MIB) is None
    finally:
        shm.cleanup()


def test_an_arrived_value_file_becomes_a_spare_only_once_every_view_is_gone(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "arrived")
    try:
        path, target = shm.create_value((256, 1024), np.dtype(np.float32), warm=False)
        target[:] = 3.0
        del target
        value = shm.map_arrived(path, (256, 1024), np.dtype(np.float32))
        view = value[8:16]
        del value
        gc.collect()
        assert os.path.exists(path)
        assert spares(shm) == []
        assert float(view.sum()) == 3.0 * 8 * 1024
        del view
        gc.collect()
        assert not os.path.exists(path)
        assert len(spares(shm)) == 1
    finally:
        shm.cleanup()


def test_the_pool_warms_files_of_the_size_asked_for(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "pool")
    try:
        assert shm.warm.take(MIB) is None
        deadline = time.monotonic() + 30.0
        warm = None
        while warm is None and time.monotonic() < deadline:
            time.sleep(0.05)
            warm = shm.warm.take(MIB)
        assert warm is not None
        assert os.path.getsize(warm) == MIB
    finally:
        shm.cleanup()
    assert not os.path.exists(shm.path)


def test_a_file_handed_over_whole_goes_back_as_a_spare_to_the_host_that_wrote_it(tmp_path: Path) -> None:
    producer, consumer = shm_dir(tmp_path, "producer"), shm_dir(tmp_path, "consumer")
    try:
        path = producer.write_piece(Piece((0,), (MIB,), np.full(MIB, 5, np.uint8)))
        moved = os.path.join(consumer.path, "value.bin")
        os.rename(path, moved)
        value = consumer.map_arrived(moved, (MIB,), np.dtype(np.uint8), spare_dir=producer.path)
        assert int(value[-1]) == 5
        del value
        gc.collect()
        assert spares(consumer) == []
        assert len(spares(producer)) == 1
        assert producer.claim_spare(MIB) is not None
    finally:
        producer.cleanup()
        consumer.cleanup()
    assert not os.path.exists(producer.path) and not os.path.exists(consumer.path)


def test_a_file_come_back_as_a_spare_is_written_through_its_kept_mapping(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "kept")
    try:
        first = shm.write_piece(Piece((0,), (MIB,), np.full(MIB, 5, np.uint8)))
        inode = os.stat(first).st_ino
        shm.recycle(first, MIB)
        second = shm.write_piece(Piece((0,), (MIB,), np.full(MIB, 9, np.uint8)))

        assert os.stat(second).st_ino == inode, "the spare was taken"
        assert shm.maps.kept_bytes == MIB, "one mapping, kept and used again"
        written = map_value(second, (MIB,), np.dtype(np.uint8))
        assert int(written.min()) == int(written.max()) == 9
    finally:
        shm.cleanup()
    assert shm.maps.kept_bytes == 0


def test_a_value_larger_than_the_kept_mappings_bound_is_mapped_but_not_kept(tmp_path: Path) -> None:
    root = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path
    shm = ShmDir(str(root / f"test-shm-{os.getpid()}-over"), "t", warm_limit_bytes=MIB)
    try:
        small_path, small = shm.create_value((MIB // 2,), np.dtype(np.uint8))
        small[:] = 1
        path, big = shm.create_value((2 * MIB,), np.dtype(np.uint8))  # alone over the bound
        big[:] = 7

        assert shm.maps.kept_bytes == MIB // 2, "the earlier mapping is kept, the one over the bound is not"
        read = shm.read_maps.mapping(path, 2 * MIB)  # a reader's, over its bound too
        assert not read.closed and read[:4] == b"\x07" * 4 and read[-1] == 7
        assert shm.read_maps.kept_bytes == 0
        del small, big, read
    finally:
        shm.cleanup()


def test_a_kept_mapping_whose_file_another_process_removed_is_let_go_at_the_next_look(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "gone")
    try:
        gone = shm.write_piece(Piece((0,), (MIB,), np.full(MIB, 1, np.uint8)))
        os.unlink(gone)  # its consumer removed it
        shm.write_piece(Piece((0,), (2 * MIB,), np.full(2 * MIB, 2, np.uint8)))
        assert shm.maps.kept_bytes == 3 * MIB, "a write right after the last look does not look again"
        time.sleep(SWEEP_S)
        shm.write_piece(Piece((0,), (2 * MIB,), np.full(2 * MIB, 3, np.uint8)))

        assert shm.maps.kept_bytes == 4 * MIB, "the removed file's pages are no longer pinned"
    finally:
        shm.cleanup()


def test_a_kept_mapping_whose_file_this_process_removed_is_let_go_at_once(tmp_path: Path) -> None:
    shm = shm_dir(tmp_path, "removed")
    try:
        shm.write_piece(Piece((0,), (MIB,), np.full(MIB, 1, np.uint8)))
        removed = shm.write_piece(Piece((0,), (2 * MIB,), np.full(2 * MIB, 2, np.uint8)))
        assert shm.maps.kept_bytes == 3 * MIB

        shm.recycle(removed, 2 * MIB, into=str(tmp_path / "no-such-directory"))  # no spare: removed

        assert not os.path.exists(removed)
        assert shm.maps.kept_bytes == MIB, "its pages are no longer pinned; the other file's still are"
    finally:
        shm.cleanup()


def test_a_file_come_back_to_its_reader_is_read_through_its_kept_mapping(tmp_path: Path) -> None:
    producer, consumer = shm_dir(tmp_path, "writer"), shm_dir(tmp_path, "reader")
    try:
        seen = []
        for fill in (5, 9):
            path = producer.write_piece(Piece((0,), (MIB,), np.full(MIB, fill, np.uint8)))
            moved = os.path.join(consumer.path, f"value-{fill}.bin")
            os.rename(path, moved)
            seen.append(os.stat(moved).st_ino)
            value = consumer.map_arrived(moved, (MIB,), np.dtype(np.uint8), spare_dir=producer.path)
            assert int(value.min()) == int(value.max()) == fill, "the kept mapping shows the new bytes"
            del value
            gc.collect()
            assert len(spares(producer)) == 1, "the file went back once its value was dropped"

        assert seen[0] == seen[1], "the writer took its spare back"
        assert consumer.read_maps.kept_bytes == MIB, "one read mapping, kept and used again"
        assert producer.maps.kept_bytes == MIB
    finally:
        producer.cleanup()
        consumer.cleanup()
    assert consumer.read_maps.kept_bytes == 0


def test_a_value_jax_adopted_from_a_kept_mapping_keeps_its_file_until_the_array_goes(tmp_path: Path) -> None:
    import jax

    producer, consumer = shm_dir(tmp_path, "adopt-writer"), shm_dir(tmp_path, "adopt-reader")
    try:
        path = producer.write_piece(Piece((0,), (MIB // 4,), np.arange(MIB // 4, dtype=np.float32)))
        moved = os.path.join(consumer.path, "value.bin")
        os.rename(path, moved)
        value = consumer.map_arrived(moved, (MIB // 4,), np.dtype(np.float32), spare_dir=producer.path)
        adopted = jax.device_put(value, jax.devices("cpu")[0])
        del value
        gc.collect()
        assert spares(producer) == [], "the array on the device still reads the file"
        assert float(adopted[-1]) == MIB // 4 - 1
        adopted.delete()
        del adopted
        gc.collect()
        assert len(spares(producer)) == 1
    finally:
        producer.cleanup()
        consumer.cleanup()


def test_a_read_mapping_is_let_go_when_its_file_is_removed_instead_of_kept_as_a_spare(tmp_path: Path) -> None:
    producer, consumer = shm_dir(tmp_path, "full-writer"), shm_dir(tmp_path, "full-reader")
    try:
        written = [
            producer.write_piece(Piece((0,), (MIB,), np.full(MIB, fill, np.uint8))) for fill in range(SPARES_PER_SIZE)
        ]
        for path in written:  # the producer's spares of this size: as many as it keeps
            producer.recycle(path, MIB)
        assert len(spares(producer)) == SPARES_PER_SIZE
        path = producer.new_path("fresh")
        with open(path, "wb") as f:
            f.write(np.full(MIB, 7, np.uint8).tobytes())
        value = consumer.map_arrived(path, (MIB,), np.dtype(np.uint8), spare_dir=producer.path)
        assert consumer.read_maps.kept_bytes == MIB
        del value
        gc.collect()

        assert not os.path.exists(path), "no room among the spares: the file was removed"
        assert consumer.read_maps.kept_bytes == 0, "and its pages are no longer pinned by the reader"
    finally:
        producer.cleanup()
        consumer.cleanup()


def test_a_reader_keeps_no_more_mappings_than_its_bound_and_values_outlive_their_evicted_mappings(tmp_path: Path) -> None:
    from pathways_worker import shared_memory

    consumer = shm_dir(tmp_path, "many")
    try:
        values = []
        for i in range(shared_memory.MAX_KEPT_MAPS + 8):
            path = consumer.new_path("value")
            with open(path, "wb") as f:
                f.write(np.full(256 << 10, i % 256, np.uint8).tobytes())
            values.append(consumer.map_arrived(path, (256 << 10,), np.dtype(np.uint8)))

        assert consumer.read_maps.kept_bytes == shared_memory.MAX_KEPT_MAPS * (256 << 10)
        assert [int(v[0]) for v in values] == [i % 256 for i in range(len(values))], "a value outlives its mapping's eviction"
        open_fds = len(os.listdir("/proc/self/fd"))
        del values
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) <= open_fds
    finally:
        consumer.cleanup()


def test_an_arrival_names_only_a_value_file_of_the_hosts_own_directory(tmp_path: Path) -> None:
    """What the worker maps, and later removes or moves, from an Arrival: a ``*.bin`` file
    of its own directory; a spare goes back only to another host's directory beside it."""
    shm = ShmDir(str(tmp_path / "host-a"), "w")
    other = tmp_path / "host-b"
    other.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"x")
    inside = shm.new_file("value", 16)
    assert shm.own_file(inside) == inside
    assert shm.own_file(os.path.basename(inside)) == inside
    for path in (str(tmp_path / "secret.bin"), str(other / "w1-0-value.bin"), "/etc/passwd",
                 os.path.join(shm.path, "..", "secret.bin"), os.path.join(shm.path, "coordinator")):
        with pytest.raises(ValueError, match="not a value file of this host's"):
            shm.own_file(path)
    assert shm.sibling_dir(str(other)) == str(other)
    for directory in (shm.path, str(tmp_path), "/etc", str(tmp_path / "host-b" / "deeper")):
        with pytest.raises(ValueError, match="not another host's shared-memory directory"):
            shm.sibling_dir(directory)
