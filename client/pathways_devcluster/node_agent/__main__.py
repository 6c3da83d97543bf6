"""``python -m pathways_devcluster.node_agent --kubeconfig K --node a-0:island-a:4 --state-dir D``.

Runs the node agent (a stand-in for the kubelet, not a kubelet) in the foreground
until SIGTERM or SIGINT, then kills every container it started and exits, leaving the
API objects as they are.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from pathways_devcluster import node_agent
from pathways_devcluster.node_agent.agent import AgentOptions, NodeAgent

log = logging.getLogger("pathways_devcluster.node_agent")


def main(argv: Sequence[str] | None = None) -> int:
    options = AgentOptions.parse(argv, description=(node_agent.__doc__ or "").split("\n\n")[0])
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    agent = NodeAgent(options)

    def _on_signal(signum: int, frame: object) -> None:
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    agent.start()
    while not agent.stop_event.wait(1.0):
        pass
    log.info("agent: stopping")
    agent.stop()
    log.info("agent: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
