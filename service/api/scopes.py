"""The scope a route needs, as a dependency every transport's routes share: ``Run`` or ``Admin``.

The bearer scheme is declared here once, so the OpenAPI document names one security scheme.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.auth import KeyRing, Principal

bearer = HTTPBearer(auto_error=False, description="An API key; needed when the service has keys configured.")


def _scope(scope: str) -> Any:
    async def principal(request: Request,
                        _: HTTPAuthorizationCredentials | None = Security(bearer)) -> Principal:
        keys: KeyRing = request.app.state.keys
        who = keys.authenticate(request.headers.get("authorization"), scope)
        request.state.tenant = who.tenant or "-"  # for the access log
        return who

    return Depends(principal)


Run = _scope("run")
Admin = _scope("admin")
