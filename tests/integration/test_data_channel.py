"""The sidecars' raw TCP data channel over real loopback sockets and shared-memory files.

A receiving side (a `DataChannelServer` feeding a real `Inbox` over a shm
directory, with a byte budget) and a sending side (`DataLink` with piece files
written the way the worker writes them). Checked: bytes arrive whole, files
are handed over on one machine (copied, or moved when movable), and malformed
frames, wrong tokens, files that are not what they claim and values beyond the
budget are refused naming the field, with the connection closed while the
server keeps serving.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import time

import numpy as np
import pytest

from pathways.host_data import HostData
from pathways_wire import transfer
from pathways_wire import pathways_pb2 as pb
from pathways_wire.slice_token import client_token, route_token
from pathways_worker.sidecar.byte_budget import ByteBudget
from pathways_wire.data_frames import HELLO, PIECE, REPLY, read_frame, send_frame
from pathways_wire.data_frames import BUSY, DataChannelError, DataConnection
from pathways_worker.sidecar.data_channel import DataChannelServer, DataLink, Refusal
from pathways_worker.shared_memory import KeptMaps, ShmDir, map_value
from pathways_worker.sidecar.inbox import Inbox
from tests.integration.hello_floods import flood_past_the_bound, held_past_the_bound, once_served, wait_until

TOKEN = "slice-token"
BUDGET = 1 << 20


@dataclass
class Receiver:
    server: DataChannelServer
    shm: ShmDir
    arrivals: list[pb.Arrival]
    inbox: Inbox

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def link(self, token: str = TOKEN) -> DataLink:
        return DataLink(self.address, "sender-host", token, timeout_s=30.0)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    shm = ShmDir(str(tmp_path / "receiver"), "s")
    arrivals: list[pb.Arrival] = []
    inbox = Inbox(shm, ByteBudget(BUDGET), deliver=arrivals.append, host_name="receiver", wait_s=0.2)
    for call_id in ("call-1", "call-2"):  # what each call's Launch would say: one sender
        inbox.expect(call_id, [pb.Expect(value=pb.ValueRef(node=3, index=0), senders=1)])
    server = DataChannelServer("127.0.0.1", 0, inbox, "receiver", TOKEN)
    yield Receiver(server, shm, arrivals, inbox)
    server.close()


def exported_value(tmp_path: Path, value: np.ndarray, shards: int, call_id: str = "call-1") -> pb.Exported:
    """A value split into `shards` row blocks, written as piece files like the worker's."""
    shm = ShmDir(str(tmp_path / "sender"), "w")
    exported = pb.Exported(call_id=call_id, spec=transfer.spec_of(value))
    exported.value.node, exported.value.index = 3, 0
    rows = value.shape[0] // shards
    for i in range(shards):
        piece = transfer.Piece((i * rows, 0), ((i + 1) * rows, value.shape[1]), value[i * rows : (i + 1) * rows])
        path = shm.write_piece(piece)
        exported.pieces.add(start=piece.start, stop=piece.stop, path=path, nbytes=piece.data.nbytes)
    return exported


def arrived(receiver: Receiver, value: np.ndarray) -> np.ndarray:
    assert len(receiver.arrivals) == 1 and not receiver.arrivals[0].error, receiver.arrivals
    arrival = receiver.arrivals[0]
    return map_value(arrival.path, tuple(arrival.spec.shape), np.dtype(arrival.spec.dtype))


VALUE = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)


def value_files(receiver: Receiver) -> list[str]:
    """The files of values being assembled (not the warm files made for the next ones)."""
    return sorted(n for n in os.listdir(receiver.shm.path) if n.endswith("-value.bin"))


def test_bytes_arrive_whole(receiver: Receiver, tmp_path: Path) -> None:
    link = receiver.link()
    assert link.send(exported_value(tmp_path, VALUE, 4), handover=False, movable=False) == 4
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
    link.send(exported_value(tmp_path, VALUE, 2, call_id="call-2"), handover=False, movable=False)
    assert len(receiver.arrivals) == 2  # one connection carries many values


def test_releasing_a_call_drops_its_unfinished_values_and_leaves_another_calls(
    receiver: Receiver, tmp_path: Path
) -> None:
    for call_id in ("call-3", "call-4"):  # two senders each; one sends: neither value completes
        receiver.inbox.expect(call_id, [pb.Expect(value=pb.ValueRef(node=3, index=0), senders=2)])
        receiver.link().send(exported_value(tmp_path, VALUE, 2, call_id=call_id), handover=False, movable=False)
    assert len(value_files(receiver)) == 2 and len(receiver.inbox.pending()) == 2
    receiver.inbox.release_call("call-3")
    assert [name.endswith("of call call-4") for name in receiver.inbox.pending()] == [True]
    assert len(value_files(receiver)) == 1
    second = DataLink(receiver.address, "sender-2", TOKEN, timeout_s=30.0)
    second.send(exported_value(tmp_path, VALUE, 2, call_id="call-4"), handover=False, movable=False)
    assert len(receiver.arrivals) == 1 and receiver.arrivals[0].call_id == "call-4", "call-4 still counted its senders"
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)


def test_a_piece_file_of_a_spares_size_is_sent_from_the_mapping_kept_from_its_last_trip(
    receiver: Receiver, tmp_path: Path
) -> None:
    maps = KeptMaps(1 << 30, writable=False)
    link = DataLink(receiver.address, "sender-host", TOKEN, timeout_s=30.0, maps=maps)
    big = np.arange(512 * 256, dtype=np.float32).reshape(512, 256)
    first = exported_value(tmp_path, big, 1)
    link.send(first, handover=False, movable=False)
    np.testing.assert_array_equal(arrived(receiver, big), big)
    with open(first.pieces[0].path, "r+b") as f:  # the worker's next piece, in the file come back
        f.write((big + 1).tobytes())
    again = pb.Exported()
    again.CopyFrom(first)
    again.call_id = "call-2"

    link.send(again, handover=False, movable=False)

    second = receiver.arrivals[1]
    assert not second.error
    np.testing.assert_array_equal(map_value(second.path, big.shape, np.dtype(np.float32)), big + 1)
    assert maps.kept_bytes == big.nbytes, "one mapping, kept from the first trip and read again"


def test_a_piece_file_shorter_than_its_piece_is_not_sent(receiver: Receiver, tmp_path: Path) -> None:
    exported = exported_value(tmp_path, VALUE, 1)
    os.truncate(exported.pieces[0].path, 100)
    with pytest.raises(DataChannelError, match=f"{exported.pieces[0].path} holds 100 of the piece's"):
        receiver.link().send(exported, handover=False, movable=False)
    assert receiver.arrivals == []


def test_files_are_copied_on_one_machine(receiver: Receiver, tmp_path: Path) -> None:
    exported = exported_value(tmp_path, VALUE, 4)
    receiver.link().send(exported, handover=True, movable=True)  # several pieces: copied
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
    assert all(os.path.exists(p.path) for p in exported.pieces)  # the sender still owns them


def test_a_whole_movable_piece_is_moved(receiver: Receiver, tmp_path: Path) -> None:
    exported = exported_value(tmp_path, VALUE, 1)
    receiver.link().send(exported, handover=True, movable=True)
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
    assert not os.path.exists(exported.pieces[0].path)
    assert os.path.dirname(receiver.arrivals[0].path) == receiver.shm.path


SMALL = np.arange(8 * 256, dtype=np.float32).reshape(8, 256)


def inline_value(value: np.ndarray, shards: int, call_id: str = "call-1") -> pb.Exported:
    """A small value split into `shards` row blocks, each carried inline as the worker exports it."""
    exported = pb.Exported(call_id=call_id, spec=transfer.spec_of(value))
    exported.value.node, exported.value.index = 3, 0
    rows = value.shape[0] // shards
    for i in range(shards):
        block = value[i * rows : (i + 1) * rows]
        exported.pieces.add(
            start=(i * rows, 0), stop=((i + 1) * rows, value.shape[1]), data=block.tobytes(), nbytes=block.nbytes,
        )
    return exported


@pytest.mark.parametrize("handover", [False, True])
def test_a_small_value_travels_inline_and_arrives_without_a_file(receiver: Receiver, handover: bool) -> None:
    assert transfer.moves_inline(SMALL.nbytes)
    assert receiver.link().send(inline_value(SMALL, 2), handover=handover, movable=True) == 2
    assert len(receiver.arrivals) == 1 and not receiver.arrivals[0].error, receiver.arrivals
    arrival = receiver.arrivals[0]
    assert arrival.path == ""
    np.testing.assert_array_equal(np.frombuffer(arrival.data, np.float32).reshape(SMALL.shape), SMALL)
    assert not [n for n in os.listdir(receiver.shm.path) if n.endswith(".bin")]


def test_a_failed_value_reaches_the_consumer_as_an_error(receiver: Receiver) -> None:
    exported = pb.Exported(call_id="call-1", error="producer exploded")
    exported.value.node = 3
    receiver.link().send(exported, handover=False, movable=False)
    assert receiver.arrivals and "producer exploded" in receiver.arrivals[0].error


def test_a_file_that_is_not_what_it_claims_is_refused(receiver: Receiver, tmp_path: Path) -> None:
    exported = exported_value(tmp_path, VALUE, 1)
    link = receiver.link()
    header = transfer.piece_header("call-1", exported.value, exported.spec, None, "sender-host", True)
    header.start[:] = [0, 0]
    header.stop[:] = list(VALUE.shape)
    header.nbytes = VALUE.nbytes
    header.path, header.file_device, header.file_inode = exported.pieces[0].path, 1, 2
    send_frame(link.sock, PIECE, header)
    reply = pb.PutReply()
    read_frame(link.sock, REPLY, reply)
    assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error


def raw_connection(receiver: Receiver, token: str = TOKEN) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", receiver.server.port), timeout=30)
    send_frame(sock, HELLO, pb.DataHello(sender="raw", token=token))
    return sock


def refusal(sock: socket.socket) -> pb.PutReply:
    reply = pb.PutReply()
    read_frame(sock, REPLY, reply)
    assert sock.recv(1) == b""  # and the connection is closed
    return reply


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (struct.pack("!BI", ord("X"), 0), "frame.kind"),
        (struct.pack("!BI", PIECE, 1 << 30), "frame.length"),
        (struct.pack("!BI", PIECE, 3) + b"\xff\xff\xff", "frame"),
        (struct.pack("!BI", PIECE, 0), "header.call_id"),
    ],
)
def test_malformed_frames_are_refused_and_the_server_keeps_serving(
    receiver: Receiver, tmp_path: Path, frame: bytes, field: str
) -> None:
    with raw_connection(receiver) as sock:
        sock.sendall(frame)
        reply = refusal(sock)
    assert reply.code == "INVALID_ARGUMENT" and f"{field}:" in reply.error, reply.error
    receiver.link().send(exported_value(tmp_path, VALUE, 2), handover=False, movable=False)
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)


def test_a_wrong_token_is_refused(receiver: Receiver, tmp_path: Path) -> None:
    with pytest.raises(DataChannelError, match="hello.token") as err:
        receiver.link(token="guess").send(exported_value(tmp_path, VALUE, 1), handover=False, movable=False)
    assert err.value.code == "INVALID_ARGUMENT"
    assert not receiver.arrivals


def test_a_hello_with_an_empty_token_is_refused(receiver: Receiver, tmp_path: Path) -> None:
    with pytest.raises(DataChannelError, match="hello.token") as err:
        receiver.link(token="").send(exported_value(tmp_path, VALUE, 1), handover=False, movable=False)
    assert err.value.code == "INVALID_ARGUMENT"
    assert "host receiver" in str(err.value) and "presented no token" in str(err.value), err.value
    assert not receiver.arrivals


def test_a_data_channel_without_a_token_refuses_to_open(tmp_path: Path) -> None:
    """An empty token is not "check nothing": the server is not made, so no hello is let in."""
    shm = ShmDir(str(tmp_path / "tokenless"), "s")
    inbox = Inbox(shm, ByteBudget(BUDGET), deliver=lambda _: None, host_name="tokenless", wait_s=0.2)
    with pytest.raises(ValueError, match="host tokenless: refusing to open a data channel without a slice token"):
        server = DataChannelServer("127.0.0.1", 0, inbox, "tokenless", "")
        server.close()
    server = DataChannelServer("127.0.0.1", 0, inbox, "tokenless", "", insecure=True)
    server.close()


def test_a_value_beyond_the_budget_is_refused_as_exhausted(receiver: Receiver, tmp_path: Path) -> None:
    big = np.zeros((1024, 512), np.float32)  # 2 MiB, over the 1 MiB budget
    with pytest.raises(DataChannelError) as err:
        receiver.link().send(exported_value(tmp_path, big, 2), handover=False, movable=False)
    assert err.value.code == "RESOURCE_EXHAUSTED"
    receiver.link().send(exported_value(tmp_path, VALUE, 2, call_id="call-2"), handover=False, movable=False)
    assert len(receiver.arrivals) == 1 and not receiver.arrivals[0].error


def test_a_client_puts_values_from_memory_on_one_connection(receiver: Receiver) -> None:
    conn = DataConnection(receiver.address, "client", TOKEN, timeout_s=30.0)
    values = [
        [transfer.whole_value_piece(call_id, pb.ValueRef(node=3, index=0), VALUE * k)]
        for k, call_id in enumerate(("call-1", "call-2"), start=1)
    ]
    assert conn.put(values) == 2
    assert [a.call_id for a in receiver.arrivals] == ["call-1", "call-2"]
    for k, arrival in enumerate(receiver.arrivals, start=1):
        got = map_value(arrival.path, tuple(arrival.spec.shape), np.dtype(arrival.spec.dtype))
        np.testing.assert_array_equal(got, VALUE * k)
    assert conn.is_open()
    conn.close()


def test_a_client_holding_the_slices_client_token_is_let_in(receiver: Receiver) -> None:
    conn = DataConnection(receiver.address, "client", client_token(TOKEN), timeout_s=30.0)
    assert conn.put([[transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)]]) == 1
    assert [a.call_id for a in receiver.arrivals] == ["call-1"]
    conn.close()


def test_a_refused_client_learns_why_and_its_connection_reads_as_closed(receiver: Receiver) -> None:
    conn = DataConnection(receiver.address, "client", "not-the-token", timeout_s=30.0)
    value = [transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)]
    with pytest.raises(DataChannelError, match="hello.token") as refused:
        conn.put([value])
    assert refused.value.code == "INVALID_ARGUMENT"
    assert receiver.arrivals == []
    deadline = time.monotonic() + 10
    while conn.is_open() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not conn.is_open()
    conn.close()


def fetch_request(call_id: str = "call-1") -> pb.FetchRequest:
    request = pb.FetchRequest(call_id=call_id, timeout_s=10.0)
    request.value.node, request.value.index = 3, 0
    return request


def test_a_client_fetches_a_hosts_pieces_straight_into_the_value(tmp_path: Path) -> None:
    exported = exported_value(tmp_path, VALUE, 4)
    asked: list[pb.FetchRequest] = []

    def fetch(request: pb.FetchRequest) -> pb.Exported | Refusal:
        asked.append(request)
        return exported if request.call_id == "call-1" else Refusal("FAILED_PRECONDITION", "call-2 failed")

    shm = ShmDir(str(tmp_path / "r"), "s")
    inbox = Inbox(shm, ByteBudget(BUDGET), deliver=lambda a: None, host_name="r", wait_s=0.2)
    server = DataChannelServer("127.0.0.1", 0, inbox, "r", TOKEN, fetch=fetch)
    conn = DataConnection(f"127.0.0.1:{server.port}", "client", TOKEN, timeout_s=30.0)
    try:
        target = transfer.FetchTarget("v")
        conn.fetch(fetch_request(), target, "r")
        assert target.assembler is not None and target.assembler.complete
        np.testing.assert_array_equal(target.assembler.target, VALUE)
        deadline = time.monotonic() + 10  # the host removes the files after the last byte left
        while any(os.path.exists(p.path) for p in exported.pieces) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(os.path.exists(p.path) for p in exported.pieces)
        with pytest.raises(DataChannelError, match="call-2 failed") as refused:
            conn.fetch(fetch_request("call-2"), transfer.FetchTarget("v"), "r")
        assert refused.value.code == "FAILED_PRECONDITION"
        assert [r.call_id for r in asked] == ["call-1", "call-2"]
    finally:
        conn.close()
        server.close()


def test_a_host_that_serves_no_fetches_says_so(receiver: Receiver) -> None:
    conn = DataConnection(receiver.address, "client", TOKEN, timeout_s=30.0)
    with pytest.raises(DataChannelError, match="not served here; use gRPC Fetch") as refused:
        conn.fetch(fetch_request(), transfer.FetchTarget("v"), "receiver")
    assert refused.value.code == "UNIMPLEMENTED"
    conn.close()


def handed_over(receiver: Receiver, path: str, nbytes: int, movable: bool = True) -> pb.PutReply:
    """Sends a header naming `path` as the value's whole piece, with the device and inode
    the file has, as a holder of the slice's token could; the receiver's answer."""
    st = os.stat(path)
    header = transfer.piece_header("call-1", pb.ValueRef(node=3, index=0), transfer.spec_of(VALUE), None, "sender", True)
    header.start[:] = [0, 0]
    header.stop[:] = list(VALUE.shape)
    header.nbytes = nbytes
    header.path, header.file_device, header.file_inode, header.movable = path, st.st_dev, st.st_ino, movable
    sock = raw_connection(receiver)
    try:
        send_frame(sock, PIECE, header)
        reply = pb.PutReply()
        read_frame(sock, REPLY, reply)
        return reply
    finally:
        sock.close()


def secret_file(directory: Path, name: str = "secret.bin") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"not a value: a file of this machine's " + bytes(VALUE.nbytes))
    return path


@pytest.mark.parametrize("where", ["outside", "above", "own", "not-a-piece"])
def test_a_file_outside_the_other_hosts_shared_memory_is_never_taken(
    receiver: Receiver, tmp_path: Path, where: str
) -> None:
    """A token holder on this machine can name any path: only a piece file (``*.bin``) in
    another host's shared-memory directory, a sibling of the receiver's, is taken over.
    Anything else (a file of another tree, one beside the directories, one in the
    receiver's own, a file that is no piece) is refused, and left as it was."""
    path = {
        "outside": lambda: secret_file(tmp_path / "etc" / "deep"),
        "above": lambda: secret_file(tmp_path),
        "own": lambda: secret_file(Path(receiver.shm.path)),
        "not-a-piece": lambda: secret_file(tmp_path / "sender", "coordinator"),
    }[where]()
    before = path.read_bytes()
    reply = handed_over(receiver, str(path), VALUE.nbytes)
    assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error, reply
    assert receiver.arrivals == []
    assert path.read_bytes() == before


def test_a_symlink_in_a_hosts_directory_is_not_followed(receiver: Receiver, tmp_path: Path) -> None:
    target = secret_file(tmp_path / "etc")
    link = tmp_path / "sender" / "w1-0-piece.bin"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    reply = handed_over(receiver, str(link), VALUE.nbytes, movable=False)
    assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error, reply
    assert receiver.arrivals == [] and target.exists()


def test_a_host_directory_that_is_a_link_to_elsewhere_is_not_followed(receiver: Receiver, tmp_path: Path) -> None:
    secret_file(tmp_path / "etc", "w1-0-piece.bin")
    (tmp_path / "linked-host").symlink_to(tmp_path / "etc", target_is_directory=True)
    reply = handed_over(receiver, str(tmp_path / "linked-host" / "w1-0-piece.bin"), VALUE.nbytes)
    assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error, reply
    assert receiver.arrivals == [] and (tmp_path / "etc" / "w1-0-piece.bin").exists()


def test_a_refused_handover_does_not_say_what_the_named_file_is(receiver: Receiver, tmp_path: Path) -> None:
    """A wrong device and inode are refused without the file's own, which would let a sender
    learn them and name the file again."""
    exported = exported_value(tmp_path, VALUE, 1)
    st = os.stat(exported.pieces[0].path)
    header = transfer.piece_header("call-1", exported.value, exported.spec, None, "sender-host", True)
    header.start[:] = [0, 0]
    header.stop[:] = list(VALUE.shape)
    header.nbytes = VALUE.nbytes
    header.path, header.file_device, header.file_inode = exported.pieces[0].path, 1, 2
    sock = raw_connection(receiver)
    send_frame(sock, PIECE, header)
    reply = pb.PutReply()
    read_frame(sock, REPLY, reply)
    sock.close()
    assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error
    assert str(st.st_ino) not in reply.error


def test_a_host_without_file_handover_refuses_a_named_file(tmp_path: Path) -> None:
    shm = ShmDir(str(tmp_path / "receiver"), "s")
    arrivals: list[pb.Arrival] = []
    inbox = Inbox(shm, ByteBudget(BUDGET), deliver=arrivals.append, host_name="receiver", wait_s=0.2, handover=False)
    inbox.expect("call-1", [pb.Expect(value=pb.ValueRef(node=3, index=0), senders=1)])
    server = DataChannelServer("127.0.0.1", 0, inbox, "receiver", TOKEN)
    try:
        receiver = Receiver(server, shm, arrivals, inbox)
        exported = exported_value(tmp_path, VALUE, 1)
        reply = handed_over(receiver, exported.pieces[0].path, VALUE.nbytes)
        assert reply.code == "INVALID_ARGUMENT" and "header.path" in reply.error and "handover" in reply.error, reply
        assert arrivals == [] and os.path.exists(exported.pieces[0].path)
    finally:
        server.close()


def test_a_value_that_cannot_be_made_gives_its_room_back(receiver: Receiver) -> None:
    """The receiver's shared-memory directory is gone: the value cannot be made, the
    sender's put fails, and the room its size took in the byte budget is free again."""
    budget = receiver.inbox._budget
    os.rename(receiver.shm.path, receiver.shm.path + "-gone")
    conn = DataConnection(receiver.address, "client", TOKEN, timeout_s=30.0)
    with pytest.raises((DataChannelError, ConnectionError)):
        conn.put([[transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)]])
    conn.close()
    assert budget.used == 0
    assert receiver.arrivals == []


def test_values_of_a_call_no_launch_named_are_orphaned_after_a_while_and_launched_ones_never(
    tmp_path: Path,
) -> None:
    now = [100.0]
    shm = ShmDir(str(tmp_path / "receiver"), "s")
    budget = ByteBudget(BUDGET)
    inbox = Inbox(shm, budget, deliver=lambda _: None, host_name="receiver", wait_s=0.2, clock=lambda: now[0])
    inbox.expect("launched", [pb.Expect(value=pb.ValueRef(node=3, index=0), senders=1)])
    inbox.expect("late", [])
    server = DataChannelServer("127.0.0.1", 0, inbox, "receiver", TOKEN)
    try:
        conn = DataConnection(f"127.0.0.1:{server.port}", "client", TOKEN, timeout_s=30.0)
        for call_id in ("launched", "made-up", "put-first"):
            assert conn.put([[transfer.whole_value_piece(call_id, pb.ValueRef(node=3, index=0), VALUE)]]) == 1
        conn.close()
        inbox.expect("put-first", [])  # a put that overtook its launch
        assert inbox.orphaned(60.0) == []
        now[0] += 61.0
        assert inbox.orphaned(60.0) == ["made-up"]
        assert budget.held_by("made-up") == VALUE.nbytes
        inbox.release_call("made-up")
        assert inbox.orphaned(60.0) == [] and budget.held_by("made-up") == 0
    finally:
        server.close()


def test_a_sidecar_releases_a_call_whose_values_came_but_no_launch(tmp_path: Path) -> None:
    """`Dataflow.release_orphans`: the values' room in the store comes back, and a put for
    the call after that is discarded, as for any released call."""
    from pathways_worker.settings import parse_sidecar_args
    from pathways_worker.sidecar.dataflow import Dataflow

    settings = parse_sidecar_args(
        ["--listen", "127.0.0.1:0", "--worker", "127.0.0.1:1", "--insecure-no-token",
         "--shm-dir", str(tmp_path / "shm")], env={},
    )
    flow = Dataflow(settings)
    try:
        conn = DataConnection(f"127.0.0.1:{flow.data_server.port}", "client", "", timeout_s=30.0)
        assert conn.put([[transfer.whole_value_piece("made-up", pb.ValueRef(node=3, index=0), VALUE)]]) == 1
        assert flow.budget.held_by("made-up") == VALUE.nbytes
        assert flow.release_orphans(max_age_s=60.0) == []
        assert flow.release_orphans(max_age_s=0.0) == ["made-up"]
        assert flow.budget.held_by("made-up") == 0
        assert conn.put([[transfer.whole_value_piece("made-up", pb.ValueRef(node=3, index=0), VALUE)]]) == 1
        assert flow.budget.held_by("made-up") == 0, "a put for a released call is discarded"
        conn.close()
    finally:
        flow.close()


def test_a_connection_that_never_says_its_hello_is_closed_at_the_hellos_deadline(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathways_wire import session_frames

    monkeypatch.setattr(session_frames, "HELLO_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", receiver.server.port), timeout=10) as sock:
        sock.sendall(struct.pack("!BI", HELLO, 100))  # a hello announced, never sent
        assert sock.recv(1) == b""
    assert time.monotonic() - started < 3.0  # not the minute a piece's bytes may take


def test_connections_past_the_bound_of_unsaid_hellos_are_closed_and_senders_get_through_after(
    receiver: Receiver, tmp_path: Path,
) -> None:
    flood_past_the_bound(("127.0.0.1", receiver.server.port))
    once_served(lambda: receiver.link().send(exported_value(tmp_path, VALUE, 2), handover=False, movable=False),
                (OSError, DataChannelError), "the data channel")
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)


class _HealthOf:
    """What `HostData` asks a host's sidecar over gRPC (where its data channel listens) and
    its client's token for that host: the receiver's."""

    def __init__(self, receiver: Receiver) -> None:
        self._reply = pb.HealthReply(data_address=receiver.address, detailed=True)

    def stub(self, address: str) -> _HealthOf:
        return self

    def Health(self, request: pb.HealthRequest, timeout: float) -> pb.HealthReply:  # noqa: N802 (gRPC's name)
        return self._reply

    def token(self, address: str) -> str:
        return client_token(TOKEN)


def test_a_clients_put_that_a_flooded_channel_turns_away_unanswered_is_left_to_grpc(receiver: Receiver) -> None:
    """`HostData.put` answers False, so the runtime puts over gRPC, when the channel closed
    the put's new connection without a word; once the flood has passed, puts use the
    channel again."""
    data = HostData(_HealthOf(receiver), "client", 30.0)  # type: ignore[arg-type]
    piece = transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)
    with held_past_the_bound(("127.0.0.1", receiver.server.port)):
        assert data.put("host-a", [piece]) is False
    assert receiver.arrivals == []
    wait_until(lambda: data.put("host-a", [piece]), "a put over the data channel once the flood passed")
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
    data.close()


def held_connections(receiver: Receiver, count: int, token: str = TOKEN) -> list[socket.socket]:
    """`count` connections past their hello, each served, opened in steps the server takes
    whole within the bound on unsaid hellos."""
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            held += [raw_connection(receiver, token) for _ in range(min(16, count - len(held)))]
            wait_until(lambda: receiver.server.served == len(held), "the held connections served")
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held


def test_senders_past_the_bound_of_served_connections_are_refused_saying_so(
    receiver: Receiver, tmp_path: Path,
) -> None:
    from pathways_wire.port_connections import MAX_SERVED

    held = held_connections(receiver, MAX_SERVED)
    try:
        with raw_connection(receiver) as extra:
            reply = refusal(extra)
        assert reply.code == BUSY and f"{MAX_SERVED} connections are served" in reply.error
    finally:
        for sock in held:
            sock.close()
    once_served(lambda: receiver.link().send(exported_value(tmp_path, VALUE, 2), handover=False, movable=False),
                (OSError, DataChannelError), "the data channel")
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)


def test_clients_past_their_share_of_served_connections_are_turned_away_while_a_routes_sender_is_served(
    receiver: Receiver, tmp_path: Path,
) -> None:
    """Every client of a slice presents its client token, so a driver holding connections
    by the hundred takes the clients' share only: the pushes of a cross-slice route (its
    route token) and of the slice's own hosts still get in."""
    from pathways_wire.port_connections import MAX_CLIENTS_SERVED

    held = held_connections(receiver, MAX_CLIENTS_SERVED, client_token(TOKEN))
    try:
        with raw_connection(receiver, client_token(TOKEN)) as extra:
            reply = refusal(extra)
        assert reply.code == BUSY, reply
        assert f"{MAX_CLIENTS_SERVED} clients' connections are served" in reply.error, reply.error
        receiver.link(token=route_token(TOKEN)).send(exported_value(tmp_path, VALUE, 2), handover=False, movable=False)
        np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
        receiver.link().send(exported_value(tmp_path, VALUE * 2, 2, "call-2"), handover=False, movable=False)
        assert [a.call_id for a in receiver.arrivals] == ["call-1", "call-2"]
    finally:
        for sock in held:
            sock.close()
    once_served(lambda: DataConnection(receiver.address, "client", client_token(TOKEN), 30.0).put(
        [[transfer.whole_value_piece("call-3", pb.ValueRef(node=3, index=0), VALUE)]]
    ), (OSError, DataChannelError), "a client's connection")


def test_a_clients_put_and_fetch_that_the_channel_turns_away_as_one_too_many_go_over_grpc(
    receiver: Receiver,
) -> None:
    from pathways_wire.port_connections import MAX_CLIENTS_SERVED

    data = HostData(_HealthOf(receiver), "client", 30.0)  # type: ignore[arg-type]
    piece = transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)
    over_grpc: list[pb.FetchRequest] = []
    held = held_connections(receiver, MAX_CLIENTS_SERVED, client_token(TOKEN))
    try:
        assert data.put("host-a", [piece]) is False
        data.receive("host-a", lambda request, target, host: over_grpc.append(request))(
            fetch_request(), transfer.FetchTarget("v"), "host-a"
        )
        assert [r.call_id for r in over_grpc] == ["call-1"]
        assert receiver.arrivals == []
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: data.put("host-a", [piece]), "a put over the data channel once the connections closed")
    np.testing.assert_array_equal(arrived(receiver, VALUE), VALUE)
    data.close()


def test_a_routes_token_sends_values_but_fetches_nothing(receiver: Receiver) -> None:
    conn = DataConnection(receiver.address, "route-sender", route_token(TOKEN), timeout_s=30.0)
    assert conn.put([[transfer.whole_value_piece("call-1", pb.ValueRef(node=3, index=0), VALUE)]]) == 1
    with pytest.raises(DataChannelError, match="route's token opens sending values only") as refused:
        conn.fetch(fetch_request(), transfer.FetchTarget("v"), "receiver")
    assert refused.value.code == "INVALID_ARGUMENT"
    conn.close()
