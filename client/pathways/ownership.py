"""The objects one client owns on its hosts, and how long they live.

A call's outputs that still have `pw.Array` handles when it ends stay on the hosts
as objects this client owns (the controller keeps those that had handles when the call
started, and those whose handles went meanwhile are dropped as it ends). Dropping a
handle's last reference queues its object. The client's next call carries the queued
drops in its `Run` (a training loop's previous parameters go with the next step, at no
RPC of their own); what no call takes within `DROP_LINGER_S` a drop thread frees in
batches (`DropObjects`). A lease thread
renews the client's lease (`KeepAlive`) every third of the controller's lease, so
a client that dies loses its objects within the lease. Closing frees what is left.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import grpc

from pathways.array import CallFuture
from pathways_wire import ir
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc


DROP_LINGER_S = 0.05
"""How long queued drops wait for a call to carry them before a `DropObjects` of their own."""


class Ownership:
    """The calls whose objects some handle still holds, their drops and their lease.

    It shares the runtime's lock: a call's end decides what it keeps under the same
    lock that counts its handles gone.
    """

    def __init__(
        self,
        controller: pb_grpc.ControllerStub,
        client_id: str,
        lock: threading.Lock,
        rpc_timeout: Callable[[float], float],
    ) -> None:
        self._controller = controller
        self._client_id = client_id
        self._lock = lock
        self._rpc_timeout = rpc_timeout
        self._kept: dict[str, CallFuture] = {}
        """Calls that left objects some handle still holds."""
        self._gone: queue.SimpleQueue[tuple[CallFuture, ir.ValueRef] | None] = queue.SimpleQueue()
        """Handles whose last reference went, for the next call or the drop thread."""
        self._pending: list[pb.ObjectRef] = []
        """Objects to drop that neither a call nor the drop thread has sent yet (under the lock)."""
        self._closing = threading.Event()
        """Ends the drop thread's linger: the client closes."""
        self._stop = threading.Event()
        self._lease_thread: threading.Thread | None = None
        self._drop_thread = threading.Thread(target=self._drop_loop, name="pw-drops", daemon=True)
        self._drop_thread.start()

    def keep(self, call: CallFuture) -> None:
        """An ended call left objects that handles hold (the caller holds the lock)."""
        self._kept[call.call_id] = call

    def drop_unheld(self, call: CallFuture) -> None:
        """The controller freed the call as it ended, keeping every output that had a
        handle when it started: those whose handles went while it ran are dropped now, as
        a handle that goes later is (the caller holds the lock)."""
        for ref in (call.kept or frozenset()) - call.live.keys():
            self._gone.put((call, ref))

    def handle_gone(self, call: CallFuture, ref: ir.ValueRef) -> None:
        """A handle's last reference went (a weakref callback: it only queues, which is
        safe wherever the garbage collector runs it)."""
        self._gone.put((call, ref))

    def take_drops(self) -> list[pb.ObjectRef]:
        """The objects to drop so far, for a call to carry (see `give_back` if it cannot)."""
        drops, closing = self._collect()
        if closing:
            self._gone.put(None)  # the drop thread's to see
        return drops

    def give_back(self, drops: list[pb.ObjectRef]) -> None:
        """Drops a call took but could not deliver: the next call or the drop thread sends them."""
        with self._lock:
            self._pending += drops

    def _collect(self) -> tuple[list[pb.ObjectRef], bool]:
        """The objects to drop so far (pending ones and those of the handles gone since),
        taken; and whether `close` was asked."""
        closing = False
        gone: list[tuple[CallFuture, ir.ValueRef]] = []
        while True:
            try:
                item = self._gone.get_nowait()
            except queue.Empty:
                break
            if item is None:
                closing = True
            else:
                gone.append(item)
        with self._lock:
            for item in gone:
                self._pending += self._forget(*item)
            drops, self._pending = self._pending, []
        return drops, closing

    def _drop_loop(self) -> None:
        """Frees the objects whose handles went and no call carried, in batches, until `close`."""
        while True:
            first = self._gone.get()
            self._gone.put(first)  # back, for whoever drains first
            if first is not None:
                self._closing.wait(DROP_LINGER_S)
            drops, closing = self._collect()
            if drops and not self._stop.is_set():  # abandoned: the controller goes with them
                try:
                    self._controller.DropObjects(
                        pb.DropObjectsRequest(client=self._client_id, objects=drops),
                        timeout=self._rpc_timeout(30),
                    )
                except (grpc.RpcError, ValueError):
                    pass  # unreachable, or the channel closed under us: the lease frees them
            if closing:
                return

    def _forget(self, call: CallFuture, ref: ir.ValueRef) -> list[pb.ObjectRef]:
        """Counts a handle gone (the caller holds the lock); the object to drop, if kept."""
        left = call.live.get(ref, 0) - 1
        if left > 0:
            call.live[ref] = left
            return []
        call.live.pop(ref, None)
        if call.kept is None or ref not in call.kept:
            return []  # the call still runs: its end does not keep it
        if not call.live:
            self._kept.pop(call.call_id, None)
        return [pb.ObjectRef(call_id=call.call_id, value=ref.to_proto())]

    def _drop_kept(self, timeout_s: float) -> None:
        """The client closes: every object a handle still holds goes."""
        with self._lock:
            drops = [
                pb.ObjectRef(call_id=call.call_id, value=ref.to_proto())
                for call in self._kept.values() for ref in call.live
            ]
            self._kept.clear()
        if drops:
            try:
                self._controller.DropObjects(
                    pb.DropObjectsRequest(client=self._client_id, objects=drops),
                    timeout=timeout_s,
                )
            except grpc.RpcError:
                pass

    def ensure_lease(self) -> None:
        with self._lock:
            if self._lease_thread is not None:
                return
            self._lease_thread = threading.Thread(target=self._keep_alive, name="pw-lease", daemon=True)
        self._lease_thread.start()

    def _keep_alive(self) -> None:
        """Renews this client's lease on its calls and objects every third of the lease."""
        period = 1.0
        while True:
            try:
                reply = self._controller.KeepAlive(pb.KeepAliveRequest(client=self._client_id), timeout=10)
                period = max(0.1, reply.lease_s / 3)
            except (grpc.RpcError, ValueError):  # ValueError: the channel closed as we stop
                pass
            if self._stop.wait(period):
                return

    def abandon(self) -> None:
        """Stops the drops and the lease without freeing anything: the controller that
        holds the objects is being stopped, and takes them with it."""
        self._stop.set()
        self._closing.set()
        self._gone.put(None)

    def close(self, timeout_s: float) -> None:
        """Drains the drops, frees every object left and stops the lease; each call waits
        at most `timeout_s`."""
        self._closing.set()
        self._gone.put(None)
        self._drop_thread.join(timeout=timeout_s)
        self._drop_kept(timeout_s)
        self._stop.set()
