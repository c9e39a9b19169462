"""Two api workers behind one port (`openbook serve`, OPENBOOK_API_WORKERS=2) on the tiny backbone and a
real Redis: readiness counts both, both serve, /metrics sums them, and what one changes reaches both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from httpx import Response

from services.api.api_workers import ApiWorkerSet, open_worker_set
from services.bus.server import EmbeddedRedis, free_port
from services.trainer.worker import Worker
from tests.services.harness import TASK, TRAINING_EXAMPLES, wait_for

TIMEOUT = 60  # a first request for a task loads its model: slow on a busy machine
CLASSIFIED = 'openbook_request_seconds_count{method="POST",route="/v1/tasks/{task}/classify",status="200"} '


@dataclass
class Workers:
    process: subprocess.Popen
    base: str
    bus: EmbeddedRedis
    artifacts: Path
    log: Path

    def ready(self) -> dict | None:
        try:
            response = httpx.get(f"{self.base}/readyz", timeout=5)
        except httpx.TransportError:
            return None
        return response.json() if response.status_code == 200 else None

    def pids(self) -> list[int]:
        return [worker["pid"] for worker in wait_for(self.ready, 120)["api_workers"]]

    def call(self, method: str, path: str, body: dict | None = None) -> Response:
        """One request on a new connection: the kernel hands it to either worker."""
        return httpx.request(method, f"{self.base}{path}", json=body, timeout=TIMEOUT)

    def each_worker(self, method: str, path: str, body: dict | None = None) -> dict[int, list[Response]]:
        """Send the request on a new connection each time until every worker has answered it at least once
        (for up to TIMEOUT seconds: a worker busy elsewhere leaves every accept to the other meanwhile); the
        answers by the pid that gave them (the X-OpenBook-Worker header)."""
        pids = self.pids()
        answers: dict[int, list[Response]] = defaultdict(list)
        deadline = time.monotonic() + TIMEOUT
        while True:
            response = self.call(method, path, body)
            answers[int(response.headers["x-openbook-worker"])].append(response)
            if set(answers) >= set(pids):
                return answers
            if time.monotonic() > deadline:
                sent = sum(map(len, answers.values()))
                raise AssertionError(
                    f"{sent} new connections reached only the workers {sorted(answers)} of {pids}"
                )
            time.sleep(0.01)

    def classify(self, task: str = "reviews") -> dict[int, list[dict]]:
        answers = self.each_worker("POST", f"/v1/tasks/{task}/classify", {"texts": ["a good film"]})
        return {pid: [_ok(r) for r in responses] for pid, responses in answers.items()}

    def classify_count(self) -> float:
        lines = self.call("GET", "/metrics").text.splitlines()
        return sum(float(line.removeprefix(CLASSIFIED)) for line in lines if line.startswith(CLASSIFIED))


def _ok(response: Response) -> dict:
    assert response.status_code in (200, 202), response.text
    return response.json()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, causal_dir: Path) -> Iterator[Workers]:
    root = tmp_path_factory.mktemp("workers")
    port = free_port()
    with EmbeddedRedis(root / "redis") as bus:
        env = {
            **os.environ,
            "OPENBOOK_REDIS_URL": bus.url,
            "OPENBOOK_DEFAULT_BACKBONE": str(causal_dir),
            "OPENBOOK_MAX_LENGTH": "48",
            "OPENBOOK_PORT": str(port),
            "OPENBOOK_API_WORKERS": "2",
            "OPENBOOK_THREADS": "1",
            "OPENBOOK_ARTIFACTS_DIR": str(root / "artifacts"),
        }
        log = root / "serve.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its workers too can be stopped as a group if it hangs
            )
        served = Workers(process, f"http://127.0.0.1:{port}", bus, root / "artifacts", log)
        try:
            wait_for(lambda: process.poll() is not None or served.ready(), 120)
            assert process.poll() is None, log.read_text()[-3000:]
            assert served.call("POST", "/v1/tasks", TASK).status_code == 201
            yield served
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                raise
        assert code == 0, log.read_text()[-3000:]


def test_both_workers_serve_and_metrics_sum_over_them(workers: Workers) -> None:
    before = workers.classify_count()
    answers = workers.classify()
    sent = sum(len(responses) for responses in answers.values())
    assert len(answers) == 2 and all(answers.values())  # so each worker answered fewer than `sent`
    # A worker counts a request once it has answered it: wait for the last count to land.
    wait_for(lambda: workers.classify_count() - before == sent, 10)


def test_readyz_answers_for_both_workers_from_either(workers: Workers) -> None:
    answers = workers.each_worker("GET", "/readyz")
    pids = sorted(answers)
    for responses in answers.values():
        for response in responses:
            assert response.status_code == 200
            assert response.json()["api_workers"] == [{"pid": pid, "ready": True} for pid in pids]


def test_a_label_added_on_one_worker_is_served_by_both(workers: Workers) -> None:
    assert workers.call("POST", "/v1/tasks", {**TASK, "name": "grows"}).status_code == 201
    workers.classify("grows")  # both workers load the task
    response = workers.call("POST", "/v1/tasks/grows/labels", {"label": "2", "word": "okay"})
    assert response.status_code == 201, response.text
    for answers in workers.classify("grows").values():
        assert all(set(answer["predictions"][0]["probabilities"]) == {"0", "1", "2"} for answer in answers)


def test_a_deleted_task_is_gone_from_both(workers: Workers) -> None:
    assert workers.call("POST", "/v1/tasks", {**TASK, "name": "doomed"}).status_code == 201
    workers.classify("doomed")  # both workers load the task
    assert workers.call("DELETE", "/v1/tasks/doomed").status_code == 204
    answers = workers.each_worker("POST", "/v1/tasks/doomed/classify", {"texts": ["a good film"]})
    assert {response.status_code for responses in answers.values() for response in responses} == {404}


def test_a_published_checkpoint_is_swapped_in_on_both(workers: Workers) -> None:
    examples = [{"text": text, "label": label, "id": i} for i, (text, label) in enumerate(TRAINING_EXAMPLES)]
    assert workers.call("POST", "/v1/tasks/reviews/examples", {"examples": examples}).status_code == 201
    train = {"method": "prompt-ft", "steps": 2, "batch_size": 4, "eval_every": 2, "force": True}
    job = _ok(workers.call("POST", "/v1/tasks/reviews/train", train))
    worker = Worker(redis.Redis.from_url(workers.bus.url), workers.artifacts, max_length=48)
    assert worker.run_once(block_ms=100) == job["id"]
    version = _ok(workers.call("GET", f"/v1/jobs/{job['id']}"))["published"]["version"]

    def both_serve_it() -> bool:
        answers = workers.classify()
        return all(answers[pid][-1]["model_version"] == version for pid in answers)

    wait_for(both_serve_it, 60)


def test_readyz_waits_for_a_restarted_worker(workers: Workers) -> None:
    killed, survivor = workers.pids()
    os.kill(killed, signal.SIGKILL)  # uvicorn starts another in its place

    def not_ready() -> dict | None:
        response = workers.call("GET", "/readyz")
        return response.json() if response.status_code == 503 else None

    body = wait_for(not_ready, 30)
    assert body["reason"] == "1 of 2 api workers ready"
    assert [w["pid"] for w in body["api_workers"] if w["ready"]] == [survivor]
    back = wait_for(workers.ready, 120)["api_workers"]
    assert len(back) == 2 and killed not in {w["pid"] for w in back} and survivor in {w["pid"] for w in back}


def test_a_pool_drops_workers_that_are_gone(tmp_path: Path) -> None:
    open_worker_set(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "ready" / f"{gone.pid}.json").write_text(f'{{"pid": {gone.pid}, "ready": true}}')
    board = ApiWorkerSet(tmp_path, size=2)
    board.announce(ready=True)
    assert board.members(own_ready=False) == [{"pid": os.getpid(), "ready": False}]
    assert not (tmp_path / "ready" / f"{gone.pid}.json").exists()
    board.leave()
    assert not list((tmp_path / "ready").iterdir())


@pytest.mark.parametrize("command", ["up", "serve"])
def test_the_api_workers_flag_sets_the_setting(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.api.settings import Settings
    from services.cli import main

    monkeypatch.setenv("OPENBOOK_API_WORKERS", "1")  # and restored after
    monkeypatch.setattr(f"services.cli.{command}.run", lambda args: Settings().api_workers)
    assert main([command, "--api-workers", "3"]) == 3
