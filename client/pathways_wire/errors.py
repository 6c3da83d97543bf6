"""Exceptions a Pathways user sees. Each carries what it is about in its message."""


class PathwaysError(Exception):
    """Base of every error raised by the runtime."""


class InvalidProgramError(PathwaysError, ValueError):
    """The program or its arguments cannot be traced or compiled (found at trace time)."""


class PlacementError(PathwaysError):
    """A slice cannot be placed: it asks for more devices than an island has."""


class ExecutionError(PathwaysError):
    """A program call failed on a host; the message names program, computation and host."""


class RuntimeUnavailableError(PathwaysError):
    """The controller or a host could not be reached in time."""
