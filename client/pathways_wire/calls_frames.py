"""The controller's calls port: a client's per-call Controller methods as frames over raw TCP.

A client makes a `Run` for every program call it starts and waits for its end with
a `WaitCall` (or with the `Run` itself, for a call whose values are all small), and
frees a call it did not wait for to the end with a `FinishCall`. Over
gRPC each of them is a unary call whose request and answer pass through gRPC's
threads on both sides: about 0.47 ms a round trip between two processes on a busy
2-core machine (experiment 1's unary gRPC floor row), where a loopback TCP round
trip takes about 0.06 ms, and the client's thread spends its wait polling gRPC's
completion queue. These methods also go as frames (`session_frames`) on a port of
their own, which the controller names in `ClusterInfo.calls_port`; placing slices,
loading programs, and the drops and lease renewals that a `Run` does not carry
(`DropObjects`, `KeepAlive`, a batch every second or so) stay on gRPC.

The client connects and sends a `SessionHello` with its client token and the program
it runs for (what the gRPC metadata carries); the port answers with an empty
`ControllerAnswer`. Then each command frame is a `ControllerRequest` (an id, the
method's name, its serialized request) and each event frame the `ControllerAnswer`
with the same id: the serialized reply, or the gRPC status code's name and details,
so the client raises what a gRPC call would have raised. Every request passes the
same check as a gRPC call (`ClientGate`), token and scope, per request. Answers
come in the order requests end, not the order they were sent.
"""

from __future__ import annotations

from google.protobuf.message import Message

from pathways_wire import pathways_pb2 as pb

METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "Run": (pb.RunRequest, pb.RunReply),
    "WaitCall": (pb.CallStatusRequest, pb.CallStatus),
    "FinishCall": (pb.ReleaseCall, pb.CallStatus),
}
"""The methods the calls port carries: name -> (request type, reply type)."""


def waits(method: str, request: Message) -> bool:
    """Whether answering `request` may wait for a program call to end (then the port
    answers it on a thread of its own, so the connection's other requests go on)."""
    return method == "WaitCall" or (method == "Run" and isinstance(request, pb.RunRequest) and request.wait)


NAME_SHOWN = 64
"""How much of an unknown method's name a refusal repeats."""


def refusal(method: str) -> str:
    """Why the port cannot carry `method` ("" when it can)."""
    if method in METHODS:
        return ""
    named = method if len(method) <= NAME_SHOWN else f"{method[:NAME_SHOWN]}... ({len(method)} characters)"
    return f"the calls port carries {', '.join(METHODS)}, not {named!r}: call it over gRPC"
