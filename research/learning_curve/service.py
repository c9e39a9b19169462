"""The simulated labeller: labels one task round by round through the service's HTTP api and scores what
it serves after each round's automatic training.

A round's jobs are found in the task's job list only (the ones not there before the round's first
POST), so nothing depends on a POST saying which job it queued. The round ends when at least one new
job exists and every new job has finished, twice in a row `settle` seconds apart: a run that ends while
more examples wait is followed by one more job, and that job must not be missed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from openbook.prompting import TextInput

from research.learning_curve.schedule import CurveData, fixed_rounds, per_class, pool_ids, round_sizes
from services.bench_client import TERMINAL, BenchClient, job_summary

SUGGESTIONS_MAX = 100  # the most suggestions one request may ask for


@dataclass(frozen=True)
class Waiting:
    timeout: float = 3600.0  # seconds a round's jobs may take
    appear: float = 10.0  # seconds to wait for a job to show up before deciding none was queued
    poll: float = 0.5
    settle: float = 1.0


@dataclass
class RoundJobs:
    jobs: list[dict]  # the round's jobs, oldest first, as the job list gave them
    first_seen: dict[str, float] = field(default_factory=dict)  # model_version -> when a probe first saw it


@dataclass(frozen=True)
class ServiceRound:
    shots: int  # the round: labelled examples per class, nominally
    ids: list[int]  # every example labelled so far
    accuracy: float
    seconds: float  # from the round's first POST to its test sample scored
    service: dict  # serving version, gate verdict, jobs, seconds to served, versions that scored


def wait_for_round(
    client: BenchClient,
    task: str,
    known: set[str],
    probe: TextInput,
    last_post_at: float,
    waiting: Waiting,
    *,
    clock=time.perf_counter,
    sleep=time.sleep,
) -> RoundJobs:
    """Poll the job list until the round's jobs have finished; a one-text classify each poll records when
    each model version was first served."""
    seen: RoundJobs = RoundJobs([])
    settled_ids: list[str] | None = None
    settled_at = 0.0
    while True:
        jobs = [job for job in reversed(client.jobs(task)) if job["id"] not in known]
        now = clock()
        seen.first_seen.setdefault(client.classify(task, [probe]).model_versions[0], now)
        seen.jobs = jobs
        ids = [job["id"] for job in jobs]
        if jobs and all(job["state"] in TERMINAL for job in jobs):
            if settled_ids != ids:
                settled_ids, settled_at = ids, now
            elif now - settled_at >= waiting.settle:
                return seen
        else:
            settled_ids = None
        if not jobs and now - last_post_at >= waiting.appear:
            return seen  # the round queued nothing (fewer new examples than `every`)
        if now - last_post_at >= waiting.timeout:
            raise TimeoutError(f"{task}: the round's jobs still not finished after {waiting.timeout:.0f} s")
        sleep(waiting.poll)


def await_version(
    client: BenchClient,
    task: str,
    probe: TextInput,
    version: str,
    seen: RoundJobs,
    waiting: Waiting,
    *,
    clock=time.perf_counter,
) -> float:
    """When a probe first got `version`: the swap follows the publication by a moment, so wait for it."""
    deadline = clock() + waiting.timeout
    while version not in seen.first_seen:
        if clock() > deadline:
            raise TimeoutError(f"{task}: the serving version {version} never answered a classify")
        seen.first_seen.setdefault(client.classify(task, [probe]).model_versions[0], clock())
        time.sleep(min(waiting.poll, 0.1))
    return seen.first_seen[version]


def label_round(
    client: BenchClient, data: CurveData, task: str, order: str, planned: list[int], size: int
) -> tuple[list[int], float]:
    """Post the round's examples; (their ids, when the last POST was acknowledged). The fixed order posts
    `planned`; the uncertainty order asks for `size` suggestions (at most SUGGESTIONS_MAX a request,
    each batch labelled before the next is asked for, so no text is suggested twice)."""

    def post(ids: Sequence[int]) -> float:
        return client.add_examples(task, [(i, data.train[i].text, data.train[i].label) for i in ids])

    if order == "fixed":
        return planned, post(planned)
    labelled: list[int] = []
    last_post_at = time.perf_counter()
    while len(labelled) < size:
        suggested = client.suggestions(task, min(SUGGESTIONS_MAX, size - len(labelled)))
        if not suggested:
            break  # the pool is empty
        last_post_at = post(suggested)
        labelled += suggested
    return labelled, last_post_at


def label_and_score(
    client: BenchClient,
    data: CurveData,
    spec: dict,
    seed: int,
    order: str,
    rounds: Sequence[int],
    *,
    pool_size: int | None,
    waiting: Waiting = Waiting(),
) -> Iterator[ServiceRound]:
    """Create the task from `spec`, label it round by round in `order`, yield each round's outcome, and
    delete the task at the end (its trained versions hold memory in the api)."""
    task = spec["name"]
    probe = data.test[0].text
    plan = fixed_rounds(data.train, seed, rounds)
    sizes = round_sizes(rounds, len(data.labels))
    texts, gold = [e.text for e in data.test], [e.label for e in data.test]
    client.create_task(spec)
    try:
        if order == "uncertainty":
            pool = pool_ids(data.train, seed, plan[0], pool_size)
            client.add_to_pool(task, [(i, data.train[i].text) for i in pool])
        labelled: list[int] = []
        serving = client.serving_version(task)
        for r, shots in enumerate(rounds):
            started = time.perf_counter()
            known = {job["id"] for job in client.jobs(task)}
            new, last_post_at = label_round(
                client, data, task, "fixed" if r == 0 else order, plan[r], sizes[r]
            )
            labelled += new
            seen = wait_for_round(client, task, known, probe, last_post_at, waiting)
            previous, serving = serving, client.serving_version(task)
            to_served = None
            if serving is not None and serving != previous:
                to_served = await_version(client, task, probe, serving, seen, waiting) - last_post_at
            scored = client.classify(task, texts)
            jobs = [job_summary(job) for job in seen.jobs]
            verdicts = [job["verdict"] for job in jobs if job["verdict"] is not None]
            yield ServiceRound(
                shots=shots,
                ids=list(labelled),
                accuracy=_accuracy(scored.labels, gold),
                seconds=round(time.perf_counter() - started, 3),
                service={
                    "serving_version": serving,
                    "verdict": verdicts[-1] if verdicts else None,
                    "jobs": jobs,
                    "auto_jobs": sum(job["trigger"] == "auto" for job in jobs),
                    "seconds_to_served": None if to_served is None else round(to_served, 3),
                    "test_versions": sorted(set(scored.model_versions)),
                    # each reader of the served version alone on the same test sample (None: no book yet)
                    "alone": {
                        "prompt": _accuracy(scored.prompt_labels, gold),
                        "book": None if None in scored.book_labels else _accuracy(scored.book_labels, gold),
                    },
                    "per_class": per_class(data.train, labelled),
                },
            )
    finally:
        client.delete_task(task)


def _accuracy(predicted: Sequence[str | None], gold: Sequence[str]) -> float:
    return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)
