"""Errors the sandbox raises in the service process.

    SandboxError
    ├── WorkerLost        the worker died, hung or broke the protocol; it has been replaced
    ├── SandboxBusy       no worker became free within the wait limit
    └── RequestFailed     the worker answered with an error (``kind``, ``message``)
"""

from __future__ import annotations


class SandboxError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class WorkerLost(SandboxError):
    pass


class SandboxBusy(SandboxError):
    pass


class RequestFailed(SandboxError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
