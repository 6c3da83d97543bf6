"""The host's door: gRPC calls without this slice's token are refused.

Both host processes install `SliceTokenInterceptor` on their servers. It looks at the
call's metadata before any request message is read, so a caller without the token
(another slice's pod, a stray client) learns nothing but ``UNAUTHENTICATED`` and a
message saying which metadata entry it lacked; the servicer never sees the call. The
comparison is constant-time. Methods in `slice_token.OPEN_METHODS` (Health) stay open, and
tell a caller without the token no more than that the host lives (`holds_token`).
The slice's client token (`slice_token.client_token`) opens only the methods a host's
server names as its clients' (the sidecar's Put and Fetch), its route token
(`slice_token.route_token`) only those it names as its routes' (the sidecar's Put); every
other method wants the slice token itself.
An interceptor without a token is refused at construction unless its host was started
with ``--insecure-no-token``: an empty token never silently means "let everyone in".
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pathways_wire.slice_token import INSECURE_FLAG, METADATA_KEY, OPEN_METHODS, client_token, route_token

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # generic only in the stubs
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class SliceTokenInterceptor(_Interceptor):
    """Refuses every call except `OPEN_METHODS` unless it presents ``token``.

    ``insecure``: the host was started with ``--insecure-no-token``; only then may
    ``token`` be empty, and then every call is let in. ``client_methods``: those the
    slice's client token also opens; ``route_methods``: those its route token also opens.
    """

    def __init__(
        self, token: str, host_name: str, *, insecure: bool = False, client_methods: frozenset[str] = frozenset(),
        route_methods: frozenset[str] = frozenset(),
    ) -> None:
        if not token and not insecure:
            raise ValueError(
                f"host {host_name}: refusing to serve without a slice token "
                f"(pass {INSECURE_FLAG} to check no caller)"
            )
        self._token = token.encode()
        self._client_token = client_token(token).encode()
        self._client_methods = client_methods
        self._route_token = route_token(token).encode()
        self._route_methods = route_methods
        self._host = host_name

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not self._token or method in OPEN_METHODS:
            return handler
        presented = _presented(handler_call_details.invocation_metadata)
        if hmac.compare_digest(presented.encode(), self._token):
            return handler
        is_client = hmac.compare_digest(presented.encode(), self._client_token)
        if is_client and method in self._client_methods:
            return handler
        is_route = hmac.compare_digest(presented.encode(), self._route_token)
        if is_route and method in self._route_methods:
            return handler
        what = (
            "presented the slice's client token, which opens only putting and fetching values" if is_client
            else "presented the slice's route token, which opens only putting values" if is_route
            else "presented another slice's token" if presented else f"presented no {METADATA_KEY} metadata"
        )
        message = (
            f"host {self._host}: {method} refused: the caller {what}; only holders of this "
            "slice's token (its Secret, PATHWAYS_SLICE_TOKEN) may call it"
        )
        log.warning("%s", message)
        return _refusal(handler, message)

    def holds_token(self, metadata: Any) -> bool:
        """Whether a call's metadata presents the slice's token, its client form or its route
        form (any call does, on a host started without a token): what an open method asks
        before it tells more than that the host lives."""
        if not self._token:
            return True
        presented = _presented(metadata).encode()
        return any(hmac.compare_digest(presented, t) for t in (self._token, self._client_token, self._route_token))


def _presented(metadata: Any) -> str:
    """The token a call's metadata presents ("" for none)."""
    presented = ""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            presented = value if isinstance(value, str) else value.decode(errors="replace")
    return presented


def _refusal(handler: grpc.RpcMethodHandler[Any, Any], message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that aborts with ``message``."""

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **codec)
    return grpc.unary_unary_rpc_method_handler(refuse, **codec)
