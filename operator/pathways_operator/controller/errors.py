"""The one error the controller answers a request with; its code names the gRPC status."""

from __future__ import annotations


class ControllerError(Exception):
    """A request the controller refuses; `code` maps onto a gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
