"""A real Kubernetes control plane and a node agent on one machine, without Docker.

``make dev-cluster`` runs ``python -m pathways_devcluster up``: etcd, kube-apiserver,
kube-controller-manager (node lifecycle included) and kube-scheduler from the binaries
``make controlplane`` builds (``controlplane``), one node agent serving two islands of
devices (``node_agent``), and the operator installed with ``helm install`` of the
project's chart, which the node agent runs as the chart's Deployment pod
(``dev_cluster``). The cluster test tier starts the same pieces.

The node agent is not a kubelet. It runs each pod's containers as local processes of
this checkout's Python environment (a container's ``python`` is this interpreter,
whatever its image), with the environment, volumes, probes and status a kubelet would
give them, and keeps its Nodes' status and Leases fresh as a kubelet does; there are no
images, no cgroups and no network namespaces (pods get loopback addresses).
"""
