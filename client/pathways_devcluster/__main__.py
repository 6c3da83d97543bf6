"""``python -m pathways_devcluster up|down|serve``: what ``make dev-cluster`` and
``make dev-cluster-down`` run.

``up`` starts the dev cluster in the background and prints ``export KUBECONFIG=...``;
``down`` stops it and removes its state; ``serve`` runs it in the foreground (what ``up``
starts). See ``background`` and ``dev_cluster``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pathways_devcluster.background import UP_TIMEOUT_S, default_state_dir, down, serve, up


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pathways_devcluster",
        description="A real Kubernetes control plane, a node agent (not a kubelet) of two "
        "islands and the operator's Helm chart on this machine, without Docker.",
    )
    parser.add_argument("command", choices=("up", "down", "serve"))
    parser.add_argument(
        "--state-dir", type=Path, default=default_state_dir(),
        help=f"where the cluster keeps its state and logs (default {default_state_dir()})",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=UP_TIMEOUT_S,
        help="up: seconds to wait for the cluster to be ready (default %(default).0f)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    if args.command == "up":
        return up(state_dir, args.timeout)
    if args.command == "down":
        return down(state_dir)
    return serve(state_dir)


if __name__ == "__main__":
    sys.exit(main())
