"""The client's channels to the hosts' dataflow sidecars, and the tokens they present.

A host lets in only callers with its slice's token, and the controller is the one
that says which: with each slice it places (`SliceInfo.token`) and each call it starts
(`RunReply.host_tokens`). Each host address gets one channel, opened on first use;
it presents the token last learned for that address, looked up per call, so a gang
relaunched with another token is reached without reopening anything.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import grpc

from pathways.credentials import PresentToken, slice_token
from pathways_wire import pathways_pb2_grpc as pb_grpc
from pathways_wire.errors import RuntimeUnavailableError

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


class HostChannels:
    """One channel per host address, each presenting its slice's token.

    It shares the runtime's lock: the runtime learns a slice's tokens under the same
    lock that records the slice.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._stubs: dict[str, pb_grpc.DataflowStub] = {}
        self._channels: list[grpc.Channel] = []
        self._tokens: dict[str, str] = {}
        """Host address -> its slice's token, as the controller last said."""
        self._closed = False

    def learn(self, tokens: Iterable[tuple[str, str]]) -> None:
        """Hosts' tokens the controller gave (the caller holds the lock)."""
        self._tokens.update(tokens)

    def forget_tokens(self) -> None:
        """Another controller took over: its hosts' tokens are learned anew (the caller holds the lock)."""
        self._tokens.clear()

    def token(self, address: str) -> str:
        """The token to present to the host at `address` (its slice's, as last learned)."""
        return self._tokens.get(address, "")

    def stub(self, address: str) -> pb_grpc.DataflowStub:
        """The host's stub; after `close`, a RuntimeUnavailableError (never a closed channel)."""
        with self._lock:
            if self._closed:
                raise RuntimeUnavailableError(f"host {address}: this client's channels to the hosts are closed")
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
                self._channels.append(channel)
                stub = pb_grpc.DataflowStub(
                    grpc.intercept_channel(channel, PresentToken(lambda: slice_token(self._tokens, address)))
                )
                self._stubs[address] = stub
            return stub

    def abort(self) -> None:
        """Cancel every call in flight to the hosts; channels reopen on next use."""
        with self._lock:
            channels, self._channels = self._channels, []
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def close(self) -> None:
        """`abort`, and no channel opens again (`stub` refuses)."""
        with self._lock:
            self._closed = True
        self.abort()
