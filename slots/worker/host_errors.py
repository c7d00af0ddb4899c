"""The requests an `ActorHost` refuses, each naming the gRPC status the servicer answers with.

Why not gRPC errors: the host knows nothing of the wire (it is tested without one); the servicer
maps `code` to a status in one place (`service.py`).
"""

from __future__ import annotations


class HostError(Exception):
    """A request the host refuses; `code` names the gRPC status the servicer returns."""

    code = "unknown"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(HostError):
    code = "invalid_argument"


class NotFound(HostError):
    code = "not_found"


class FailedPrecondition(HostError):
    code = "failed_precondition"


class DataLoss(HostError):
    code = "data_loss"


class Unavailable(HostError):
    code = "unavailable"


class PermissionDenied(HostError):
    code = "permission_denied"
