"""The client's data connections to the hosts' sidecars: its inputs and fetches go over raw TCP.

A program's inputs from numpy are the bytes every step sends (a training batch).
Over gRPC `Put` each 1 MiB chunk becomes a protobuf, copied on both sides; over a
host's data channel (`pathways_wire.data_frames`) the bytes go from the array to
the socket, and the sidecar reads them straight into the value's shared-memory
file. A fetch comes back the same way, read from the socket straight into the
numpy array it makes. A host's sidecar advertises its channel in its `Health` answer, asked once
per host address; idle connections are kept per address, each opened with the
slice's token of the moment, and one that its host closed is not reused. A host
with no data channel, or one that cannot be reached there, gets gRPC `Put` and `Fetch`, as does
every host where ``PATHWAYS_CLIENT_DATA_CHANNEL=off`` (a network that admits only
the hosts' gRPC port), and a put or fetch whose connection the host closed unanswered, or
turned away as one too many (`data_frames.BUSY`), goes over gRPC instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import grpc

from pathways.host_channels import HostChannels
from pathways_wire import pathways_pb2 as pb
from pathways_wire.data_frames import BUSY, DataChannelError, DataConnection
from pathways_wire.transfer import FetchTarget, Receive
from pathways_wire.env_flags import switch_on

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 10.0
IDLE_PER_HOST = 4
"""Idle connections kept per host: one per put in flight to it, up to this many."""

Piece = tuple[pb.BufferHeader, memoryview]
SWITCH = "PATHWAYS_CLIENT_DATA_CHANNEL"


def data_channel_wanted(env: Mapping[str, str]) -> bool:
    """Whether `env` lets the client use the hosts' data channels (default: on)."""
    return switch_on(env, SWITCH)


def _unless_busy(err: DataChannelError, address: str, whose: str, doing: str) -> None:
    """Raises `err` unless the channel turned the connection away as one too many
    (`BUSY`), which it logs: the exchange then goes over gRPC."""
    if err.code != BUSY:
        raise err
    log.info("the data channel of host %s turned %s connection away (%s); %s over gRPC", address, whose, err, doing)


class HostData:
    """Data connections to the hosts' sidecars, opened on first use and reused."""

    def __init__(self, channels: HostChannels, sender: str, timeout_s: float, enabled: bool = True) -> None:
        self._channels, self._sender, self._timeout_s = channels, sender, timeout_s
        self._enabled = enabled
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        """Host address -> its data channel's address ("" where it has none)."""
        self._idle: dict[str, list[tuple[str, DataConnection]]] = {}
        """Host address -> (token presented, connection) not in use."""
        self._busy: set[DataConnection] = set()
        self._closed = False

    def put(self, address: str, values: Sequence[Piece]) -> bool:
        """Sends each value (one piece each) to the host at `address` and waits for its
        answers; False where the host has no data channel, or where its channel closed
        the connection without an answer: the caller then puts over gRPC. A data channel
        closes a connection unanswered when it already holds as many awaiting their hello
        as it may (`port_connections.MAX_PENDING_HELLOS`: a flood of connections that
        never say one), or when it closed an idle one just as it was taken. What it
        received of the values before the end needs no undoing: a host takes a piece it
        already has once. Likewise where the channel turned the connection away as one too
        many (`BUSY`: it serves as many clients' connections as it may). Raises
        `DataChannelError` for a value the host refused (its code and why) and `OSError`
        for a put that timed out."""
        try:
            with self._connection(address) as conn:
                if conn is None:
                    return False
                conn.put([[value] for value in values])
                return True
        except ConnectionError as err:
            log.info("the data channel of host %s closed the connection of a put (%s); putting over gRPC",
                     address, err)
            return False
        except DataChannelError as err:
            _unless_busy(err, address, "a put's", "putting")
            return False

    def receive(self, address: str, fallback: Receive) -> Receive:
        """How a fetch gets the pieces of the host at `address`: over its data channel,
        read straight into the value, or by `fallback` (gRPC) where it has none."""

        def receive(request: pb.FetchRequest, target: FetchTarget, host: str) -> None:
            try:
                with self._connection(address) as conn:
                    if conn is not None:
                        conn.fetch(request, target, host)
                        return
            except DataChannelError as err:
                _unless_busy(err, address, "a fetch's", "fetching")
            fallback(request, target, host)

        return receive

    @contextmanager
    def _connection(self, address: str) -> Iterator[DataConnection | None]:
        """A connection to the host's data channel for one exchange (None where it has
        none), kept for the next one unless the exchange failed."""
        taken = self._take(address)
        if taken is None:
            yield None
            return
        token, conn = taken
        try:
            yield conn
        except BaseException:
            self._end(conn)
            raise
        self._give_back(address, token, conn)

    def _take(self, address: str) -> tuple[str, DataConnection] | None:
        data_address = self._data_address(address)
        if not data_address:
            return None
        token = self._channels.token(address)
        while True:
            with self._lock:
                if self._closed:
                    return None
                idle = self._idle.get(address)
                found = idle.pop() if idle else None
            if found is None:
                break
            if found[0] == token and found[1].is_open():
                with self._lock:
                    self._busy.add(found[1])
                return found
            found[1].close()
        try:
            conn = DataConnection(data_address, self._sender, token, self._timeout_s)
        except OSError:
            with self._lock:
                self._addresses.pop(address, None)  # asked again next time: the host may have moved
            return None
        with self._lock:
            self._busy.add(conn)
        return token, conn

    def _data_address(self, address: str) -> str:
        if not self._enabled:
            return ""
        with self._lock:
            known = self._addresses.get(address)
        if known is not None:
            return known
        try:
            health = self._channels.stub(address).Health(pb.HealthRequest(), timeout=HEALTH_TIMEOUT_S)
        except grpc.RpcError:
            return ""  # not remembered: gRPC Put says what is wrong, and the next put asks again
        if not health.detailed:
            return ""  # the host did not take this client's token: likewise
        with self._lock:
            self._addresses[address] = health.data_address
        return str(health.data_address)

    def _give_back(self, address: str, token: str, conn: DataConnection) -> None:
        with self._lock:
            self._busy.discard(conn)
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < IDLE_PER_HOST:
                idle.append((token, conn))
                return
        conn.close()

    def _end(self, conn: DataConnection) -> None:
        with self._lock:
            self._busy.discard(conn)
        conn.close()

    def forget(self, addresses: Sequence[str]) -> None:
        """Closes the idle connections to these hosts (a slice released: they go away),
        and asks for their data addresses anew if they are used again."""
        with self._lock:
            idle = [conn for a in addresses for _, conn in self._idle.pop(a, [])]
            for a in addresses:
                self._addresses.pop(a, None)
        for conn in idle:
            conn.close()

    def abort(self) -> None:
        """Ends every connection, those in use included: whoever sends or waits on one
        gets an error at once. Later puts open new ones."""
        with self._lock:
            idle = [conn for conns in self._idle.values() for _, conn in conns]
            busy = list(self._busy)
            self._idle.clear()
        for conn in busy:
            conn.abort()
        for conn in idle:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.abort()
