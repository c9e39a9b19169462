"""Every HTTP call the benchmarks make through the service (`openbook bench job`, the lab's learning
curve), in one class: the service's contract in one place, and how they read a job.

The bodies are plain JSON rather than the typed client's schemas (services/client.py) so that a field
the api adds or renames changes this file only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from openbook.prompting import TextInput

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})  # a job's states once it has ended


def job_summary(job: dict) -> dict:
    """What a benchmark records of a job: its trigger and outcome, the version it published and the
    gate's verdict and dev scores."""
    published, gate = job.get("published") or {}, job.get("gate") or {}
    return {
        "id": job["id"],
        "state": job["state"],
        "trigger": job.get("trigger"),
        "version": published.get("version"),
        "verdict": gate.get("verdict"),
        # the gate's dev scores: candidate, serving, and how many dev examples they rest on
        "gate": {k: gate.get(k) for k in ("candidate", "serving", "dev")} if gate else None,
        "error": job.get("error"),
    }


@dataclass(frozen=True)
class Scored:
    labels: list[str]  # predicted, in the order of the texts
    model_versions: list[str]  # each response's model_version, in order
    # each reader alone, in the same order: the prompt's most likely label (p_lm), the book's (p_knn; None
    # where the response had none: an empty store)
    prompt_labels: list[str] = field(default_factory=list)
    book_labels: list[str | None] = field(default_factory=list)


class BenchClient:
    def __init__(self, base_url: str, *, max_batch: int, timeout: float = 600.0) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=timeout)
        self.max_batch = max_batch  # texts per classify, examples or pool texts per POST

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def _batches(self, items: Sequence[Any]) -> list[Sequence[Any]]:
        return [items[start : start + self.max_batch] for start in range(0, len(items), self.max_batch)]

    def create_task(self, spec: dict) -> None:
        self._call("POST", "/v1/tasks", json=spec)

    def delete_task(self, task: str) -> None:
        self.http.delete(f"/v1/tasks/{task}")

    def add_examples(self, task: str, examples: Sequence[tuple[int, TextInput, str]]) -> float:
        """(id, text, label) in as few POSTs as the batch limit allows; the time the last was acknowledged."""
        for batch in self._batches(examples):
            body = [{"id": i, "text": text, "label": label} for i, text, label in batch]
            self._call("POST", f"/v1/tasks/{task}/examples", json={"examples": body})
        return time.perf_counter()

    def add_to_pool(self, task: str, texts: Sequence[tuple[int, TextInput]]) -> None:
        for batch in self._batches(texts):
            body = [{"id": i, "text": text} for i, text in batch]
            self._call("POST", f"/v1/tasks/{task}/pool", json={"texts": body})

    def suggestions(self, task: str, n: int) -> list[int]:
        """The pool ids of the `n` texts the served version is least sure of, least sure first."""
        answer = self._call("GET", f"/v1/tasks/{task}/suggestions", params={"n": n})
        return [suggestion["id"] for suggestion in answer["suggestions"]]

    def jobs(self, task: str, limit: int = 50) -> list[dict]:
        """The task's jobs, newest first: id, state, trigger, published, gate, ..."""
        answer = self._call("GET", f"/v1/tasks/{task}/jobs", params={"limit": limit})
        return answer["jobs"] if isinstance(answer, dict) else answer

    def serving_version(self, task: str) -> str | None:
        return self._call("GET", f"/v1/tasks/{task}/versions")["serving"]

    def versions(self, task: str) -> list[dict]:
        """The task's model versions, newest first: version, examples, dev_metrics, gate, ..."""
        return self._call("GET", f"/v1/tasks/{task}/versions")["versions"]

    def classify(self, task: str, texts: Sequence[TextInput]) -> Scored:
        labels, versions, prompt, book = [], [], [], []
        for batch in self._batches(texts):
            answer = self._call("POST", f"/v1/tasks/{task}/classify", json={"texts": list(batch)})
            for prediction in answer["predictions"]:
                labels.append(prediction["label"])
                prompt.append(_most_likely(prediction["p_lm"]))
                book.append(None if prediction.get("p_knn") is None else _most_likely(prediction["p_knn"]))
            versions.append(answer["model_version"])
        return Scored(labels, versions, prompt, book)

    def close(self) -> None:
        self.http.close()


def _most_likely(distribution: dict[str, float]) -> str:
    return max(distribution, key=distribution.__getitem__)
