"""A slice's client and route tokens: derived one way from the slice token, and what each opens on a host."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from pathways_wire.slice_token import CLIENT_METHODS, METADATA_KEY, ROUTE_METHODS, client_token, new_token, route_token
from pathways_worker.slice_auth import SliceTokenInterceptor


def test_the_client_token_is_fixed_by_the_slice_token_and_is_not_it() -> None:
    token = new_token()
    assert client_token(token) == client_token(token)
    assert client_token(token) != token
    assert client_token(token) != client_token(new_token())
    assert client_token("") == ""


def test_the_route_token_is_fixed_by_the_slice_token_and_is_neither_it_nor_the_client_token() -> None:
    token = new_token()
    assert route_token(token) == route_token(token)
    assert route_token(token) not in (token, client_token(token))
    assert route_token(token) != route_token(new_token())
    assert route_token("") == ""


class _Details:
    def __init__(self, method: str, token: str) -> None:
        self.method = method
        self.invocation_metadata = ((METADATA_KEY, token),) if token else ()


def _handler() -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(lambda request, context: request)


def _lets_in(interceptor: SliceTokenInterceptor, method: str, token: str) -> bool:
    handler = _handler()
    return interceptor.intercept_service(lambda _: handler, _Details(method, token)) is handler  # type: ignore[arg-type]


PUT, CONTROL = "/pathways.v1alpha1.Dataflow/Put", "/pathways.v1alpha1.Dataflow/Control"
SESSION = "/pathways.v1alpha1.Executor/Session"


@pytest.mark.parametrize(
    ("method", "client_methods", "client_let_in"),
    [
        (PUT, CLIENT_METHODS, True),
        ("/pathways.v1alpha1.Dataflow/Fetch", CLIENT_METHODS, True),
        (CONTROL, CLIENT_METHODS, False),
        ("/pathways.v1alpha1.Dataflow/Coordinator", CLIENT_METHODS, False),
        (SESSION, frozenset(), False),
        (PUT, frozenset(), False),
    ],
)
def test_the_client_token_opens_only_the_methods_the_server_names_and_the_slice_token_all(
    method: str, client_methods: frozenset[str], client_let_in: bool
) -> None:
    token = new_token()
    interceptor = SliceTokenInterceptor(token, "s/host-0", client_methods=client_methods)
    assert _lets_in(interceptor, method, token)
    assert _lets_in(interceptor, method, client_token(token)) is client_let_in
    assert not _lets_in(interceptor, method, client_token(new_token()))
    assert not _lets_in(interceptor, method, "")


@pytest.mark.parametrize(
    ("method", "route_let_in"),
    [
        (PUT, True),
        ("/pathways.v1alpha1.Dataflow/Fetch", False),
        (CONTROL, False),
        ("/pathways.v1alpha1.Dataflow/Coordinator", False),
    ],
)
def test_the_route_token_opens_only_putting_values_on_a_sidecar(method: str, route_let_in: bool) -> None:
    token = new_token()
    interceptor = SliceTokenInterceptor(
        token, "s/host-0", client_methods=CLIENT_METHODS, route_methods=ROUTE_METHODS
    )
    assert _lets_in(interceptor, method, route_token(token)) is route_let_in
    assert not _lets_in(interceptor, method, route_token(new_token()))


def test_health_tells_more_to_holders_of_any_form_of_the_slice_token_only() -> None:
    token = new_token()
    interceptor = SliceTokenInterceptor(token, "s/host-0", client_methods=CLIENT_METHODS, route_methods=ROUTE_METHODS)
    for held in (token, client_token(token), route_token(token)):
        assert interceptor.holds_token(((METADATA_KEY, held),))
    other = new_token()
    for held in (other, client_token(other), route_token(other), ""):
        assert not interceptor.holds_token(((METADATA_KEY, held),))
