"""The web playground: a static page served at `/` (plain HTML, JS and CSS; no build step).

The page talks to the server only through what any client can reach: the public `/v1`
routes (it finds its tabs in the `routes` of `GET /v1/models`) and `/metrics` for the
queue depth. The API key, when the server wants one, is typed into the page and kept in
the browser's local storage. `omnistage serve --no-playground` leaves it out.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"


def attach_playground(app: FastAPI) -> None:
    """`GET /` is the page; `/playground/...` its script and style sheet."""

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        # no-cache: a page left open across a server upgrade must not keep a stale script.
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-cache"})

    app.mount("/playground", StaticFiles(directory=STATIC_DIR), name="playground")
