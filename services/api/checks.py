"""What a static schema cannot say about a request: the task's labels and shape, and this app's limits.

The limits are settings, written into the OpenAPI the app serves (openapi.py), and checked here. Each
failure is a 422 in the validation-error shape, located at the field at fault.
"""

from __future__ import annotations

from collections.abc import Sequence

from openbook.prompting import TextInput

from services.api.errors import unprocessable
from services.api.settings import Settings
from services.engine.runtime import TaskRuntime

Loc = tuple[str | int, ...]


def check_batch(size: int, loc: Loc, settings: Settings) -> None:
    if size > settings.max_batch:
        raise unprocessable(loc, f"batch of {size} is over the limit of {settings.max_batch}")


def check_text(text: TextInput, loc: Loc, runtime: TaskRuntime, settings: Settings) -> None:
    """One text (or pair) against the character limit and the shape the task's template takes."""
    parts: Sequence[str] = (text,) if isinstance(text, str) else text
    if any(len(part) > settings.max_text_chars for part in parts):
        raise unprocessable(loc, f"text over the limit of {settings.max_text_chars} characters")
    if isinstance(text, tuple) != runtime.classifier.template.is_pair:
        shape = "pairs [text_a, text_b]" if runtime.classifier.template.is_pair else "single texts"
        raise unprocessable(loc, f"this task takes {shape}")


def check_label(label: str, loc: Loc, runtime: TaskRuntime) -> None:
    known = runtime.classifier.labels
    if label not in known:
        raise unprocessable(loc, f"unknown label {label!r}; labels: {list(known)}")
