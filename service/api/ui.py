"""The web console: static files under /ui that speak only the public v1 API."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

CONSOLE_DIR = Path(__file__).parent / "console"

# The console renders untrusted environment data; it builds DOM nodes from text only, and this policy
# makes sure nothing else (inline script, foreign origins, framing) can run even if that slips.
POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
          "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class ConsoleFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def mount(app: FastAPI) -> None:
    """Serve the console at /ui/ (and send / and /ui there: relative module paths need the trailing slash)."""

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    # The address `envfoundry serve` listens on is what people open first; the API lives under /v1.
    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    app.mount("/ui/", ConsoleFiles(directory=CONSOLE_DIR, html=True), name="ui")
