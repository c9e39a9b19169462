"""Publish a file or a directory atomically: build it beside its target, fsync it, rename it into place.

Readers see the old version or the new one, never a half-written one: every
file is on disk before the rename publishes it. Staging names start with
`.<target name>.tmp-`, so what a crash leaves behind can be recognised and swept.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def staging_name(target: Path) -> Path:
    """A unique sibling of `target` (same filesystem, so the final rename is atomic)."""
    return target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Yield an empty staging directory; on a clean exit it replaces `target`, on an error it is removed.

    An existing target is moved aside first, and put back if the final rename fails.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_name(target)
    staging.mkdir()
    try:
        yield staging
        for entry in staging.rglob("*"):
            fsync_path(entry)
        fsync_path(staging)
        if target.exists():
            aside = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
            os.rename(target, aside)
            try:
                os.rename(staging, target)
            except BaseException:
                os.rename(aside, target)  # put the old one back rather than leave none
                raise
            shutil.rmtree(aside)
        else:
            os.rename(staging, target)
        fsync_path(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only still there if something failed


@contextmanager
def staged_file(target: Path) -> Iterator[Path]:
    """Yield a path to write; on a clean exit the file replaces `target`, on an error it is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_name(target)
    try:
        yield staging
        fsync_path(staging)
        os.replace(staging, target)
        fsync_path(target.parent)
    finally:
        staging.unlink(missing_ok=True)  # only still there if something failed


def write_text(target: Path, text: str) -> None:
    """Replace `target` with `text` (UTF-8), atomically."""
    with staged_file(target) as staging:
        staging.write_text(text, encoding="utf-8")


def add_json_record(target: Path, record: dict, replaces: Callable[[dict], bool] = lambda old: False) -> None:
    """Add `record` to the JSON list in `target` (made if absent), dropping the records it `replaces`;
    the file is replaced whole, atomically."""
    records = json.loads(target.read_text()) if target.is_file() else []
    kept = [old for old in records if not replaces(old)]
    write_text(target, json.dumps([*kept, record], indent=1) + "\n")
