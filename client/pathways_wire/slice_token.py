"""The slice token: the credential every caller of a slice's hosts must hold.

Each virtual slice has one random token. On Kubernetes the operator keeps it in a
Secret per VirtualSlice and mounts it into the slice's pods; the embedded runtime makes
one per slice and hands it to the host processes it starts. Host processes read it from
``PATHWAYS_SLICE_TOKEN``, or from the file ``PATHWAYS_SLICE_TOKEN_FILE`` names (a
mounted Secret), and refuse gRPC calls that do not present it as the metadata entry
``x-pathways-slice-token``; the data channel checks the same token in its hello frame.
``Health`` stays open so probes need no secret.

Hosts fail closed: one that finds no token (no file, no variable, an empty file, an
unreadable file) refuses to start, naming itself and what it looked for, so a Secret
that went missing or empty can never turn authentication off. Only an explicit
``--insecure-no-token`` (or ``PATHWAYS_INSECURE_NO_TOKEN=1``) starts a host that checks
no token, and only when no token file was named at all: for a host started by hand
on one machine.

A slice's clients never see that token. What they hold is its client form
(`client_token`), derived one way from it: the controller gives clients only that,
and a host lets it into the methods that put and fetch values (`CLIENT_METHODS`, and
the data channel) and nowhere else. The sidecars that send values along a cross-slice
route hold its route form (`route_token`), derived the same way under another context:
it opens putting values (`ROUTE_METHODS`, and sending on the data channel) and nothing
else, and it lets the host tell a route's pushes, which other slices' computations
wait for, from its clients' connections, which come from user code
(`port_connections.MAX_CLIENTS_SERVED`).
The host-internal doors, the sidecar's `Control` stream and control port, and the
worker's `Session` and session port, take the slice token alone: a driver (a
program's own code) that could speak to them could tell its worker to map any
file, or its sidecar to forward values anywhere. Being derived, the client form
needs no second secret in the slice's Secret, and a gang relaunched with a new
token changes both.

This module is shared by the callers (the controller, clients, peer sidecars) and the
hosts, so it lives with the wire protocol and imports nothing heavy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from pathlib import Path

METADATA_KEY = "x-pathways-slice-token"
ENV_TOKEN = "PATHWAYS_SLICE_TOKEN"
ENV_TOKEN_FILE = "PATHWAYS_SLICE_TOKEN_FILE"
ENV_INSECURE = "PATHWAYS_INSECURE_NO_TOKEN"
INSECURE_FLAG = "--insecure-no-token"
OPEN_METHODS = frozenset({"/pathways.v1alpha1.Dataflow/Health"})
"""Methods callable without the token: health probes carry no secret."""
CLIENT_METHODS = frozenset({"/pathways.v1alpha1.Dataflow/Put", "/pathways.v1alpha1.Dataflow/Fetch"})
"""Methods a slice's client token opens besides the data channel: putting and fetching values."""
ROUTE_METHODS = frozenset({"/pathways.v1alpha1.Dataflow/Put"})
"""Methods a slice's route token opens besides sending on the data channel: putting values."""
CLIENT_CONTEXT = b"pathways.v1alpha1 client access"
ROUTE_CONTEXT = b"pathways.v1alpha1 route access"


def client_token(token: str) -> str:
    """The client form of slice token `token` ("" for none): what the controller hands
    its clients (see the module)."""
    return _derived(token, CLIENT_CONTEXT, "c.")


def route_token(token: str) -> str:
    """The route form of slice token `token` ("" for none): what the controller hands
    the sidecars that send values to the slice along a cross-slice route (see the module)."""
    return _derived(token, ROUTE_CONTEXT, "r.")


def _derived(token: str, context: bytes, prefix: str) -> str:
    """A form of `token` derived one way under `context` (HMAC-SHA256), as URL-safe text."""
    if not token:
        return ""
    digest = hmac.new(token.encode(), context, hashlib.sha256).digest()
    return prefix + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def new_token() -> str:
    """A fresh token for a new slice (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata presenting ``token``; none when the token is empty."""
    return ((METADATA_KEY, token),) if token else ()


class MissingToken(SystemExit):
    """A host found no usable slice token and was not told to run without one."""


def insecure_allowed(env: Mapping[str, str], flag: bool) -> bool:
    """``--insecure-no-token`` given, or ``$PATHWAYS_INSECURE_NO_TOKEN`` is 1/true/yes."""
    return flag or env.get(ENV_INSECURE, "").strip().lower() in ("1", "true", "yes")


def read_token(env: Mapping[str, str], file_flag: str = "", host: str = "", insecure: bool = False) -> str:
    """The host's token: ``file_flag`` or ``$PATHWAYS_SLICE_TOKEN_FILE`` if set, else ``$PATHWAYS_SLICE_TOKEN``.

    Raises :class:`MissingToken` naming ``host`` and what was missing when there is no
    token. ``insecure`` lets a host with neither a file nor a variable run unchecked
    (returns ""); a named file that cannot be read or is empty is refused even then,
    because a token file is only named where a token was meant to be.
    """
    who = f"host {host}" if host else "this host"
    path = file_flag or env.get(ENV_TOKEN_FILE, "")
    if path:
        source = "--slice-token-file" if file_flag else ENV_TOKEN_FILE
        try:
            token = Path(path).read_text().strip()
        except OSError as err:
            raise MissingToken(
                f"{who}: refusing to start: cannot read the slice token file {path} ({source}): "
                f"{err.strerror or err}; mount the slice's Secret there"
            ) from None
        if not token:
            raise MissingToken(
                f"{who}: refusing to start: the slice token file {path} ({source}) is empty; "
                "the slice's Secret has no token: delete the Secret and the operator makes a new one"
            )
        return token
    token = env.get(ENV_TOKEN, "").strip()
    if token or insecure:
        return token
    raise MissingToken(
        f"{who}: refusing to start without a slice token: none of --slice-token-file, "
        f"${ENV_TOKEN_FILE} or ${ENV_TOKEN} is set, so any caller could use this host. "
        f"Give it the slice's token, or pass {INSECURE_FLAG} (${ENV_INSECURE}=1) to run a host "
        "that checks no token"
    )
