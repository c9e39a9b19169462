"""The example log on a real server: the embedded valkey-server with AOF `appendfsync always`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis
from openbook.classifier import Classifier
from openbook.prompting import Template, Verbalizer

from services.bus.examples_log import ConflictError, ExampleLog, Folded, NewExample, fold
from services.bus.server import EmbeddedRedis
from services.engine.replay import replay


@pytest.fixture()
def server(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


@pytest.fixture()
def log(server: EmbeddedRedis) -> ExampleLog:
    return ExampleLog(redis.Redis.from_url(server.url), "reviews")


def test_append_assigns_ids_and_a_retry_is_idempotent(log: ExampleLog) -> None:
    first = log.append([NewExample("a good film", "1", id=10), NewExample("a bad film", "0")])
    assert [a.id for a in first] == [10, 1] and all(a.offset for a in first)
    retry = log.append([NewExample("a good film", "1", id=10)])
    assert retry[0].id == 10 and retry[0].offset is None  # already there: nothing appended
    entries = log.read()
    assert [(e.op, e.id, e.text, e.label) for e in entries] == [
        ("add", 10, "a good film", "1"),
        ("add", 1, "a bad film", "0"),
    ]
    assert len(log) == 2


def test_a_changed_id_is_a_conflict_and_the_batch_writes_nothing(log: ExampleLog) -> None:
    log.append([NewExample("a good film", "1", id=10)])
    with pytest.raises(ConflictError, match="10"):
        log.append([NewExample("new text", "0", id=11), NewExample("a good film", "0", id=10)])
    assert [e.id for e in log.read()] == [10] and len(log) == 1
    with pytest.raises(ValueError, match="repeats"):
        log.append([NewExample("x", "0", id=5), NewExample("y", "1", id=5)])
    with pytest.raises(ValueError, match="outside"):
        log.append([NewExample("x", "0", id=-1)])


def test_pairs_and_deletes_round_trip_and_read_after_an_offset(log: ExampleLog) -> None:
    (added,) = log.append([NewExample(("a premise", "a hypothesis"), "entailment", id=3)])
    assert log.delete(3) is True and log.delete(3) is False
    entries = log.read()
    assert entries[0].text == ("a premise", "a hypothesis")
    assert [(e.op, e.id) for e in entries] == [("add", 3), ("delete", 3)]
    assert [e.op for e in log.read(after=added.offset)] == ["delete"]
    log.append([NewExample("back again", "x", id=3)])  # a deleted id may be used again
    assert log.read()[-1].text == "back again"


def test_acknowledged_examples_survive_a_server_crash(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    server = EmbeddedRedis(data).start()
    ExampleLog(redis.Redis.from_url(server.url), "t").append(
        [NewExample(f"text {i}", "0") for i in range(50)]
    )
    server.kill()  # SIGKILL: no shutdown save, only the fsynced AOF
    with EmbeddedRedis(data) as restarted:
        entries = ExampleLog(redis.Redis.from_url(restarted.url), "t").read()
    assert [e.text for e in entries] == [f"text {i}" for i in range(50)]


def test_replay_builds_the_same_store_as_the_requests(log: ExampleLog, causal_backbone) -> None:
    def classifier() -> Classifier:
        return Classifier(causal_backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))

    log.append([NewExample("a good film", "1", id=1), NewExample("a bad film", "0", id=2)])
    log.append([NewExample("great fun", "1", id=3)])
    log.delete(2)
    log.append([NewExample("boring", "0", id=4)])
    replica = classifier()
    assert replay(replica, log.read()) == log.read()[-1].offset
    direct = classifier()
    direct.add_examples(["a good film", "great fun", "boring"], ["1", "1", "0"], ids=[1, 3, 4])
    assert replica.store.ids().tolist() == direct.store.ids().tolist() == [1, 3, 4]
    np.testing.assert_allclose(
        replica.store.vectors_of([1, 3, 4]), direct.store.vectors_of([1, 3, 4]), atol=1e-6
    )


def test_the_log_folds_to_each_ids_last_entry(log: ExampleLog) -> None:
    """`fold`, the one fold of the log that the worker, replay and a replica's texts all read."""
    log.append([NewExample("a good film", "1", id=1), NewExample("a bad film", "0", id=2)])
    first = log.read()[-1].offset
    log.delete(1)
    log.append([NewExample("great fun", "1", id=3)])
    assert log.relabel(NewExample("a bad film", "1", id=2), "0")  # a tombstone and the add again
    log.delete(3)
    log.append([NewExample("a good film, again", "0", id=1)])  # a deleted id used again
    whole = log.examples()
    assert whole.examples == {2: ("a bad film", "1"), 1: ("a good film, again", "0")}
    assert whole.offset == log.read()[-1].offset and whole.deleted == frozenset({3})  # 1: added again
    since = fold(log.read(after=first))  # what a replica that applied the first batch still has to apply
    assert since.examples == whole.examples and since.deleted == frozenset({3})
    assert fold([]) == Folded() and Folded().offset is None
