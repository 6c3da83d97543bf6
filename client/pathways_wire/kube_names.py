"""The Kubernetes names the operator, the CLI and the hosts read and write, declared once.

Group, versions and plurals of the two custom resources; the labels and
annotations put on worker pods (what ``kubectl get pods -l`` selects on); the
extended resource that Nodes advertise; the container names and ports of a
host, which are the contract with ``pathways_worker`` (the ``worker`` container
listens on 8471 and coordinates JAX on 8476, the ``dataflow`` sidecar listens on
8470). Anything that must match between the operator, the pods and a user's
``kubectl`` lives here rather than as a string literal in a reconciler.
"""

from __future__ import annotations

GROUP = "pathways.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

SLICE_KIND = "VirtualSlice"
SLICE_PLURAL = "virtualslices"
PROGRAM_KIND = "PathwaysProgram"
PROGRAM_PLURAL = "pathwaysprograms"

ISLAND_LABEL = "pathways.dev/island"
"""Node label naming the island a machine belongs to."""
DEVICE_RESOURCE = "pathways.dev/device"
"""Extended resource: devices a Node offers, and a worker pod requests."""

SLICE_LABEL = "pathways.dev/slice"
HOST_INDEX_LABEL = "pathways.dev/host-index"
GENERATION_LABEL = "pathways.dev/generation"
"""Which incarnation of the gang a pod belongs to: ``status.restarts`` when it was created."""
PROGRAM_LABEL = "pathways.dev/program"
"""On VirtualSlices a program created from a template: the owning program's name."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kube-pathways"

PLACEMENT_ANNOTATION = "pathways.dev/placement"
"""On every pod of a gang: the whole placement as JSON, so a restarted operator
knows which devices the gang holds even for hosts whose pods do not exist yet."""

ADMISSION_GROUP_LABEL = "pathways.dev/admission-group"
"""On VirtualSlices admitted together or not at all: the group's name (a program's
inline slices: the program's uid)."""
ADMISSION_GROUP_SIZE_ANNOTATION = "pathways.dev/admission-group-size"
"""With ``ADMISSION_GROUP_LABEL``: how many VirtualSlices the group has in all."""

RESTARTS_ANNOTATION = "pathways.dev/restarts"
"""On a VirtualSlice, written by the operator: gangs recreated so far (the slice record;
``status.restarts`` only reports it)."""
FAILURE_ANNOTATION = "pathways.dev/failure"
"""On a VirtualSlice, written by the operator: why the slice failed for good, if it did."""

SCHEDULER_NAME = "pathways"
"""Pods with this schedulerName are bound by the operator, never by kube-scheduler."""

DRIVER_LABEL = "pathways.dev/driver"
"""On a program's driver pod: the program's name (the chart's NetworkPolicy admits these)."""
COMPONENT_LABEL = "app.kubernetes.io/component"
"""``driver`` on driver pods, ``worker`` on worker pods."""

WORKER_CONTAINER = "worker"
DRIVER_CONTAINER = "driver"
SIDECAR_CONTAINER = "dataflow"
SIDECAR_PORT = 8470
WORKER_PORT = 8471
COORDINATOR_PORT = 8476
SIDECAR_METRICS_PORT = 8477
"""The sidecar's Prometheus ``/metrics`` (container port ``metrics``)."""
SHM_DIR = "/dev/shm/pathways"

FIELD_MANAGER = "kube-pathways-operator"
ANNOTATION_PREFIX = "pathways.dev"
"""Prefix of kopf's bookkeeping annotations (progress and diff base)."""
