"""The replica's runtimes over the task specs: a spec that reads but cannot be built here breaks its own
task only, and a task deleted here leaves the replica's cache at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from services.bus.keys import TASKS_KEY
from services.bus.server import EmbeddedRedis
from services.engine.backbones import Backbones
from services.engine.runtimes import Runtimes
from services.engine.specs import BrokenTask, TaskSpecs
from services.engine.task_spec import Task
from tests.services.harness import TASK


@pytest.fixture
def runtimes(server: EmbeddedRedis, causal_dir: Path) -> Runtimes:
    backbones = Backbones(max_length=48, device="cpu", default_backbone=str(causal_dir))
    specs = TaskSpecs(redis.Redis.from_url(server.url), backbones)
    specs.create(Task(**{**TASK, "backbone": str(causal_dir)}))
    return Runtimes(specs)


def test_a_spec_that_reads_but_cannot_be_built_here_breaks_only_its_task(runtimes: Runtimes) -> None:
    # Stored by a replica that may load another backbone: the spec is valid, this replica cannot serve it.
    elsewhere = Task(**{**TASK, "name": "elsewhere", "backbone": "/models/only-on-another-replica"})
    runtimes.specs.client.hset(TASKS_KEY, "elsewhere", elsewhere.model_dump_json())
    with pytest.raises(BrokenTask, match="unknown backbone"):
        runtimes.runtime("elsewhere")
    assert runtimes.specs.get("elsewhere") == elsewhere  # the spec itself reads
    assert runtimes.specs.survey()[1] == {}
    tasks, broken = runtimes.survey()
    assert [t.name for t in tasks] == ["elsewhere", "reviews"] and list(broken) == ["elsewhere"]
    assert "unknown backbone" in broken["elsewhere"]
    assert runtimes.runtime("reviews") is not None  # the other task is served


def test_a_task_deleted_here_leaves_the_cache_and_comes_back_as_another(runtimes: Runtimes, tmp_path) -> None:
    first = runtimes.runtime("reviews")
    assert first is not None and runtimes.cached_runtime("reviews") is first
    assert runtimes.delete("reviews", tmp_path) and "reviews" not in runtimes.loaded
    assert runtimes.specs.current("reviews") == (None, b"1")  # the name's first task was deleted
    assert runtimes.runtime("reviews") is None
    runtimes.specs.create(first.task)  # the very same spec again: another task
    again = runtimes.runtime("reviews")
    assert again is not None and again is not first and again.generation == b"1"
    assert not runtimes.delete("nothing", tmp_path)
