"""The web console: static files under /ui that speak only the public v1 API."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_DIR = Path(__file__).parent / "console"


def mount(app: FastAPI) -> None:
    """Serve the console at /ui/ (and send /ui there: relative module paths need the trailing slash)."""

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    app.mount("/ui/", StaticFiles(directory=CONSOLE_DIR, html=True), name="ui")
