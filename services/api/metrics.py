"""Prometheus metrics, one registry per app (so several apps in one process never share counters).

With several api workers (services/api/api_workers.py) the counters and histograms are kept in
prometheus-client's multiprocess files, and a scrape of any worker sums them over every worker the run
has had (a restarted worker's counts stay in the totals: counters never go down). The task gauges are
read at scrape time by the worker that answers, never written to those files: jobs and artifact bytes
come from Redis and the disk, the same for every worker, so a sum would count them N times; store sizes
and versions are that worker's, which the others converge to through the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from services.bus.versions import directory_bytes
from services.engine.runtimes import Runtimes


class TaskCollector(Collector):
    """Store sizes, versions, artifacts on disk and jobs by state, read at scrape time."""

    def __init__(self, runtimes: Runtimes, artifacts_dir: Path) -> None:
        self.runtimes = runtimes
        self.artifacts_dir = artifacts_dir

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        sizes = GaugeMetricFamily("openbook_store_examples", "examples in the task's store", labels=["task"])
        versions = InfoMetricFamily("openbook_task_version", "versions a task serves", labels=["task"])
        for name, runtime in list(self.runtimes.loaded.items()):
            sizes.add_metric([name], len(runtime.classifier.store))
            versions.add_metric([name], {"model": runtime.model_version, "store": runtime.offset})
        yield sizes
        yield versions
        artifacts = GaugeMetricFamily(
            "openbook_artifacts_bytes", "bytes of the task's checkpoint directories on disk", labels=["task"]
        )
        for name in list(self.runtimes.loaded):
            artifacts.add_metric([name], directory_bytes(self.artifacts_dir / name))
        yield artifacts
        jobs = GaugeMetricFamily("openbook_jobs", "training jobs by state", labels=["state"])
        counts: dict[str, int] = {}
        try:
            for key in self.runtimes.specs.client.scan_iter(match="openbook:job:*", count=500):
                # A reply is bytes (services/bus/replies.py)
                raw_state = cast("bytes | None", self.runtimes.specs.client.hget(key, "state"))
                if raw_state is not None:
                    counts[raw_state.decode()] = counts.get(raw_state.decode(), 0) + 1
        except redis.ConnectionError:
            return  # Redis is away: the other metrics still answer
        for state, count in sorted(counts.items()):
            jobs.add_metric([state], count)
        yield jobs


class Metrics:
    def __init__(self, *, across_processes: bool = False) -> None:
        """`across_processes`: a scrape sums every worker's multiprocess files (PROMETHEUS_MULTIPROC_DIR)."""
        self.registry = CollectorRegistry()
        self.scraped = self.registry  # what a scrape reads
        if across_processes:
            self.scraped = CollectorRegistry()
            MultiProcessCollector(self.scraped)
        self.latency = Histogram(
            "openbook_request_seconds",
            "request latency",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.batch_size = Histogram(
            "openbook_classify_batch_texts",
            "texts per classify request",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.forward_size = Histogram(
            "openbook_forward_batch_texts",
            "texts per backbone forward (micro-batched requests)",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.jobs = Counter(
            "openbook_jobs_submitted", "training jobs submitted", ["task"], registry=self.registry
        )

    def watch(self, runtimes: Runtimes, artifacts_dir: Path) -> None:
        self.scraped.register(TaskCollector(runtimes, artifacts_dir))

    def exposition(self) -> bytes:
        return generate_latest(self.scraped)
