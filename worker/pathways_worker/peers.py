"""Pushing values that leave the slice to the sidecars of the slices consuming them.

When the worker has written a routed value's pieces to shared memory, the
sidecar streams them (`Dataflow.Put`, 1 MiB chunks) to every destination at
once, each over a long-lived channel to that peer, and deletes the files when
all destinations are done. A failed value travels as a header with `error`, so
the consumers fail instead of waiting.

A destination that cannot be reached is retried a bounded number of times with
backoff; after that the failure is logged naming the value and destination,
recorded in `failures`, and a last attempt is made to tell the destination the
value is lost (so its consumers fail with this reason rather than time out).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from pathways.transfer import DEFAULT_CHUNK_BYTES, MAX_MESSAGE_BYTES, error_chunk, value_name
from pathways.wire import pathways_pb2 as pb
from pathways.wire import pathways_pb2_grpc as pb_grpc
from pathways_worker.shared_memory import exported_chunks, remove_pieces

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
    ) -> None:
        self.sender = sender
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="push")

    def stub(self, address: str) -> pb_grpc.DataflowStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc.insecure_channel(address, options=PEER_OPTIONS)
            return pb_grpc.DataflowStub(channel)

    def push(self, exported: pb.Exported, destinations: Sequence[str]) -> None:
        """Sends the value to every destination in parallel; frees its files after."""
        if not destinations:
            log.error(
                "%s of call %s left the worker but its Launch routes it nowhere; dropped",
                value_name(exported.value), exported.call_id,
            )
            remove_pieces(exported)
            return
        left = [len(destinations)]

        def one(address: str) -> None:
            try:
                self._push_one(exported, address)
            finally:
                with self._lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    remove_pieces(exported)

        for address in destinations:
            self._pool.submit(one, address)

    def _push_one(self, exported: pb.Exported, address: str) -> None:
        what = f"{value_name(exported.value)} of call {exported.call_id}"
        for attempt in range(1, self.attempts + 1):
            try:
                self.stub(address).Put(self._chunks(exported), timeout=self.timeout_s)
                return
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
                details = err.details() if isinstance(err, grpc.Call) else str(err)
                if code not in _RETRYABLE or attempt == self.attempts:
                    message = (
                        f"pushing {what} from {self.sender} to {address} failed after "
                        f"{attempt} attempt(s): {code.name}: {details}"
                    )
                    log.error("%s", message)
                    with self._lock:
                        self.failures.append(message)
                    self._tell_lost(exported, address, message)
                    return
                log.warning("pushing %s to %s: %s (attempt %d), retrying", what, address, code.name, attempt)
                time.sleep(self.backoff_s * 2 ** (attempt - 1))

    def _tell_lost(self, exported: pb.Exported, address: str, message: str) -> None:
        try:
            chunk = error_chunk(exported.call_id, exported.value, exported.spec, self.sender, message)
            self.stub(address).Put(iter([chunk]), timeout=5.0)
        except grpc.RpcError:
            pass

    def _chunks(self, exported: pb.Exported) -> Iterator[pb.BufferChunk]:
        return exported_chunks(exported, self.sender, self.chunk_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
