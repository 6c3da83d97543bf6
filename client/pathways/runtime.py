"""The client side of a running Pathways system.

A `Runtime` holds one gRPC channel to the controller (the resource manager and
island scheduler) and channels to the hosts' dataflow sidecars. One program
call is:

1. bind the program's virtual slices to physical ones (`CreateSlice`, once);
2. load the program (`LoadProgram`, once per program and binding);
3. `Run`: the controller numbers the computations and streams each host its
   plan and grants, in parallel — from here on hosts run without waiting for
   the controller or the client;
4. put the inputs straight into the sidecars that consume them (each host of a
   multi-host slice only the block of an input its devices read), wait for the
   call to end, fetch the outputs straight from the hosts holding them, and
   tell the controller to free the call's buffers.

A call is asynchronous: `run` returns `pw.Array` handles (`array`) once the
controller accepted the call and the inputs are sent; a waiter thread learns
how it ended, and the controller frees it as it ends (`WaitCall` with `finish`),
keeping the outputs that still have handles as objects on the hosts. A handle
passed to a later call names its object (`RunRequest.objects`): bound in place
on the slice that holds it, sent host to host to any other slice that reads it;
no bytes through the client.
Dropping a handle's last reference frees its object (`DropObjects`, in
batches); a client keeps its objects alive with `KeepAlive` every third of
the controller's lease, so a client that dies loses them within the lease.
At most `MAX_OUTSTANDING_CALLS` calls run at once; past it `run` waits.

Small values need none of step 4's round trips: inputs of at most
`INLINE_BYTES` ride in the `Run` request (the controller hands them to the
hosts with the launch), and when every input and output is that small, `Run`
answers only once the call ended — with its status, its outputs inline and
the call already freed but for the outputs with handles, which stay objects. A
small call is one round trip, and asynchronous as any other: it returns once the
request is written, and its handles are futures of that answer. A later call
sends a small handle's bytes once its answer came, and names its object before.

Hosts refuse callers without their slice's token. The controller is the
authority: it gives its clients each slice's token (`SliceInfo.token`) and
each call's hosts' tokens (`RunReply.host_tokens`), and every channel to a
host presents the token last learned for that address.

`connect()` with no address starts the embedded local cluster: the controller
as a separate process (`python -m pathways_operator.local`), which starts
hosts as processes when slices are placed — the same processes that run in
the pods of a Kubernetes cluster.

`Runtime.traffic` counts the value bytes that pass through this client (sent
as inputs, inline or put, and received as outputs, inline or fetched): the
figure a program that keeps its values on the hosts drives down to its batch.

Every call to the controller or a host has a deadline, and an interrupted call
(Ctrl-C, KeyboardInterrupt) cancels the transfers it started in other threads,
so the process never waits at exit for a call nobody wants any more; shutting
down gives each remaining bookkeeping call `EXIT_RPC_TIMEOUT_S`.

The module runs to about 700 lines because it is the one place the client speaks the
protocol: every call's RPCs, their deadlines and the translation of their errors read
here. What it presents to the controller and the hosts lives in `credentials`, its channels
to the hosts in `host_channels`, and the objects it owns (their drops and their lease)
in `ownership`.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from pathways_wire import host_blocks, host_port, ir, transfer
from pathways_wire.data_frames import DataChannelError
from pathways_wire.host_blocks import Block
from pathways_wire.env_flags import env_number
from pathways import interruptible
from pathways.array import Array, CallFuture
from pathways.calls_link import CallsLink, credentials_of
from pathways.credentials import PresentToken, client_credentials
from pathways.embedded import LocalCluster, start_local_cluster
from pathways.functions import mesh_axes_of
from pathways.host_channels import GRPC_OPTIONS, HostChannels
from pathways.host_data import HostData, data_channel_wanted
from pathways.ownership import Ownership
from pathways_wire.errors import (
    ExecutionError,
    PathwaysError,
    PlacementError,
    RuntimeUnavailableError,
)
from pathways_wire import pathways_pb2 as pb
from pathways_wire import pathways_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = env_number(os.environ, "PATHWAYS_CALL_TIMEOUT_S", 600.0, positive=True)
SLICE_TIMEOUT_S = env_number(os.environ, "PATHWAYS_SLICE_TIMEOUT_S", 180.0, positive=True)
INLINE_BYTES = env_number(os.environ, "PATHWAYS_INLINE_BYTES", 64 << 10, minimum=0)
"""Inputs and outputs up to this size travel in the call's own messages."""
MAX_OUTSTANDING_CALLS = env_number(os.environ, "PATHWAYS_MAX_OUTSTANDING_CALLS", 32, minimum=1)
"""Calls of one client running at once, at most: past it `run` waits for one to end."""
RECONNECT_S = env_number(os.environ, "PATHWAYS_RECONNECT_S", 0.0, minimum=0.0)
"""How long a call waits for a controller that went away to come back (0: it fails at once).

Driver pods set it: their operator may restart under them. A controller that comes back
as another process (``ClusterInfo.controller_id``) knows none of this client's slices or
programs; they are placed and loaded again and the call runs again, once."""
EXIT_RPC_TIMEOUT_S = 5.0
"""Deadline of the calls that free buffers and slices while the client shuts down."""


BlocksKey = tuple[str, int, tuple[int, ...], tuple[tuple[str, tuple[str, ...]], ...]]


@dataclass(frozen=True)
class ClientTraffic:
    """Value bytes that passed through one client since it connected."""

    sent: int = 0
    """Input bytes the client sent: inline in `Run`, or put to each consuming host."""
    received: int = 0
    """Output bytes the client received: inline in the reply, or fetched from hosts."""

    @property
    def total(self) -> int:
        return self.sent + self.received

    def __sub__(self, other: ClientTraffic) -> ClientTraffic:
        return ClientTraffic(self.sent - other.sent, self.received - other.received)

    def __add__(self, other: ClientTraffic) -> ClientTraffic:
        return ClientTraffic(self.sent + other.sent, self.received + other.received)


class Runtime:
    """A connection to one controller and the hosts it places slices on."""

    def __init__(self, address: str, cluster: LocalCluster | None = None) -> None:
        self.address = address
        self.cluster = cluster
        self.client_id = f"client-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        credentials = client_credentials(cluster)
        self.controller = pb_grpc.ControllerStub(
            grpc.intercept_channel(self._channel, PresentToken(lambda: credentials))
        )
        self._credentials = credentials
        self._calls_link: CallsLink | pb_grpc.ControllerStub | None = None
        """Where `Run`, `WaitCall` and `FinishCall` go (`_per_call`); None until the first."""
        self._slices: dict[str, pb.SliceInfo] = {}
        self._programs: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._lock = threading.Lock()
        self._hosts = HostChannels(self._lock)
        self._data = HostData(self._hosts, self.client_id, CALL_TIMEOUT_S, data_channel_wanted(os.environ))
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="pw-io")
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pw-finish")
        self._fingerprints: dict[int, tuple[ir.Program, str]] = {}
        self._closing = False
        self._closed = False
        """Closed (`close`): its channels are gone, and nothing may use them (`_check_open`)."""
        self._controller_id = ""
        """The controller process this client placed its slices with ("" until the first)."""
        self.calls = 0
        self._bindings: dict[str, dict[str, str]] = {}
        """Program id -> its virtual slice ids' physical slice ids."""
        self._outstanding = threading.BoundedSemaphore(MAX_OUTSTANDING_CALLS)
        self._ownership = Ownership(self.controller, self.client_id, self._lock, self._rpc_timeout)
        self._sent = 0
        self._received = 0
        self._blocks: dict[BlocksKey, dict[str, Block]] = {}
        """(program id, input, shape, its readers' hosts) -> the hosts that need only a block."""

    @property
    def traffic(self) -> ClientTraffic:
        """The value bytes this client has sent and received so far."""
        with self._lock:
            return ClientTraffic(self._sent, self._received)

    def _count(self, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self._sent += sent
            self._received += received

    # ------------------------------------------------------------ slices

    def bind(self, decl: ir.SliceDecl) -> pb.SliceInfo:
        """The physical slice for a virtual one (placed on first use)."""
        with self._lock:
            info = self._slices.get(decl.id)
        if info is not None and _answers(info, decl):
            return info
        try:  # a first ask, or one the slice bound under this name may not answer: the controller says
            info = self.controller.CreateSlice(
                pb.CreateSliceRequest(
                    spec=decl.to_proto(),
                    client=self.client_id,
                    timeout_s=SLICE_TIMEOUT_S,
                    namespace=os.environ.get("PATHWAYS_NAMESPACE", ""),
                ),
                timeout=SLICE_TIMEOUT_S + 10,
            )
        except grpc.RpcError as err:
            raise _translate(err, f"placing slice '{decl.name}' ({decl.devices} devices)") from None
        if RECONNECT_S > 0 and not self._controller_id:
            self._controller_id = self.describe().controller_id
        with self._lock:
            self._slices[decl.id] = info
            if info.token:
                self._hosts.learn((h.address, info.token) for h in info.hosts)
        return info

    def describe(self) -> pb.ClusterInfo:
        try:
            return self.controller.Describe(pb.ClusterInfoRequest(), timeout=30)
        except grpc.RpcError as err:
            raise _translate(err, "describing the cluster") from None

    # ------------------------------------------------------------ programs

    def _fingerprint(self, program: ir.Program) -> str:
        """A program's fingerprint hashes every artifact: computed once per program object."""
        hit = self._fingerprints.get(id(program))
        if hit is not None and hit[0] is program:
            return hit[1]
        fingerprint = program.fingerprint
        self._fingerprints[id(program)] = (program, fingerprint)
        return fingerprint

    def load(self, program: ir.Program) -> str:
        bindings = {d.id: self.bind(d).slice_id for d in program.slices}
        key = (self._fingerprint(program), tuple(sorted(bindings.items())))
        with self._lock:
            hit = self._programs.get(key)
        if hit is not None:
            return hit
        try:
            reply = self.controller.LoadProgram(
                pb.LoadProgramRequest(program=program.to_proto(), bindings=bindings), timeout=120
            )
        except grpc.RpcError as err:
            raise _translate(err, f"loading program '{program.name}'") from None
        with self._lock:
            self._programs[key] = reply.program_id
            self._bindings[reply.program_id] = bindings
        return reply.program_id

    def run(
        self, program: ir.Program, inputs: Sequence[np.ndarray | Array], weight: float = 1.0
    ) -> list[Array]:
        """Start one call of `program`; returns a handle per flat output at once.

        A call whose start loses its controller runs again, once, on the controller that replaces
        it within ``PATHWAYS_RECONNECT_S`` (:data:`RECONNECT_S`); its inputs are the client's.
        """
        self._check_open(f"calling program '{program.name}'")
        try:
            return self._run(program, inputs, weight)
        except RuntimeUnavailableError:
            if self._closed or not self._controller_replaced():
                raise
        except PathwaysError:
            # A controller that restarted between two calls answers the next one, refusing a
            # program it never loaded: the client learns of the restart here, not from an outage.
            if not self._controller_replaced(wait_s=10.0):
                raise
        return self._run(program, inputs, weight)

    def _controller_replaced(self, wait_s: float = RECONNECT_S) -> bool:
        """Wait (up to `wait_s`) for the controller; True when another process now serves it.

        Then this client's slices and programs are forgotten, to be placed and loaded again.
        """
        if RECONNECT_S <= 0 or not self._controller_id:
            return False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                found = self.controller.Describe(pb.ClusterInfoRequest(), timeout=10).controller_id
            except grpc.RpcError:
                time.sleep(0.5)
                continue
            if found == self._controller_id:
                return False
            with self._lock:
                self._slices.clear()
                self._programs.clear()
                self._hosts.forget_tokens()
                self._controller_id = found
                link, self._calls_link = self._calls_link, None
            if isinstance(link, CallsLink):
                link.close()  # the new controller has a calls port of its own
            return True
        return False

    def _run(
        self, program: ir.Program, inputs: Sequence[np.ndarray | Array], weight: float, rerun: bool = True
    ) -> list[Array]:
        """`run`'s call; `rerun`: a small call that loses its controller runs again (`_rerun_small`)."""
        program_id = self.load(program)
        call_id = f"{program.name}-{uuid.uuid4().hex[:12]}"
        request = pb.RunRequest(
            program_id=program_id, call_id=call_id, weight=weight, client=self.client_id
        )
        arrays: dict[int, np.ndarray] = {}
        for i, given in enumerate(inputs):
            if isinstance(given, Array) and self._is_object(given) and not self._named_in_order(given):
                assert given.call is not None
                given.call.wait_ended()  # then its value goes as any carried value goes
            if isinstance(given, Array) and self._is_object(given):
                assert given.call is not None and given.ref is not None
                request.objects.add(
                    index=i,
                    object=pb.ObjectRef(call_id=given.call.call_id, value=given.ref.to_proto()),
                )
                continue
            array = arrays[i] = np.asarray(given)
            if array.nbytes <= INLINE_BYTES:
                request.inputs.add(
                    value=pb.ValueRef(node=ir.PROGRAM_INPUT, index=i),
                    spec=transfer.spec_of(array),
                    data=transfer.wire_bytes(array),
                )
                self._count(sent=array.nbytes)
        small_outputs = all(
            ref.is_program_input or program.spec_of(ref).nbytes <= INLINE_BYTES
            for ref in program.outputs
        )
        drops = self._ownership.take_drops()
        request.drop.extend(drops)
        if small_outputs and not request.objects and len(request.inputs) == len(arrays):
            return self._run_small(program, request, inputs, drops, rerun)
        try:
            interruptible.acquire(self._outstanding)
        except BaseException:
            self._ownership.give_back(drops)
            raise
        try:
            reply = self._per_call().Run(request, timeout=60)
        except grpc.RpcError as err:
            self._outstanding.release()
            self._ownership.give_back(drops)
            if hasattr(err, "code") and err.code() == grpc.StatusCode.NOT_FOUND:
                failed = failed_source(program.name, call_id, inputs, request.objects)
                if failed is not None:
                    raise failed from None
            raise _translate(err, f"starting program '{program.name}'") from None
        self._learn_tokens(reply)
        self.calls += 1
        call = CallFuture(program.name, call_id)
        try:
            self._put_inputs(program, program_id, reply, call_id, arrays)
        except BaseException:
            call.end(f"program '{program.name}' call {call_id}: its inputs could not be sent")
            self._finisher.submit(self._finish, call_id, ())
            self._outstanding.release()
            raise
        outputs = self._handles(program, call, inputs, reply, program_id)
        self._ownership.ensure_lease()
        self._await_call(call)
        return outputs

    @property
    def calls_port(self) -> CallsLink | None:
        """The link to the controller's calls port that `Run`, `WaitCall` and `FinishCall`
        take; None when the controller has none and they go over gRPC."""
        chosen = self._per_call()
        return chosen if isinstance(chosen, CallsLink) else None

    def _per_call(self) -> CallsLink | pb_grpc.ControllerStub:
        """Where `Run`, `WaitCall` and `FinishCall` go: the controller's calls port when it
        names one (`calls_link`), else its gRPC service. Learned once per controller."""
        chosen = self._calls_link
        if chosen is not None:
            return chosen
        try:
            port = self.controller.Describe(pb.ClusterInfoRequest(), timeout=30).calls_port
        except grpc.RpcError:
            return self.controller  # its own call reports the outage; asked again next time
        chosen = self.controller
        if port:
            token, program = credentials_of(self._credentials)
            link = CallsLink(host_port.split(self.address)[0], port, token, program, fallback=self.controller)
            try:
                link.connect()
                chosen = link
            except (OSError, ValueError) as err:  # a port this client cannot reach (a Service, NAT)
                log.warning("the controller's calls port %s cannot be used (%s); calls go over gRPC",
                            link.address, err)
                link.close()
        with self._lock:
            if self._calls_link is None:
                self._calls_link = chosen
                return chosen
            found = self._calls_link
        if isinstance(chosen, CallsLink):
            chosen.close()  # another thread chose first
        return found

    def _is_object(self, given: Array) -> bool:
        """Whether the input can name the object itself: the controller binds it in place
        where its own slice reads it and has its hosts send it to any other slice that does.
        Otherwise (a carried value, or another runtime's handle) its bytes go through the client."""
        return (
            given.on_hosts and getattr(given._fetch, "__self__", None) is self
            and not (given.with_answer and given.is_ready())
        )

    def _named_in_order(self, given: Array) -> bool:
        """Whether a `Run` sent now that names `given`'s object reaches the controller after
        the `Run` of the call that makes it, which enters the object.

        A call's handles exist once its `Run` was answered, but a small call's `Run` is
        answered only as the call ends (`_run_small`), and its handles are given out at
        once. Only where its `Run` went on the calls port's connection that this `Run` will
        take does the controller take the two in order (`CallsLink.carries_after`); over
        gRPC each is served on a thread of its own, and the later one may come first and
        find no such object. There the later call waits for the small call's answer,
        and sends the value it carries."""
        if given.call is None or not given.with_answer:
            return True
        link = self._calls_link
        return isinstance(link, CallsLink) and link.carries_after(given.call.sent_on)

    def _put_inputs(
        self,
        program: ir.Program,
        program_id: str,
        reply: pb.RunReply,
        call_id: str,
        arrays: dict[int, np.ndarray],
    ) -> None:
        """Each host's inputs go in one Put stream: one stream per host, not per input.
        Each host of a multi-host slice gets only the block of an input its devices read.
        The streams run side by side on the client's I/O threads, but for the last host,
        whose stream this thread sends itself while the others run: a call to a 1-host
        slice hands its batch to no other thread, and waits for none."""
        per_host: dict[str, list[tuple[ir.ValueRef, np.ndarray, Block | None]]] = {}
        for i, array in arrays.items():
            if array.nbytes > INLINE_BYTES:
                destination = reply.inputs[i]
                blocks = (
                    self._host_blocks(program, program_id, i, destination, array.shape)
                    if len(destination.hosts) > 1 else {}
                )
                for host in destination.hosts:
                    per_host.setdefault(host, []).append(
                        (ir.ValueRef(ir.PROGRAM_INPUT, i), array, blocks.get(host))
                    )
        if not per_host:
            return
        *others, (last, last_values) = per_host.items()
        in_flight: list[Future[Any]] = []
        try:
            in_flight += [self._pool.submit(self._put, host, call_id, values) for host, values in others]
            self._put(last, call_id, last_values)
            for fut in in_flight:
                interruptible.result(fut)
        except BaseException as err:
            if not isinstance(err, Exception):  # interrupted: nobody waits for the transfers
                for fut in in_flight:
                    fut.cancel()
                self._hosts.abort()
                self._data.abort()
            raise

    def _host_blocks(
        self,
        program: ir.Program,
        program_id: str,
        index: int,
        destination: pb.InputDestination,
        shape: tuple[int, ...],
    ) -> dict[str, Block]:
        """The hosts of input `index` that need only a block of it, and that block (see
        `host_blocks`); computed once per program, input and gangs."""
        layout = tuple((r.slice, tuple(r.hosts)) for r in destination.readers)
        key: BlocksKey = (program_id, index, shape, layout)
        found = self._blocks.get(key)
        if found is not None:
            return found
        readings = [
            host_blocks.Reading(hosts, _input_axes(c, position), c.mesh_shape, c.mesh_axes)
            for vslice, hosts in layout
            for c in program.computations if c.slice == vslice
            for position, ref in enumerate(c.inputs)
            if ref.is_program_input and ref.index == index
        ]
        needs = host_blocks.host_needs(shape, readings)
        found = {a: b for a, b in needs.items() if not b.is_whole(shape)}
        with self._lock:
            self._blocks[key] = found
        return found

    def _handles(
        self,
        program: ir.Program,
        call: CallFuture,
        inputs: Sequence[np.ndarray | Array],
        reply: pb.RunReply | None = None,
        program_id: str = "",
    ) -> list[Array]:
        """One handle per output, the same handle for an output listed twice: of the object
        on the hosts `reply` names or, with no reply (a small call, `_run_small`), of the
        object its call leaves and a future of the answer that brings the value back. Either
        says the slice and the declared sharding of the computation that makes it."""
        bindings = self._bindings.get(program_id, {})
        names = {d.id: d.name for d in program.slices}
        made: dict[ir.ValueRef, Array] = {}
        outputs: list[Array] = []
        for j, ref in enumerate(program.outputs):
            if ref.is_program_input:
                given = inputs[ref.index]
                outputs.append(given if isinstance(given, Array) else Array.passed_through(np.asarray(given)))
                continue
            handle = made.get(ref)
            if handle is None:
                comp = program.computations[ref.node]
                sharding = functools.partial(_output_sharding, comp, ref.index)
                slice_name = names.get(comp.slice, comp.slice)
                handle = Array(
                    program.spec_of(ref), call=call, ref=ref, slice_name=slice_name, sharding=sharding,
                    slice_id=bindings.get(comp.slice, ""), fetch=self._fetch_object, with_answer=reply is None,
                )
                if reply is not None:
                    handle.hosts, handle.generation = tuple(reply.outputs[j].hosts), reply.outputs[j].generation
                call.live[ref] = 1
                handle.on_delete = weakref.finalize(handle, self._ownership.handle_gone, call, ref)
                made[ref] = handle
            outputs.append(handle)
        return outputs

    def _await_call(self, call: CallFuture) -> None:
        """The waiter: learns how the call ended, then frees it but the outputs with handles.

        The controller frees the call as it ends (`WaitCall` with `finish`), keeping every
        output that had a handle when the call started; those whose handles went meanwhile
        are dropped here, as a handle that goes later is. Only a wait that failed or timed
        out leaves the freeing to a `FinishCall`. The wait is an asynchronous RPC whose
        answer `_call_ended` handles on gRPC's own thread: no thread per call, and nothing
        that keeps the process from exiting while a call it no longer needs runs."""
        with self._lock:
            keep = frozenset(call.live)
        request = pb.CallStatusRequest(
            call_id=call.call_id, timeout_s=CALL_TIMEOUT_S, finish=True,
            keep=[ref.to_proto() for ref in keep],
        )
        try:
            waiting = self._per_call().WaitCall.future(request, timeout=CALL_TIMEOUT_S + 30)
        except Exception as err:  # the channel closed under us
            self._call_ended(call, keep, None, str(err))
            return
        waiting.add_done_callback(lambda done: self._call_ended(call, keep, done))

    def _call_ended(
        self, call: CallFuture, keep: frozenset[ir.ValueRef],
        done: grpc.Future[pb.CallStatus] | Future[pb.CallStatus] | None, failure: str = ""
    ) -> None:
        released = False
        try:
            if done is None:
                raise ExecutionError(failure)
            status = self._wait_answer(done, call.call_id, call.program)
            released = status.released
            error = "" if status.state == pb.CallStatus.SUCCEEDED else (
                status.message or f"program '{call.program}' call {call.call_id} failed"
            )
        except Exception as err:
            error = str(err)
        finally:
            self._outstanding.release()
        self._settle_call(call, keep, released, error)

    def _check_open(self, doing: str) -> None:
        """Refuses what would use a closed runtime's channels (gRPC may crash the process on a
        closed channel, where it should raise)."""
        if self._closed:
            raise RuntimeUnavailableError(
                f"{doing}: this client's runtime was shut down (pw.shutdown() or Runtime.close()), "
                "and the values it held went with it; fetch what you need (numpy.asarray, pw.fetch) "
                "before shutting down"
            )

    def _fetch_object(self, handle: Array) -> np.ndarray:
        assert handle.call is not None and handle.ref is not None
        self._check_open(f"fetching {handle!r}")
        handle.call.wait()
        spec = ir.TensorSpec.of(handle.shape, handle.dtype)
        try:
            return self._fetch(list(handle.hosts), handle.call.call_id, handle.ref, spec, release=False)
        except PathwaysError:
            lost = self._lost(handle)
            if lost:
                raise ExecutionError(lost) from None
            raise

    def _lost(self, handle: Array) -> str:
        """Why a handle's value is gone with its gang, if it is ("" if not)."""
        try:
            slices = {s.slice_id: s for s in self.describe().slices}
        except PathwaysError:
            return ""
        now = slices.get(handle.slice_id)
        if now is None:
            why = "the slice was released"
        elif now.generation != handle.generation:
            why = f"its gang was relaunched (generation {handle.generation} -> {now.generation})"
        else:
            return ""
        return (
            f"{handle.label()} of program '{handle.call.program if handle.call else ''}' on slice "
            f"'{handle.slice}' was lost: {why} since it was made; compute it again"
        )

    def _run_small(
        self, program: ir.Program, request: pb.RunRequest, inputs: Sequence[np.ndarray | Array],
        drops: list[pb.ObjectRef], rerun: bool,
    ) -> list[Array]:
        """A call whose values are all small: one round trip (see the module docstring).

        `Run` with `wait` is answered once the call ended, with its outputs inline; the
        call returns as soon as the request is written, and its handles are futures of
        that answer, as any call's are of its end. The outputs with handles stay objects on
        the hosts when the call is freed (`RunRequest.keep`), so that a later call given a
        handle whose answer has not come names the object and goes out at once
        (`_is_object`)."""
        try:
            interruptible.acquire(self._outstanding)
        except BaseException:
            self._ownership.give_back(drops)
            raise
        request.wait, request.wait_s = True, CALL_TIMEOUT_S
        call = CallFuture(program.name, request.call_id)
        handles = self._handles(program, call, inputs, program_id=request.program_id)
        keep = frozenset(call.live)
        request.keep.extend(ref.to_proto() for ref in keep)
        try:
            answer = self._per_call().Run.future(request, timeout=CALL_TIMEOUT_S + 30)
            call.sent_on = getattr(answer, "connection", None)  # a `SentFuture` of the calls port's
        except BaseException as err:
            self._outstanding.release()
            self._ownership.give_back(drops)
            if isinstance(err, grpc.RpcError):
                raise _translate(err, f"running program '{program.name}'") from None
            raise
        self.calls += 1
        self._ownership.ensure_lease()
        again = functools.partial(self._rerun_small, program, request) if rerun else None
        answer.add_done_callback(
            lambda done: self._small_call_answered(program, call, handles, keep, drops, done, again)
        )
        return handles

    def _small_call_answered(
        self, program: ir.Program, call: CallFuture, handles: list[Array], keep: frozenset[ir.ValueRef],
        drops: list[pb.ObjectRef], done: grpc.Future[pb.RunReply] | Future[pb.RunReply],
        again: Callable[[CallFuture, list[Array], Exception], None] | None,
    ) -> None:
        """On the thread that took the answer: the outputs it carries go to their handles and
        the call ends. An output it does not carry (a small value of a multi-host slice, on
        its hosts) is fetched first, on a thread of the client's own, not the answer's; so is
        the call run `again` where its controller went."""
        try:
            reply: pb.RunReply = done.result()
        except Exception as err:  # the controller refused it or went, or the runtime closed under it
            self._small_call_failed(program, call, handles, drops, err, again)
            return
        self._learn_tokens(reply)
        inline = {(v.value.node, v.value.index): v for v in reply.values}
        if all((ref.node, ref.index) in inline for ref in program.outputs if not ref.is_program_input):
            self._end_small_call(program, call, handles, keep, drops, reply, inline)
            return
        try:
            self._pool.submit(self._end_small_call, program, call, handles, keep, drops, reply, inline)
        except RuntimeError as err:  # closing
            self._small_call_failed(program, call, handles, drops, err)

    def _unanswered(self, program: ir.Program, call: CallFuture) -> RuntimeUnavailableError | None:
        """What a small call's handles say where the runtime was shut down before its answer
        came (None while it runs): the answer was lost with the runtime's link."""
        if not self._closing:
            return None
        return RuntimeUnavailableError(
            f"program '{program.name}' call {call.call_id}: this client's runtime was shut down "
            "(pw.shutdown() or Runtime.close()) before the call's answer came, and its outputs went "
            "with it; fetch what you need (numpy.asarray, pw.fetch) before shutting down"
        )

    def _rerun_small(
        self, program: ir.Program, request: pb.RunRequest, call: CallFuture, handles: list[Array],
        failure: Exception,
    ) -> None:
        """A small call whose controller went, run again, once, on the one that replaces it,
        as `run` runs again a call whose start lost its controller: every input of a small
        call is in its request. Its handles take the values of the call run again; where none
        replaces the controller, they fail with what the call met. Its inputs are the bytes
        the request carried, not the caller's arrays, which it may have written since."""
        wait_s = RECONNECT_S if isinstance(failure, RuntimeUnavailableError) else 10.0
        try:
            if self._closed or not self._controller_replaced(wait_s):
                raise failure
            inputs = [transfer.from_wire(v.spec, v.data) for v in sorted(request.inputs, key=lambda v: v.value.index)]
            for handle, new in zip(handles, self._run(program, inputs, request.weight, rerun=False), strict=True):
                if not handle.is_ready():
                    handle.answered(new.value())
        except Exception as err:
            self._settle_call(call, frozenset(), released=True, failure=err)
            return
        self._settle_call(call, frozenset(), released=True)  # its objects went with the controller

    def _small_call_failed(
        self, program: ir.Program, call: CallFuture, handles: list[Array], drops: list[pb.ObjectRef],
        err: Exception, again: Callable[[CallFuture, list[Array], Exception], None] | None = None,
    ) -> None:
        """A small call whose answer did not come, `err` saying why: run `again` where the
        controller refused it or went (a gRPC error), unless the runtime is shutting down;
        otherwise its handles fail with why."""
        failure = self._unanswered(program, call) or (
            _translate(err, f"running program '{program.name}'") if isinstance(err, grpc.RpcError)
            else RuntimeUnavailableError(f"running program '{program.name}': {err}")
        )
        self._ownership.give_back(drops)  # dropping twice is harmless; never dropping is not
        self._outstanding.release()
        reruns = isinstance(err, grpc.RpcError) and isinstance(failure, PathwaysError) and not self._closing
        if again is not None and reruns:
            try:
                self._pool.submit(again, call, handles, failure)
                return
            except RuntimeError:  # closing
                pass
        self._settle_call(call, frozenset(), released=True, failure=failure)

    def _settle_call(
        self, call: CallFuture, keep: frozenset[ir.ValueRef], released: bool, error: str = "",
        failure: Exception | None = None,
    ) -> None:
        """A call's end: which of its outputs stay objects (those in `keep` where the controller
        freed it as it ended, `released`; none, if it failed), the objects of handles gone while
        it ran dropped, and the call freed where the controller has not freed it yet."""
        with self._lock:
            call.kept = frozenset() if error or failure else (keep if released else frozenset(call.live))
            if call.kept:
                self._ownership.keep(call)
            call.end(error, failure)
            if released:
                self._ownership.drop_unheld(call)
                return
        try:
            self._finisher.submit(self._finish, call.call_id, tuple(call.kept))
        except RuntimeError:
            pass  # closing: releasing the slices, or stopping the embedded cluster, frees the call

    def _end_small_call(
        self, program: ir.Program, call: CallFuture, handles: list[Array], keep: frozenset[ir.ValueRef],
        drops: list[pb.ObjectRef], reply: pb.RunReply, inline: dict[tuple[int, int], pb.InlineValue],
    ) -> None:
        """The answer's outputs (`inline`: those it carries, by node and index) into the call's
        handles, then its end (its error, if it failed)."""
        error = ""
        try:
            status = reply.status
            if status.state == pb.CallStatus.RUNNING:
                raise self._timed_out(call.call_id, program.name, status)
            if status.state != pb.CallStatus.SUCCEEDED:
                raise ExecutionError(status.message or f"program '{program.name}' failed")
            for j, ref in enumerate(program.outputs):
                handle = handles[j]
                if ref.is_program_input or handle.is_ready():
                    continue
                handle.hosts, handle.generation = tuple(reply.outputs[j].hosts), reply.outputs[j].generation
                value = inline.get((ref.node, ref.index))
                if value is not None:
                    self._count(received=len(value.data))
                    handle.answered(transfer.from_wire(value.spec, value.data))
                else:  # on a multi-host slice: fetched from its hosts, where it stays an object
                    handle.answered(self._fetch(
                        list(handle.hosts), call.call_id, ref, program.spec_of(ref), release=ref not in keep
                    ))
        except Exception as err:
            error = str(err)
            self._ownership.give_back(drops)
        finally:
            self._outstanding.release()
        self._settle_call(call, keep, reply.released, error)

    def _finish(self, call_id: str, keep: Sequence[ir.ValueRef]) -> None:
        try:
            self._per_call().FinishCall(
                pb.ReleaseCall(call_id=call_id, keep=[ref.to_proto() for ref in keep]),
                timeout=self._rpc_timeout(30),
            )
        except grpc.RpcError:
            pass

    def _wait_answer(
        self, done: grpc.Future[pb.CallStatus] | Future[pb.CallStatus], call_id: str, name: str
    ) -> pb.CallStatus:
        try:
            status: pb.CallStatus = done.result()
        except grpc.RpcError as err:
            raise _translate(err, f"waiting for program '{name}'") from None
        if status.state == pb.CallStatus.RUNNING:
            raise self._timed_out(call_id, name, status)
        return status

    @staticmethod
    def _timed_out(call_id: str, name: str, status: pb.CallStatus) -> ExecutionError:
        return ExecutionError(
            f"program '{name}' call {call_id} did not finish within {CALL_TIMEOUT_S:.0f} s "
            f"({status.message or f'{status.completed}/{status.total} computations done'}); "
            "a host named there may be hung or overloaded; raise PATHWAYS_CALL_TIMEOUT_S if it needs longer"
        )

    def _rpc_timeout(self, normal_s: float) -> float:
        return min(normal_s, EXIT_RPC_TIMEOUT_S) if self._closing else normal_s

    # ------------------------------------------------------------ hosts

    def host(self, address: str) -> pb_grpc.DataflowStub:
        return self._hosts.stub(address)

    def _learn_tokens(self, reply: pb.RunReply) -> None:
        if reply.host_tokens:
            with self._lock:
                self._hosts.learn(reply.host_tokens.items())

    def _put(
        self, address: str, call_id: str, values: Sequence[tuple[ir.ValueRef, np.ndarray, Block | None]]
    ) -> None:
        """`values` whole, or where a block is given only that block: over the host's
        data channel (`HostData`), or where it has none in one gRPC Put stream."""
        pieces = [
            transfer.whole_value_piece(call_id, ref.to_proto(), array)
            if block is None
            else transfer.block_piece(call_id, ref.to_proto(), array, block.start, block.stop)
            for ref, array, block in values
        ]
        doing = f"sending {', '.join(str(ref) for ref, _, _ in values)} to host {address}"
        try:
            if not self._data.put(address, pieces):
                chunks = (chunk for header, data in pieces for chunk in transfer.iter_chunks(header, data))
                self.host(address).Put(chunks, timeout=CALL_TIMEOUT_S)
        except (grpc.RpcError, DataChannelError, OSError) as err:
            raise _translate(err, doing) from None
        self._count(sent=sum(data.nbytes for _, data in pieces))

    def _fetch(
        self, hosts: list[str], call_id: str, ref: ir.ValueRef, spec: ir.TensorSpec, release: bool = True
    ) -> np.ndarray:
        """The value from the hosts that hold it: over their data channels, or gRPC `Fetch`."""
        doing = f"fetching {ref} {spec} from hosts {hosts}"
        sources = [self._data.receive(h, transfer.grpc_receive(self.host(h))) for h in hosts]
        try:
            value: np.ndarray = transfer.fetch_from(
                sources, hosts, call_id, ref.to_proto(), CALL_TIMEOUT_S, release=release
            )
        except (grpc.RpcError, DataChannelError, OSError) as err:
            raise _translate(err, doing) from None
        except transfer.TransferError as err:
            raise ExecutionError(f"{doing}: {err}") from None
        self._count(received=value.nbytes)
        return value

    # ------------------------------------------------------------ lifecycle

    def release(self, decl_id: str) -> None:
        """Give back the physical slice bound to virtual slice `decl_id`, if any."""
        with self._lock:
            info = self._slices.pop(decl_id, None)
            if info is None:
                return
            self._programs = {
                key: pid
                for key, pid in self._programs.items()
                if info.slice_id not in (physical for _, physical in key[1])
            }
        try:
            self.controller.ReleaseSlice(
                pb.ReleaseSliceRequest(slice_id=info.slice_id, client=self.client_id), timeout=30
            )
        except grpc.RpcError:
            pass
        self._data.forget([h.address for h in info.hosts])

    def release_slices(self) -> None:
        with self._lock:
            infos = list(self._slices.values())
            self._slices.clear()
            self._programs.clear()
        for info in infos:
            try:
                self.controller.ReleaseSlice(
                    pb.ReleaseSliceRequest(slice_id=info.slice_id, client=self.client_id),
                    timeout=self._rpc_timeout(30),
                )
            except grpc.RpcError:
                pass
            self._data.forget([h.address for h in info.hosts])

    def close(self) -> None:
        """Frees what this client holds. An embedded cluster this client started is stopped
        at once instead: that frees everything, with no call to its controller to wait for
        (an interrupted client exits in seconds even when a host or the machine is stuck)."""
        self._closing = True
        try:
            if self.cluster is None:
                self._finisher.shutdown(wait=True)
                self._ownership.close(EXIT_RPC_TIMEOUT_S)
                self.release_slices()
            else:
                self._finisher.shutdown(wait=False, cancel_futures=True)
                self._ownership.abandon()
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._data.close()
            self._hosts.close()
            if isinstance(self._calls_link, CallsLink):
                self._calls_link.close()
            self._channel.close()
            self._closed = True
            if self.cluster is not None:
                self.cluster.stop()


@functools.lru_cache(maxsize=256)
def _declared_shardings(
    computation: ir.Computation,
) -> tuple[tuple[PartitionSpec, ...], tuple[PartitionSpec, ...]]:
    """The ``PartitionSpec``s the exported computation declares for its inputs and its
    outputs, over the mesh it was traced on (read on first ask; ``PartitionSpec()`` for one
    it declares none for)."""
    import jax

    exported = jax.export.deserialize(bytearray(computation.artifact))
    mesh = AbstractMesh(tuple(computation.mesh_shape), tuple(computation.mesh_axes))

    def spec(declared: Any) -> PartitionSpec:
        return declared.spec if isinstance(declared, NamedSharding) else PartitionSpec()

    return (
        tuple(spec(s) for s in exported.in_shardings_jax(mesh)),
        tuple(spec(s) for s in exported.out_shardings_jax(mesh)),
    )


def _answers(info: pb.SliceInfo, decl: ir.SliceDecl) -> bool:
    """Whether the slice bound under a name is what `decl` asks for: its size, and the
    island and host size it pins, if any."""
    return (
        info.devices == decl.devices
        and (not decl.island or decl.island == info.island)
        and (not decl.devices_per_host or decl.devices_per_host * len(info.hosts) == info.devices)
    )


def _output_sharding(computation: ir.Computation, index: int) -> PartitionSpec:
    """The ``PartitionSpec`` the exported computation declares for output `index`."""
    return _declared_shardings(computation)[1][index]


def _input_axes(computation: ir.Computation, index: int) -> host_blocks.AxisSpec:
    """Input `index`'s declared sharding as `host_blocks` reads it: recorded at trace time,
    else read from the export."""
    if not computation.mesh_shape:
        return ()
    recorded = computation.axes_of(index)
    if recorded is not None:
        return recorded
    return mesh_axes_of(_declared_shardings(computation)[0][index])


SOURCE_END_WAIT_S = 5.0
"""How long a call refused for an unknown input object waits for the end of the call that
made that object, to tell whether that call failed (`failed_source`)."""


def failed_source(
    program: str, call_id: str, inputs: Sequence[np.ndarray | Array], objects: Sequence[pb.ObjectInput],
    wait_s: float = SOURCE_END_WAIT_S,
) -> ExecutionError | None:
    """The error a call refused for an input object its controller no longer knows raises,
    where the call that made that object failed: that call's error, not the refusal. A
    failed call keeps no objects, so a later call given its handle before the failure
    reached the client is refused, naming the object as unknown, and the cause is the first
    call's. Waits up to `wait_s` for that call's end to reach the client; None where no such
    input's call failed (the refusal then stands)."""
    for named in objects:
        given = inputs[named.index]
        if not isinstance(given, Array) or given.call is None:
            continue
        source = given.call
        if source.ended_within(wait_s) and (source.error or source.failure is not None):
            return ExecutionError(
                f"program '{program}' call {call_id} input {named.index}: it is an output of call "
                f"{source.call_id} of program '{source.program}', which failed: {source.error}"
            )
    return None


def _translate(err: grpc.RpcError | DataChannelError | OSError, doing: str) -> Exception:
    """What the user gets for a failed exchange with a host or the controller: the same
    error for the same cause, whether it came over gRPC or a host's data channel."""
    if isinstance(err, DataChannelError):
        code, details = getattr(grpc.StatusCode, err.code, None), str(err)
    elif isinstance(err, OSError):
        return RuntimeUnavailableError(f"{doing}: the data connection broke: {err}")
    else:
        code = err.code() if hasattr(err, "code") else None
        details = (err.details() if hasattr(err, "details") else str(err)) or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PlacementError(f"{doing}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return RuntimeUnavailableError(f"{doing}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        from pathways_wire.errors import InvalidProgramError

        return InvalidProgramError(f"{doing}: {details}")
    return ExecutionError(f"{doing}: {details}")


_default: Runtime | None = None
_default_lock = threading.Lock()


def connect(
    address: str | None = None,
    *,
    islands: dict[str, int] | None = None,
    devices_per_host: int | None = None,
) -> Runtime:
    """Connect to a controller, or start the embedded local cluster.

    `address` is `HOST:PORT` of a running controller; without it the
    `PATHWAYS_CONTROLLER` environment variable is used, and without that a
    local cluster starts (islands and devices per host from the arguments, or
    `PATHWAYS_LOCAL_ISLANDS="island-a:16,island-b:16"` and
    `PATHWAYS_DEVICES_PER_HOST=4`).
    """
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
        named = "connect(address)" if address else "PATHWAYS_CONTROLLER"
        address = address or os.environ.get("PATHWAYS_CONTROLLER") or None
        if address is None:
            cluster = start_local_cluster(islands=islands, devices_per_host=devices_per_host)
            runtime = Runtime(cluster.address, cluster)
        else:
            if address.startswith("k8s://"):
                raise RuntimeUnavailableError(
                    f"connect({address!r}): reach a Kubernetes operator through its "
                    "controller address (HOST:PORT of the operator's gRPC service)"
                )
            try:
                host_port.split(address, f"{named}: the controller address")
            except ValueError as err:
                raise RuntimeUnavailableError(str(err)) from None
            runtime = Runtime(address)
        _default = runtime
        return runtime


def default_runtime() -> Runtime:
    """The runtime programs run on: the last `connect()`, or a new local cluster."""
    global _default
    with _default_lock:
        runtime = _default
    if runtime is None:
        return connect()
    return runtime


def release_virtual_slice(decl_id: str, wait: bool = False) -> None:
    """Release a virtual slice's gang on the current runtime (no runtime: nothing to do)."""
    runtime = _default
    if runtime is None:
        return
    if wait:
        runtime.release(decl_id)
        return
    try:
        runtime._pool.submit(runtime.release, decl_id)
    except RuntimeError:
        pass  # the runtime is shutting down and releases everything itself


def shutdown() -> None:
    """Release slices and stop the embedded cluster, if this process started one."""
    global _default
    with _default_lock:
        runtime, _default = _default, None
    if runtime is not None:
        runtime.close()


atexit.register(shutdown)
