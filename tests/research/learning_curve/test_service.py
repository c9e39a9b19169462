"""The labeller's wait for a round's automatic jobs, against a scripted job list (no service needed)."""

from __future__ import annotations

import pytest

from research.learning_curve.service import Waiting, wait_for_round
from services.bench_client import Scored, job_summary


class ScriptedService:
    """Answers the job list and the probe classify from a script, one step per poll; time moves on sleep."""

    def __init__(self, script: list[tuple[list[dict], str]]) -> None:
        self.script, self.polls, self.now = script, 0, 0.0

    def jobs(self, task: str) -> list[dict]:
        return self.script[min(self.polls, len(self.script) - 1)][0]

    def classify(self, task: str, texts: list[str]) -> Scored:
        version = self.script[min(self.polls, len(self.script) - 1)][1]
        self.polls += 1
        return Scored(["0"] * len(texts), [version])

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _job(job_id: str, state: str, version: str | None = None, verdict: str | None = None) -> dict:
    return {
        "id": job_id,
        "state": state,
        "trigger": "auto",
        "published": {"version": version} if version else None,
        "gate": {"verdict": verdict} if verdict else None,
    }


OLD = _job("old", "succeeded", "v0", "first")
WAITING = Waiting(timeout=60.0, appear=5.0, poll=0.5, settle=1.0)


def _wait(service: ScriptedService, waiting: Waiting = WAITING):
    return wait_for_round(
        service, "t", {"old"}, "probe", 0.0, waiting, clock=service.clock, sleep=service.sleep
    )  # type: ignore[arg-type]


def test_a_job_queued_after_the_first_one_finished_is_waited_for_too() -> None:
    j1_done = _job("j1", "succeeded", "v1", "promoted")
    service = ScriptedService(
        [
            ([OLD], "v0"),
            ([_job("j1", "running"), OLD], "v0"),
            ([j1_done, OLD], "v1"),  # all finished: not yet the end
            ([_job("j2", "queued"), j1_done, OLD], "v1"),  # growth during the run: one more job
            ([_job("j2", "running"), j1_done, OLD], "v1"),
            ([_job("j2", "succeeded", "v2", "rejected"), j1_done, OLD], "v1"),
        ]
    )
    seen = _wait(service)
    assert [job["id"] for job in seen.jobs] == ["j1", "j2"]  # the round's jobs, oldest first
    assert [job_summary(job)["verdict"] for job in seen.jobs] == ["promoted", "rejected"]
    assert seen.first_seen == {"v0": 0.0, "v1": 1.0}  # when a probe first got each version
    assert service.now >= 2.5 + WAITING.settle  # it watched the finished list for `settle` seconds


def test_a_round_that_queued_nothing_ends_after_the_grace_period() -> None:
    service = ScriptedService([([OLD], "v0")])
    seen = _wait(service)
    assert seen.jobs == [] and WAITING.appear <= service.now < WAITING.appear + 1


def test_jobs_that_never_finish_time_out() -> None:
    service = ScriptedService([([_job("j1", "running"), OLD], "v0")])
    with pytest.raises(TimeoutError, match="not finished after 60 s"):
        _wait(service)
