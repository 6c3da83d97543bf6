"""The one place a reconcile's decision reaches the API: status written once, then its Events.

Both reconcilers end every look here. ``status`` is patched only when it
differs from what was read (a quiet look writes nothing), the phase gauge is
updated, the look is counted (``pathways_reconciles_total{kind,result}``: whether it
wrote), and the Events the state machine decided are posted; an Event the API
server refuses is logged, never retried: it must not undo the status written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pathways_operator.core.status_report import Event
from pathways_operator.k8s.cluster_api import ClusterApi, Json, KubeError

log = logging.getLogger(__name__)


class StatusWriter:
    """Writes a VirtualSlice's or PathwaysProgram's status and posts its Events."""

    def __init__(
        self,
        api: ClusterApi,
        patch: Callable[[str, str, Json], None],
        gauge: Callable[[str, str | None], None],
        looked: Callable[[bool], None] = lambda wrote: None,
    ) -> None:
        self._api = api
        self._patch = patch
        """``patch(namespace, name, status)``: the status subresource of the kind written."""
        self._gauge = gauge
        """``gauge(key, phase)``: the operator's phase metric of the kind written."""
        self._looked = looked
        """``looked(wrote)``: counts each look, and whether it patched status."""

    def write(
        self,
        key: str,
        reference: Json,
        new: Json | None,
        phase: str,
        events: Iterable[Event],
    ) -> None:
        """Patch ``new`` (None: status unchanged), record ``phase``, post ``events`` on ``reference``."""
        if new is not None:
            namespace, _, name = key.partition("/")
            self._patch(namespace, name, new)
        self._gauge(key, phase)
        self._looked(new is not None)
        for event in events:
            try:
                self._api.post_event(reference, event.type, event.reason, event.message)
            except KubeError as err:
                log.warning("%s: %s", key, err)

    def forget(self, key: str) -> None:
        """The object is gone: it has no phase any more."""
        self._gauge(key, None)
