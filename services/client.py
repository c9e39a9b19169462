"""A small typed client for the OpenBook api (httpx underneath).

with OpenBookClient("http://127.0.0.1:8000") as client:
    client.create_task("sentiment", "Review: {text}\\nSentiment: {mask}", {"0": "negative", "1": "positive"})
    client.add_examples("sentiment", [ExampleIn(text="A delight.", label="1", id=1)])
    print(client.classify("sentiment", ["What a lovely film."]).predictions[0].label)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from services.api import schemas


def wait_ready(base_url: str, *, timeout: float = 120.0, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll `/readyz` until the api answers 200 (True), or `timeout` passes or `alive()` turns False."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    return False


def _labels_body(labels: Mapping[str, str] | Sequence[str]) -> Any:
    """Labels as the api's schemas take them: the object of label -> word, or the list of names."""
    return dict(labels) if isinstance(labels, Mapping) else list(labels)


class OpenBookError(RuntimeError):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class OpenBookClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        http: httpx.Client | None = None,  # e.g. FastAPI's TestClient
    ) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self.http.headers.update(headers)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise OpenBookError(response.status_code, detail)
        return None if response.status_code == 204 else response.json()

    def create_task(
        self, name: str, template: str, labels: Mapping[str, str] | Sequence[str], **options: Any
    ) -> schemas.Task:
        """`labels`: label -> word, or label names alone, each scored by its readable word
        (`book_flight` -> "book flight")."""
        body = schemas.TaskCreate(name=name, template=template, labels=_labels_body(labels), **options)
        return schemas.Task.model_validate(self._call("POST", "/v1/tasks", json=body.model_dump()))

    def add_label(self, task: str, label: str, word: str | None = None) -> schemas.Task:
        """One more label, scored by `word` (None: its name made readable)."""
        body = schemas.LabelIn(label=label, word=word).model_dump(exclude_none=True)
        return schemas.Task.model_validate(self._call("POST", f"/v1/tasks/{task}/labels", json=body))

    def add_labels(self, task: str, labels: Mapping[str, str] | Sequence[str]) -> schemas.Task:
        """More labels, all or none: label -> word, or label names alone."""
        body = {"labels": _labels_body(labels)}
        return schemas.Task.model_validate(self._call("POST", f"/v1/tasks/{task}/labels", json=body))

    def remove_label(self, task: str, label: str) -> schemas.Task:
        path = f"/v1/tasks/{task}/labels/{quote(label, safe='')}"
        return schemas.Task.model_validate(self._call("DELETE", path))

    def update_training(self, task: str, **settings: Any) -> schemas.Task:
        """Change the task's training settings (`schemas.TrainingSettings`' fields); the others stay."""
        body = {"training": schemas.TrainingPatch(**settings).model_dump(exclude_unset=True)}
        return schemas.Task.model_validate(self._call("PATCH", f"/v1/tasks/{task}", json=body))

    def add_examples(
        self, task: str, examples: Sequence[schemas.ExampleIn], *, create_labels: bool = False
    ) -> schemas.ExamplesAck:
        """Add examples, all or none; with `create_labels`, the labels they name that the task lacks are
        added with them, each scored by its name made readable."""
        body = schemas.ExamplesIn(examples=list(examples), create_labels=create_labels).model_dump()
        return schemas.ExamplesAck.model_validate(self._call("POST", f"/v1/tasks/{task}/examples", json=body))

    def delete_example(self, task: str, example_id: int) -> None:
        self._call("DELETE", f"/v1/tasks/{task}/examples/{example_id}")

    def relabel_example(self, task: str, example_id: int, label: str) -> schemas.Relabelled:
        body = schemas.RelabelIn(label=label).model_dump()
        path = f"/v1/tasks/{task}/examples/{example_id}"
        return schemas.Relabelled.model_validate(self._call("PATCH", path, json=body))

    def set_min_confidence(self, task: str, min_confidence: float | None) -> schemas.Task:
        """Below this probability of their best label, the task's predictions abstain (None: never)."""
        body = schemas.TaskPatch(min_confidence=min_confidence).model_dump(exclude_unset=True)
        return schemas.Task.model_validate(self._call("PATCH", f"/v1/tasks/{task}", json=body))

    def classify(
        self,
        task: str,
        texts: Sequence[schemas.TextOrPair],
        *,
        neighbours: bool = False,
        min_confidence: float | None = None,
    ) -> schemas.ClassifyOut:
        """Predictions; with `min_confidence`, those less sure abstain (label None). Without it, the
        task's own `min_confidence` applies."""
        body = schemas.ClassifyIn(texts=list(texts), neighbours=neighbours, min_confidence=min_confidence)
        payload = body.model_dump(exclude={"min_confidence"} if min_confidence is None else set())
        return schemas.ClassifyOut.model_validate(
            self._call("POST", f"/v1/tasks/{task}/classify", json=payload)
        )

    def report(self, task: str, version: str | None = None) -> schemas.ReportOut:
        """The task's quality report: of the version it serves, or of a recorded `version`."""
        params = {} if version is None else {"version": version}
        return schemas.ReportOut.model_validate(self._call("GET", f"/v1/tasks/{task}/report", params=params))

    def train(self, task: str, **options: Any) -> schemas.JobOut:
        """Queue a job with the `options` given (TrainIn's fields); the task's `training` settings give
        the rest, as the api applies them."""
        body = schemas.TrainIn(**options).model_dump(exclude_unset=True)
        return schemas.JobOut.model_validate(self._call("POST", f"/v1/tasks/{task}/train", json=body))

    def job(self, job_id: str) -> schemas.JobOut:
        return schemas.JobOut.model_validate(self._call("GET", f"/v1/jobs/{job_id}"))

    def versions(self, task: str) -> schemas.VersionsOut:
        return schemas.VersionsOut.model_validate(self._call("GET", f"/v1/tasks/{task}/versions"))

    def promote(self, task: str, version: str) -> schemas.VersionOut:
        """Serve `version` on every replica (a rollback when it is older)."""
        path = f"/v1/tasks/{task}/versions/{version}/promote"
        return schemas.VersionOut.model_validate(self._call("POST", path))

    def pin(self, task: str, version: str, pinned: bool = True) -> schemas.VersionOut:
        body = schemas.PinIn(pinned=pinned).model_dump()
        path = f"/v1/tasks/{task}/versions/{version}"
        return schemas.VersionOut.model_validate(self._call("PATCH", path, json=body))

    def jobs(self, task: str, limit: int = 20) -> list[schemas.JobOut]:
        """The task's jobs, newest first."""
        jobs = self._call("GET", f"/v1/tasks/{task}/jobs", params={"limit": limit})
        return [schemas.JobOut.model_validate(job) for job in jobs]

    def wait_for_job(self, job_id: str, timeout: float = 600.0, poll: float = 0.5) -> schemas.JobOut:
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id)).state in ("queued", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout} s")
            time.sleep(poll)
        return job

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenBookClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
