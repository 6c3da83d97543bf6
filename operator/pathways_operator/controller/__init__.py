"""The controller: the resource manager and island scheduler clients and drivers talk to.

`controller.Controller` owns the tables (`slices`, `programs`, `calls`) and
delegates where gangs come from to a `gangs` strategy — embedded (it places
and starts local hosts) or Kubernetes (the operator registers the gangs it
placed). `plans` lays a call out over its gangs' hosts without I/O;
`host_link` is one control stream to one host; `service` is the gRPC skin, and
`client_gate` the door in front of it (client tokens, each client to its own slices).
"""

from pathways_operator.controller.calls import SHARED_WINDOW
from pathways_operator.controller.controller import Controller
from pathways_operator.controller.errors import ControllerError
from pathways_operator.controller.gangs import EmbeddedGangs, Gangs, HostLauncher, HostRequest, KubernetesGangs
from pathways_operator.controller.host_link import GRPC_OPTIONS
from pathways_operator.controller.service import ControllerService, controller_server
from pathways_operator.controller.slices import Host

__all__ = [
    "GRPC_OPTIONS",
    "SHARED_WINDOW",
    "Controller",
    "ControllerError",
    "ControllerService",
    "EmbeddedGangs",
    "Gangs",
    "Host",
    "HostLauncher",
    "HostRequest",
    "KubernetesGangs",
    "controller_server",
]
