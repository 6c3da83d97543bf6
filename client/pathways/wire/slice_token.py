"""The slice token: the credential every caller of a slice's hosts must hold.

Each virtual slice has one random token. On Kubernetes the operator keeps it in a
Secret per VirtualSlice and mounts it into the slice's pods; the embedded runtime makes
one per slice and hands it to the host processes it starts. Host processes read it from
``PATHWAYS_SLICE_TOKEN``, or from the file ``PATHWAYS_SLICE_TOKEN_FILE`` names (a
mounted Secret), and refuse gRPC calls that do not present it as the metadata entry
``x-pathways-slice-token``; the data channel checks the same token in its hello frame.
``Health`` stays open so probes need no secret. An empty token means "not checked",
which is what a host started by hand for a test gets.

This module is shared by the callers (the controller, clients, peer sidecars) and the
hosts, so it lives with the wire protocol and imports nothing heavy.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

METADATA_KEY = "x-pathways-slice-token"
ENV_TOKEN = "PATHWAYS_SLICE_TOKEN"
ENV_TOKEN_FILE = "PATHWAYS_SLICE_TOKEN_FILE"
OPEN_METHODS = frozenset({"/pathways.v1alpha1.Dataflow/Health"})
"""Methods callable without the token: health probes carry no secret."""


def new_token() -> str:
    """A fresh token for a new slice (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata presenting ``token``; none when the token is empty."""
    return ((METADATA_KEY, token),) if token else ()


def read_token(env: Mapping[str, str], file_flag: str = "") -> str:
    """The host's token: ``file_flag`` or ``$PATHWAYS_SLICE_TOKEN_FILE`` if set, else ``$PATHWAYS_SLICE_TOKEN``."""
    path = file_flag or env.get(ENV_TOKEN_FILE, "")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as err:
            raise SystemExit(
                f"--slice-token-file {path}: cannot read the slice token ({err}); mount the "
                "slice's Secret there or unset PATHWAYS_SLICE_TOKEN_FILE"
            ) from None
    return env.get(ENV_TOKEN, "").strip()
