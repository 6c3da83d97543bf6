"""The controller's door: every call presents a client token, and reaches only its own slices.

:class:`ClientGate` is a gRPC server interceptor in front of the Controller service. It
reads the client token (metadata ``x-pathways-client-token``) and asks its
:class:`TokenScopes` what it grants (``core.client_access.ClientScope``): the operator's
driver pods each hold their program's token, the embedded runtime's client the token its
controller made at start. Without a token, or with an unknown one, the call is refused
``UNAUTHENTICATED`` saying which credential is missing. Then each call is checked
against what the client obtained (``core.client_access.Grants``): ``CreateSlice`` only
for a VirtualSlice of its program, ``LoadProgram`` and ``ReleaseSlice`` only on slices
it placed, ``Run`` only of programs it loaded, ``WaitCall``/``FinishCall`` only of its
calls, ``DropObjects``/``KeepAlive`` (and ``Run``'s owner) only for a client id it was the
first to use, so no token drops or keeps another program's objects; anything else is ``PERMISSION_DENIED``, naming the program and the slice. So a
driver learns only its own slices' tokens (``SliceInfo.token``, ``RunReply.host_tokens``).
``Describe`` needs a token and tells no slice tokens.

The check itself (:meth:`ClientGate.admit`) knows no transport: the controller's calls
port (`calls_port`) puts every request it carries through the same gate, so what a
client obtained over gRPC (a program loaded) holds on the port and the other way round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from pathways_wire import pathways_pb2 as pb
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA
from pathways_operator.core.client_access import ClientScope, Grants, slice_refusal, unauthenticated

SERVICE = "/pathways.v1alpha1.Controller/"
WAITS_PER_CLIENT = 64
"""`WaitCall`s one token's callers may have waiting at once over gRPC. Each holds one of the
controller's server threads until its call ends or its timeout passes, so a client that
waited on its own long call again and again could hold every thread, and every other
client's gRPC calls would queue behind it. Twice a client's default bound of outstanding
calls (`PATHWAYS_MAX_OUTSTANDING_CALLS`, 32): past it a wait is refused at once. The calls
port answers a wait when the call ends, holding no thread, and is not bounded here."""


class TokenScopes(Protocol):
    """What a client token grants; None for a token of nobody."""

    def scope_of(self, token: str, named: tuple[str, str]) -> ClientScope | None: ...


class OneClient:
    """The embedded runtime's controller: one token, made at start, good for every slice."""

    def __init__(self, token: str) -> None:
        self._token = token

    def scope_of(self, token: str, named: tuple[str, str]) -> ClientScope | None:
        import hmac

        if token and hmac.compare_digest(token, self._token):
            return ClientScope.everything("the embedded runtime's client")
        return None


def metadata_value(context: grpc.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return str(v)
    return ""


def program_named(context: grpc.ServicerContext) -> tuple[str, str]:
    """(namespace, program) the caller says it runs for (metadata ``x-pathways-program``)."""
    namespace, _, name = metadata_value(context, PROGRAM_METADATA).partition("/")
    return namespace, name


class Refused(Exception):
    """A call the gate turns away: the gRPC status code's name, and why."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ClientGate(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every Controller call and keeps each client to its own slices."""

    def __init__(self, scopes: TokenScopes) -> None:
        self._scopes = scopes
        self._grants = Grants()
        self._lock = threading.Lock()

    def authenticate(self, name: str, token: str, program: tuple[str, str]) -> ClientScope:
        """What `token` (of the client running for `program`) grants; refused when nothing."""
        scope = self._scopes.scope_of(token, program)
        if scope is None:
            raise Refused("UNAUTHENTICATED", f"{name}: {unauthenticated(bool(token), CLIENT_TOKEN_METADATA)}")
        return scope

    def admit(self, name: str, token: str, program: tuple[str, str], request: Any,
              inner: Callable[[], Any]) -> Any:
        """`inner()`'s reply, once `token` (of the client running for `program`) may call
        method `name` with `request`; what it obtained is recorded. Refused otherwise."""
        scope = self.check(name, token, program, request)
        if name != "WaitCall":
            reply = inner()
        else:
            with self._lock:
                refusal = self._grants.wait_refusal(scope, WAITS_PER_CLIENT)
            if refusal is not None:
                raise Refused("RESOURCE_EXHAUSTED", f"{name}: {refusal}")
            try:
                reply = inner()
            finally:
                with self._lock:
                    self._grants.wait_ended(scope)
        self.record(name, scope, request, reply)
        return reply

    def check(self, name: str, token: str, program: tuple[str, str], request: Any) -> ClientScope:
        """`admit`'s check alone, for a reply that comes later (`record` it then)."""
        scope = self.authenticate(name, token, program)
        with self._lock:
            refusal = self._refusal(name, scope, request)
        if refusal is not None:
            raise Refused("PERMISSION_DENIED", f"{name}: {refusal}")
        return scope

    def record(self, name: str, scope: ClientScope, request: Any, reply: Any) -> None:
        """What a call let through by `check` obtained with `reply`."""
        with self._lock:
            self._record(name, scope, request, reply)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        method = str(details.method)
        if handler is None or not method.startswith(SERVICE) or handler.unary_unary is None:
            return handler
        name = method[len(SERVICE):]
        inner = handler.unary_unary

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return self.admit(name, metadata_value(context, CLIENT_TOKEN_METADATA), program_named(context),
                                  request, lambda: inner(request, context))
            except Refused as refused:
                context.abort(getattr(grpc.StatusCode, refused.code), refused.details)
                raise

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _refusal(self, name: str, scope: ClientScope, request: Any) -> str | None:
        g = self._grants
        if name == "CreateSlice":
            return slice_refusal(scope, request.namespace, request.spec.name)
        if name == "LoadProgram":
            return next((r for r in (g.slice_refusal(scope, s) for s in request.bindings.values()) if r), None)
        if name == "ReleaseSlice":
            return g.slice_refusal(scope, request.slice_id)
        if name == "Run":
            return g.program_refusal(scope, request.program_id) or g.client_refusal(scope, request.client)
        if name in ("DropObjects", "KeepAlive"):
            return g.client_refusal(scope, request.client)
        if name in ("WaitCall", "FinishCall"):
            return g.call_refusal(scope, request.call_id)
        return None

    def _record(self, name: str, scope: ClientScope, request: Any, reply: Any) -> None:
        g = self._grants
        if name == "CreateSlice" and isinstance(reply, pb.SliceInfo):
            g.slice_placed(scope, reply.slice_id, request.namespace, request.spec.name)
        elif name == "LoadProgram" and isinstance(reply, pb.LoadProgramReply):
            g.program_loaded(scope, reply.program_id)
        elif name == "Run" and isinstance(reply, pb.RunReply):
            g.client_used(scope, request.client)
            if not reply.released:
                g.call_started(scope, request.call_id)  # a released call is over: nothing to keep
        elif name == "KeepAlive":
            g.client_used(scope, request.client)
        elif name == "FinishCall":
            g.call_finished(request.call_id)
