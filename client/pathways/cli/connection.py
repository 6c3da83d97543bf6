"""Which cluster, as which identity, in which namespace: kubectl's flags and the session they pick.

``--kubeconfig`` (else ``$KUBECONFIG``, else ``~/.kube/config``; in a pod, its service
account), ``--context`` (else the current one) and ``-n/--namespace`` (else the
context's, else ``default``) are accepted before or after the command, as kubectl
accepts them; :meth:`pathways.kube.Kube.connect` resolves them.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from pathways.kube import Kube


def add_cluster_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """kubectl's connection flags; on subcommands they only override when given."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the context's, else default)"
    )


def connect(args: argparse.Namespace) -> Kube:
    """The session the parsed connection flags name."""
    return Kube.connect(args.kubeconfig, args.context, args.namespace)


def utc_now() -> datetime:
    """The time ages are counted to (UTC)."""
    return datetime.now(timezone.utc)
