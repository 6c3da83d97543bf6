"""Pushing values that leave the slice to the sidecars of the slices consuming them.

When the worker has written a routed value's pieces to shared memory, the
sidecar sends them to every destination at once and deletes the files when all
destinations are done. A destination that reads only a block of the value (a host
of a slice that shards it) gets only the parts of this host's pieces inside that
block (`shared_memory.cropped_to`), or a bare "nothing from me" header. A failed value travels as a header with `error`, so the
consumers fail instead of waiting.

The first push to a peer asks its `Health` for its data channel
(`pathways_worker.sidecar.data_channel`): if it has one, values go there, the bytes
sent straight from the piece files, or on the same machine (same boot id and
shared-memory device) the files themselves handed over. Otherwise, and for a
peer that refuses a handover, they stream over `Dataflow.Put` in 1 MiB chunks.
A small value that left the worker inline is written to an idle connection
at once, on the thread that got it from the worker; only the wait for the
answer goes to a pool thread.

Each push presents the receiving slice's token, which the controller put on
the Launch's routes (`learn_tokens`); a peer it has none for gets this
slice's own (a peer of the same slice).

A destination that cannot be reached is retried a bounded number of times with
backoff; after that the failure is logged naming the value and destination,
recorded in `failures`, and a last attempt is made to tell the destination the
value is lost (so its consumers fail with this reason rather than time out).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from pathways_wire.transfer import DEFAULT_CHUNK_BYTES, MAX_MESSAGE_BYTES, error_chunk, moves_inline, value_name
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.slice_token import call_metadata
from pathways_wire.data_frames import DataChannelError
from pathways_worker.shared_memory import KeptMaps, cropped_to, exported_chunks, remove_pieces
from pathways_worker.sidecar.data_channel import DataLink, PeerData, boot_id
from pathways_worker.sidecar.transfer_stats import TransferPath, TransferStats

log = logging.getLogger(__name__)

PEER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


class PeerPusher:
    def __init__(
        self,
        sender: str,
        attempts: int = 4,
        backoff_s: float = 0.25,
        timeout_s: float = 600.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        shm_dir: str = "",
        token: str = "",
        data_channel: bool = True,
        file_handover: bool = True,
        transfers: TransferStats | None = None,
        done_with: Callable[[pb.Exported], None] = remove_pieces,
        maps: KeptMaps | None = None,
    ) -> None:
        """`shm_dir`: where the worker writes pieces (its device decides whether a
        peer can take files); `token`: presented to peers (data channel and gRPC Put);
        `transfers`: counts the bytes pushed, by path; `done_with`: what becomes of
        a value's piece files once every destination has them (removed, or kept
        as spares for the next writer); `maps`: where piece files are read from
        (`data_channel.send_file`)."""
        self._done_with = done_with
        self._maps = maps
        self.sender = sender
        self.transfers = transfers or TransferStats()
        self.token = token
        self.data_channel = data_channel
        self.file_handover = file_handover and bool(shm_dir)
        self._node = boot_id()
        self._shm_device = os.stat(shm_dir).st_dev if shm_dir else -1
        self._peers: dict[str, PeerData] = {}
        self._idle: dict[str, list[DataLink]] = {}
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._peer_tokens: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="push")

    def stub(self, address: str) -> pb_grpc.DataflowStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc.insecure_channel(address, options=PEER_OPTIONS)
            return pb_grpc.DataflowStub(channel)

    def learn_tokens(self, destinations: Sequence[str], tokens: Sequence[str]) -> None:
        """The receiving slices' tokens of a Launch's route (`Route.destination_tokens`)."""
        with self._lock:
            for address, token in zip(destinations, tokens):
                if token:
                    self._peer_tokens[address] = token

    def _token_for(self, address: str) -> str:
        with self._lock:
            return self._peer_tokens.get(address, self.token)

    def push(
        self, exported: pb.Exported, destinations: Sequence[str], blocks: Sequence[pb.Region] = ()
    ) -> None:
        """Sends the value to every destination in parallel; frees its files after.
        `blocks`: per destination (same order), the block of the value it reads (empty,
        or none: the whole value); it gets only this host's pieces' parts inside it."""
        if not destinations:
            log.error(
                "%s of call %s left the worker but its Launch routes it nowhere; dropped",
                value_name(exported.value), exported.call_id,
            )
            remove_pieces(exported)
            return
        left = [len(destinations)]

        def one(
            address: str, block: pb.Region, copy: pb.Exported | None, movable: bool, sent: DataLink | None
        ) -> None:
            try:
                if copy is None:
                    copy = self._cropped(exported, block, address)
                if copy is not None and (sent is None or not self._answered(copy, address, sent)):
                    self._push_one(copy, address, movable)
            finally:
                with self._lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    self._done_with(exported)

        at_once = sends_at_once(exported)
        for i, address in enumerate(destinations):
            block = blocks[i] if i < len(blocks) else pb.Region()
            movable = len(destinations) == 1 and not (block.start or block.stop)
            # a small inline value is cut here, cheaply; a larger one on the pool's thread
            copy = cropped_to(exported, block) if at_once else None
            sent = self._send_now(copy, address, movable) if copy is not None else None
            self._pool.submit(one, address, block, copy, movable, sent)

    def _cropped(self, exported: pb.Exported, block: pb.Region, address: str) -> pb.Exported | None:
        """What `address` gets of the value (`cropped_to`); None, once it was told the
        value is lost, where its pieces could not be read."""
        try:
            return cropped_to(exported, block)
        except (OSError, ValueError) as err:
            self._give_up(exported, address, (
                f"cutting {value_name(exported.value)} of call {exported.call_id} on {self.sender} "
                f"to the block {address} reads failed: {type(err).__name__}: {err}"
            ))
            return None

    def _send_now(self, exported: pb.Exported, address: str, movable: bool) -> DataLink | None:
        """Sends a small value on the caller's thread over an idle link to a
        known peer, so its bytes leave without waiting for a pool thread; the
        link waiting for the answer, or None if there was none to use."""
        with self._lock:
            peer = self._peers.get(address)
            idle = self._idle.get(address)
            link = idle.pop() if idle and peer is not None and peer.address else None
        if link is None or peer is None:
            return None
        try:
            link.send_exported(exported, handover=peer.same_node, movable=movable)
        except OSError:
            link.close()
            return None
        return link

    def _answered(self, exported: pb.Exported, address: str, link: DataLink) -> bool:
        """Waits for the answer to a value sent by `_send_now`; False if there
        was none or it was a refusal (the value is then pushed as usual, which
        retries or reports it)."""
        try:
            link.answer()
        except (DataChannelError, OSError):
            link.close()
            return False
        path: TransferPath = "handover" if self._peers[address].same_node else "data-channel"
        self.transfers.add("out", path, sum(p.nbytes for p in exported.pieces))
        with self._lock:
            self._idle.setdefault(address, []).append(link)
        return True

    def _push_one(self, exported: pb.Exported, address: str, movable: bool) -> None:
        what = f"{value_name(exported.value)} of call {exported.call_id}"
        for attempt in range(1, self.attempts + 1):
            try:
                peer = self._peer(address)
                path: TransferPath = "grpc"
                if peer is not None and peer.address:
                    self._send_data(exported, address, peer, movable)
                    path = "handover" if peer.same_node else "data-channel"
                else:
                    self.stub(address).Put(
                        self._chunks(exported), timeout=self.timeout_s,
                        metadata=call_metadata(self._token_for(address)),
                    )
                self.transfers.add("out", path, sum(p.nbytes for p in exported.pieces))
                return
            except (grpc.RpcError, DataChannelError, OSError) as err:
                code, details = _status(err)
                if code == grpc.StatusCode.INVALID_ARGUMENT and "header.path" in details:
                    log.warning("%s takes no files from %s (%s); sending bytes", address, self.sender, details)
                    with self._lock:
                        self._peers[address] = PeerData(self._peers[address].address, same_node=False)
                    continue
                if code not in _RETRYABLE or attempt == self.attempts:
                    self._give_up(exported, address, (
                        f"pushing {what} from {self.sender} to {address} failed after "
                        f"{attempt} attempt(s): {code.name}: {details}"
                    ))
                    return
                log.warning("pushing %s to %s: %s (attempt %d), retrying", what, address, code.name, attempt)
                time.sleep(self.backoff_s * 2 ** (attempt - 1))

    def _peer(self, address: str) -> PeerData | None:
        """The peer's data channel, asked once (None: ask again next time)."""
        if not self.data_channel:
            return PeerData("", same_node=False)
        with self._lock:
            known = self._peers.get(address)
        if known is not None:
            return known
        try:
            health: pb.HealthReply = self.stub(address).Health(
                pb.HealthRequest(), timeout=5.0, metadata=call_metadata(self._token_for(address))
            )
        except grpc.RpcError as err:
            log.info("%s did not say where its data channel is (%s); using Put", address, _status(err)[0].name)
            return None
        if not health.detailed:  # it did not take the token this host holds for it
            log.info("%s did not say where its data channel is (not to this host's token); using Put", address)
            return None
        same_node = (
            self.file_handover and bool(self._node) and health.node == self._node
            and health.shm_device == self._shm_device
        )
        peer = PeerData(health.data_address, same_node)
        with self._lock:
            self._peers[address] = peer
        log.info("peer %s: data channel %r, same machine: %s", address, peer.address or None, same_node)
        return peer

    def _send_data(self, exported: pb.Exported, address: str, peer: PeerData, movable: bool) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            link = idle.pop() if idle else None
        if link is None:
            link = DataLink(peer.address, self.sender, self._token_for(address), self.timeout_s, self._maps)
        try:
            link.send(exported, handover=peer.same_node, movable=movable)
        except BaseException:
            link.close()
            raise
        with self._lock:
            self._idle.setdefault(address, []).append(link)

    def _give_up(self, exported: pb.Exported, address: str, message: str) -> None:
        """The value will not reach `address`: logged, recorded, and said to it."""
        log.error("%s", message)
        with self._lock:
            self.failures.append(message)
        self._tell_lost(exported, address, message)

    def _tell_lost(self, exported: pb.Exported, address: str, message: str) -> None:
        try:
            chunk = error_chunk(exported.call_id, exported.value, exported.spec, self.sender, message)
            self.stub(address).Put(
                iter([chunk]), timeout=5.0, metadata=call_metadata(self._token_for(address))
            )
        except grpc.RpcError:
            pass

    def _chunks(self, exported: pb.Exported) -> Iterator[pb.BufferChunk]:
        return exported_chunks(exported, self.sender, self.chunk_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for links in self._idle.values():
                for link in links:
                    link.close()
            self._idle.clear()
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


def sends_at_once(exported: pb.Exported) -> bool:
    """Whether a value is sent on the thread that got it from the worker: its
    pieces are all inline and small (`transfer.moves_inline`), so sending them is
    one short write and reads no file."""
    return all(not piece.path for piece in exported.pieces) and moves_inline(
        sum(piece.nbytes for piece in exported.pieces)
    )


def _status(err: BaseException) -> tuple[grpc.StatusCode, str]:
    """A gRPC-style status for any way a push can fail."""
    if isinstance(err, grpc.Call):
        return err.code(), err.details() or ""
    if isinstance(err, DataChannelError):
        return getattr(grpc.StatusCode, err.code, grpc.StatusCode.UNKNOWN), str(err)
    if isinstance(err, OSError):
        return grpc.StatusCode.UNAVAILABLE, f"data channel: {err}"
    return grpc.StatusCode.UNKNOWN, str(err)
