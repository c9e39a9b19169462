"""The OpenAPI the app serves states this app's limits, so the contract says what it refuses.

How many texts or examples one request may carry and how long a text may be are settings; the request
schemas are static, so the limits are written into the generated document here, once per app.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from services.api.settings import Settings
from services.engine.task_spec import NOT_ONLY_WHITESPACE

_BATCHES = {"ClassifyIn": "texts", "ExamplesIn": "examples", "PoolIn": "texts"}  # schema -> its list of items
_WITH_TEXTS = ("ExampleIn", "ClassifyIn", "DemonstrationsIn", "PoolTextIn")


def _cap_texts(schema: Any, max_chars: int) -> None:
    """Give every request text (a string held to NOT_ONLY_WHITESPACE) the app's maxLength."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("pattern") == NOT_ONLY_WHITESPACE:
            schema["maxLength"] = max_chars
        for value in schema.values():
            _cap_texts(value, max_chars)
    elif isinstance(schema, list):
        for item in schema:
            _cap_texts(item, max_chars)


def document_limits(app: FastAPI, settings: Settings) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            components = document["components"]["schemas"]
            for name, items in _BATCHES.items():
                components[name]["properties"][items]["maxItems"] = settings.max_batch
            for name in _WITH_TEXTS:
                _cap_texts(components[name], settings.max_text_chars)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to adjust it
