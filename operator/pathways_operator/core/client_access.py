"""Who may use which slice: the controller's decisions about its callers, as values.

Every caller of the controller presents a client token (gRPC metadata
``x-pathways-client-token``). The operator's controller knows one per running
PathwaysProgram, minted into the program's Secret and mounted into its driver pod: it
is good for that program's VirtualSlices alone. The embedded runtime's controller makes
one at start for the client that started it, good for every slice. A call without a
token, or with one the controller does not know, is refused as unauthenticated, saying
which credential is missing; a call about a slice outside the caller's scope is refused
as denied, naming the program and the slice.

:class:`ClientScope` is what a token grants; :func:`slice_refusal` decides one slice;
:func:`unauthenticated` says why a call without a known token is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class ClientScope:
    """What one client token grants."""

    who: str
    """How refusals name the caller: ``program ns/train``, ``the embedded runtime's client``."""
    namespace: str | None = None
    """The namespace of the slices it may use; None: any."""
    slices: frozenset[str] | None = None
    """The VirtualSlice names it may use; None: any slice (the embedded runtime's client)."""

    @classmethod
    def program(cls, namespace: str, name: str, virtual_slices: Iterable[str]) -> ClientScope:
        return cls(f"program {namespace}/{name}", namespace, frozenset(virtual_slices))

    @classmethod
    def everything(cls, who: str) -> ClientScope:
        return cls(who)


def slice_refusal(scope: ClientScope, namespace: str, slice_name: str) -> str | None:
    """Why ``scope`` may not use VirtualSlice ``namespace/slice_name``, or None when it may.

    A slice without a name (an anonymous slice of a local program) belongs to no program:
    only an unrestricted caller may use one.
    """
    if scope.slices is None:
        return None
    where = f"{namespace}/{slice_name}" if namespace else slice_name or "(an anonymous slice)"
    if scope.namespace is not None and namespace != scope.namespace:
        return (f"{scope.who} may use only VirtualSlices of namespace {scope.namespace}; slice {where} "
                "is not one of its spec.slices")
    if slice_name not in scope.slices:
        named = ", ".join(sorted(scope.slices)) or "none"
        return f"{scope.who} may use only its own slices ({named}); slice {where} is not one of its spec.slices"
    return None


def unauthenticated(token_presented: bool, metadata_key: str) -> str:
    """Why a call is refused before anything else: no token, or one the controller does not know."""
    if not token_presented:
        return (f"no client token was presented (gRPC metadata {metadata_key}): a program's driver reads "
                "its token from the mounted Secret <program>-driver-token")
    return (f"the client token presented (gRPC metadata {metadata_key}) belongs to no running "
            "PathwaysProgram or client of this controller")


class Grants:
    """What each client obtained from this controller: the slices it placed, programs, calls.

    A client may bind a program only to slices it placed itself (CreateSlice, within its
    scope), run only programs it loaded, and wait for or finish only calls it started: an
    id learnt elsewhere (``Describe`` lists every slice) grants nothing. Not synchronized:
    the controller service holds a lock around it.
    """

    def __init__(self) -> None:
        self._slices: dict[str, tuple[str, str]] = {}
        """Slice id -> (namespace, VirtualSlice name), as placed."""
        self._placed: dict[str, set[str]] = {}
        """Slice id -> the clients (``ClientScope.who``) that placed it."""
        self._programs: dict[str, set[str]] = {}
        self._calls: dict[str, str] = {}
        self._clients: dict[str, str] = {}
        """Client id (``RunRequest.client``, the owner of objects and leases) -> who first used it."""
        self._waits: dict[str, int] = {}
        """Who -> its waits for calls that hold a server thread (gRPC ``WaitCall``) now."""

    def wait_refusal(self, scope: ClientScope, limit: int) -> str | None:
        """Why ``scope`` may not begin one more wait that holds a thread until its call ends
        (it has ``limit`` already), or None, the wait then counted until `wait_ended`."""
        waiting = self._waits.get(scope.who, 0)
        if waiting >= limit:
            return (f"{scope.who} has {waiting} waits for its calls open already; wait for fewer "
                    "calls at once, or over the controller's calls port")
        self._waits[scope.who] = waiting + 1
        return None

    def wait_ended(self, scope: ClientScope) -> None:
        left = self._waits.pop(scope.who, 0) - 1
        if left > 0:
            self._waits[scope.who] = left

    def slice_placed(self, scope: ClientScope, slice_id: str, namespace: str, name: str) -> None:
        self._slices[slice_id] = (namespace, name)
        self._placed.setdefault(slice_id, set()).add(scope.who)

    def slice_refusal(self, scope: ClientScope, slice_id: str) -> str | None:
        """Why ``scope`` may not use slice ``slice_id`` (bind a program to it, release it), or None."""
        if scope.slices is None:
            return None
        if scope.who not in self._placed.get(slice_id, ()):
            namespace, name = self._slices.get(slice_id, ("", ""))
            what = f"slice {slice_id}" + (f" (VirtualSlice {namespace}/{name})" if name else "")
            return f"{scope.who} did not place {what}: ask for one of its own slices with CreateSlice first"
        namespace, name = self._slices[slice_id]
        return slice_refusal(scope, namespace, name)

    def program_loaded(self, scope: ClientScope, program_id: str) -> None:
        self._programs.setdefault(program_id, set()).add(scope.who)

    def program_refusal(self, scope: ClientScope, program_id: str) -> str | None:
        if scope.slices is None or scope.who in self._programs.get(program_id, ()):
            return None
        return f"{scope.who} did not load program {program_id}: load it with LoadProgram first"

    def call_started(self, scope: ClientScope, call_id: str) -> None:
        self._calls[call_id] = scope.who

    def call_refusal(self, scope: ClientScope, call_id: str) -> str | None:
        owner = self._calls.get(call_id)
        if scope.slices is None or owner is None or owner == scope.who:
            return None
        return f"{scope.who} did not start call {call_id}"

    def call_finished(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def client_refusal(self, scope: ClientScope, client: str) -> str | None:
        """Why ``scope`` may not act as client id ``client`` (own objects, drop them, renew
        their lease), or None. An id belongs to the first caller that used it: objects are
        owned by the id, so a token of one program must not name another's."""
        owner = self._clients.get(client)
        if scope.slices is None or owner is None or owner == scope.who:
            return None
        return f"{scope.who} may not act for client {client!r}, which {owner} uses: name its own client id"

    def client_used(self, scope: ClientScope, client: str) -> None:
        if client:
            self._clients.setdefault(client, scope.who)
