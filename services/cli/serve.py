"""`openbook serve`: the api (FastAPI under uvicorn), configured from `OPENBOOK_*`."""

from __future__ import annotations

import argparse

from services.cli import fit_threads


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from services.api.app import create_app
    from services.api.settings import Settings

    settings = Settings()
    fit_threads(settings.threads)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    return 0
