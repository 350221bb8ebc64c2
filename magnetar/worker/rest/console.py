"""The web console: one HTML page, a script and a stylesheet, served at ``/console/``.

The page holds no data and no secret: everything it shows it fetches from the public REST
API in the browser, with the token the user types in (sent as ``Authorization: Bearer``).
So the page and its assets load without a token, and every call they make is checked as any
client's is. ``console_enabled: false`` in the worker's settings leaves them out.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from magnetar.worker.rest.errors import ApiError

__all__ = ["CONSOLE_PATH", "console_router"]

CONSOLE_PATH = "/console"
"""Where the console is served; open without a token (see ``rest.auth``)."""

_STATIC = Path(__file__).parent / "static"
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}

console_router = APIRouter(prefix=CONSOLE_PATH, include_in_schema=False)


@console_router.get("")
def console_root() -> Response:
    return RedirectResponse(CONSOLE_PATH + "/")


@console_router.get("/")
def console_page() -> Response:
    return console_asset("index.html")


@console_router.get("/{asset}")
def console_asset(asset: str) -> Response:
    """The page or one of its two assets; not cached, so an upgraded worker serves its own."""
    media_type = _ASSETS.get(asset)
    if media_type is None:
        raise ApiError(404, f"the console has no file {asset!r}")
    return FileResponse(
        _STATIC / asset, media_type=media_type, headers={"Cache-Control": "no-cache"}
    )
