"""The credentials a client presents: to its controller, and to each host.

The controller lets in a client that presents its client token and names the program
it runs for; a host lets in a caller that presents its slice's token. Every channel
carries an interceptor that adds the credentials to each call, looked up per call,
since a relaunched gang may come back with another token.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from pathways.embedded import LocalCluster
from pathways_wire.driver_protocol import (
    CLIENT_TOKEN_METADATA,
    ENV_PROGRAM,
    ENV_PROGRAM_TOKEN_FILE,
    PROGRAM_METADATA,
)
from pathways_wire.errors import RuntimeUnavailableError
from pathways_wire.slice_token import METADATA_KEY


class PresentToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds credentials to every call, looked up per call (a relaunch may change a host's token)."""

    def __init__(self, credentials: Callable[[], tuple[tuple[str, str], ...]]) -> None:
        self._credentials = credentials

    def _details(self, details: Any) -> Any:
        extra = self._credentials()
        if not extra:
            return details
        return details._replace(metadata=[*(details.metadata or ()), *extra])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def slice_token(tokens: dict[str, str], address: str) -> tuple[tuple[str, str], ...]:
    token = tokens.get(address, "")
    return ((METADATA_KEY, token),) if token else ()


def client_credentials(cluster: LocalCluster | None) -> tuple[tuple[str, str], ...]:
    """What this client presents to its controller: its client token, and the program it runs for.

    The embedded runtime's controller made a token at start (``LocalCluster.client_token``);
    a driver pod reads its program's token from the mounted Secret
    (``$PATHWAYS_PROGRAM_TOKEN_FILE``) and names its program (``$PATHWAYS_NAMESPACE``,
    ``$PATHWAYS_PROGRAM``). Anything else presents no token, and the controller says so.
    """
    token = cluster.client_token if cluster is not None else ""
    path = os.environ.get(ENV_PROGRAM_TOKEN_FILE, "")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as err:
            raise RuntimeUnavailableError(
                f"cannot read the client token {path} (${ENV_PROGRAM_TOKEN_FILE}): {err}"
            ) from None
    out: tuple[tuple[str, str], ...] = ((CLIENT_TOKEN_METADATA, token),) if token else ()
    program = os.environ.get(ENV_PROGRAM, "")
    if program:
        out += ((PROGRAM_METADATA, f"{os.environ.get('PATHWAYS_NAMESPACE', '')}/{program}"),)
    return out
