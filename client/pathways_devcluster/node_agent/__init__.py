"""The node agent: a stand-in for the kubelet that runs pods' containers as local processes.

It is not a kubelet. Everything in ``make dev-cluster`` and the cluster tier is real
Kubernetes except this piece (there is no container runtime here: no images, cgroups or
network namespaces; a container's ``python`` is the agent's own interpreter, this
checkout's environment, whatever the image says); the agent does the kubelet's job for one or more
Nodes, against the real API server, keeping the kubelet's contract as far as the
operator, kubectl and the controllers can see:

* Nodes (``node_registrar``): each ``--node NAME:ISLAND:DEVICES`` is registered with its
  island label and ``pathways.dev/device`` capacity, kept Ready, its not-ready taint
  removed, its status and its Lease in ``kube-node-lease`` renewed every 5 s, so that
  node lifecycle sees it alive (and a killed agent's Nodes go NotReady); a Node deleted
  behind the agent's back is registered again.
* Pods (``pod_watch``, ``agent``): one list+watch per Node with ``kubernetes.watch``,
  resumed from its ``resourceVersion`` and re-listed on ``410 Gone`` or an error, with a
  bounded back-off, so an API server restart is ridden out. Each new pod gets a loopback
  IP (``ip_pool``) and a ``PodWorker`` thread (``pod_worker``).
* Containers (``containers``, ``probes``, ``pod_env``, ``pod_volumes``): processes in
  their own sessions with the environment and volumes a kubelet would give them,
  restarted per ``restartPolicy``, probed as the kubelet probes; their status is written
  as a kubelet writes it (``pod_status``).
* Deletion: SIGTERM, the grace period, SIGKILL, a final status, and the delete with
  grace 0; when the agent itself gets SIGTERM it kills all its containers and exits,
  leaving the API objects as they are.

Logs: ``<state-dir>/pods/<namespace>_<pod>/<container>.log`` for a container's first run,
``.log.N`` for restart N (``container_log_path``); the PID of its current run in
``<container>.pid`` beside it (``container_pid_path``).

Run it as ``python -m pathways_devcluster.node_agent --kubeconfig K --node a-0:island-a:4
--state-dir D``; ``NodeAgentProcess`` does that for the dev cluster and for tests.
"""

from pathways_devcluster.node_agent.agent_process import NodeAgentProcess
from pathways_devcluster.node_agent.containers import container_log_path, container_pid_path
from pathways_devcluster.node_agent.node_registrar import NodeSpec

__all__ = ["NodeAgentProcess", "NodeSpec", "container_log_path", "container_pid_path"]
