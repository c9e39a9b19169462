"""A task's quality report: what is scored, and the report as the api serves it.

The numbers are the library's (`openbook.quality`); this module picks the evidence:

- a task served by its untrained base model is scored leave-one-out over its labelled examples
  (`TaskRuntime.leave_one_out`: each example with itself out of the store);
- a trained version is scored on its held-out dev split, as scored when the version was made and kept
  in its checkpoint's manifest (`openbook.fitting.calibrate_on_dev`).

Blocking (a forward over every example, or a manifest read): it runs in a worker thread, off the
request where the client asks not to wait (serving/reports.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openbook.artifacts import MANIFEST_NAME
from openbook.fitting import scored_from_record
from openbook.quality import SLOT_VECTORS, Readers, Scored, readers_of, readers_on_dev, report_of

from services.api import schemas
from services.bus import versions
from services.engine.runtime import TaskRuntime


class NoReport(LookupError):
    """Nothing to report on: `status` is the HTTP status that says why (404: no such version, 409: no
    scores)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def task_report(
    runtime: TaskRuntime,
    artifacts: Path,
    version: str | None,
    on_chunk: Callable[[int, int], None] | None = None,
) -> schemas.ReportOut:
    """The report of the version the task serves (`version` None) or of a recorded `version`.
    `on_chunk`: the leave-one-out pass's progress (`TaskRuntime.leave_one_out`), where there is one."""
    if version is None and runtime.published is None:
        scored, model_version, store_version = runtime.leave_one_out(on_chunk)
        if len(scored.ids) == 0:
            raise NoReport(409, f"task {runtime.task.name!r} has no labelled example to score")
        classifier = runtime.classifier
        keyed_by = SLOT_VECTORS if classifier.reader is None else classifier.reader.base.name
        readers = readers_of(scored, classifier.served_knn().lam if len(classifier.store) else None, keyed_by)
        return _report(
            runtime, scored, model_version, store_version, "leave-one-out", 1.0, classifier.labels, readers
        )
    name = runtime.task.name
    if version is None:
        assert runtime.published is not None  # tested above
        version, path = runtime.published.version, Path(runtime.published.path)
    else:
        _, records = versions.list_versions(runtime.log.client, name)
        if version not in {record["version"] for record in records}:
            raise NoReport(404, f"no version {version!r} of task {name!r}")
        path = artifacts / name / version  # where the trainer writes it (services.trainer.worker)
    manifest = _manifest(path)
    record = manifest.get("dev_scores")
    if record is None:
        raise NoReport(
            409, f"version {version!r} keeps no dev scores (saved without them, or with fewer than 2)"
        )
    return _report(
        runtime,
        scored_from_record(record),
        version,
        str(manifest.get("log_offset", "")),
        manifest.get("dev_scored_on", "dev"),
        float(manifest["confidence_temperature"]),
        tuple(manifest["labels"]),
        readers_on_dev(manifest),
    )


def _manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as error:
        raise NoReport(409, f"the checkpoint of version {path.name!r} cannot be read: {error}") from None


def _report(
    runtime: TaskRuntime,
    raw: Scored,
    model_version: str,
    store_version: str,
    scored_by: str,
    temperature: float,
    labels: tuple[str, ...],
    readers: Readers | None,
) -> schemas.ReportOut:
    """`raw` are the scores before any confidence temperature; the report reads them at `temperature`,
    the one the scored version serves with."""
    described = report_of(raw, labels, temperature, readers)
    for suspect in described["suspect_examples"]:
        suspect["text"] = runtime.texts.get(suspect["id"])
    return schemas.ReportOut(
        task=runtime.task.name,
        model_version=model_version,
        store_version=store_version,
        scored_by=scored_by,
        min_confidence=runtime.task.min_confidence,
        **described,
    )
