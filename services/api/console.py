"""The web console: static files under `static/`, served at `/` by the same app as the api.

The page is plain HTML, CSS and ES modules that call the public `/v1` routes from the browser, so
there is nothing to build and nothing loaded from another origin. It is mounted under `/console`
(not at `/`) so that a path no route knows still gets the api's JSON 404, not a file lookup.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).with_name("static")

# Browsers refuse an ES module served with a non-JavaScript type, and `mimetypes` reads the host's
# tables (on some systems .js is text/plain): register the types the console depends on.
for media_type, suffix in (("text/javascript", ".js"), ("text/css", ".css"), ("image/svg+xml", ".svg")):
    mimetypes.add_type(media_type, suffix)


class _Revalidated(StaticFiles):
    """Static files a browser must revalidate (ETag) before reuse, so an upgraded api serves new code."""

    def file_response(self, full_path, stat_result, scope: Scope, status_code: int = 200):
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        return response


def mount_console(app: FastAPI) -> None:
    """Serve the console at `/` and its assets under `/console/`; call after the api's routes."""
    app.mount("/console", _Revalidated(directory=STATIC_DIR), name="console")

    @app.get("/", include_in_schema=False)
    async def console_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
