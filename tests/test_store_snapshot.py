"""Knowledge store snapshots: a round trip gives the same answers; a bad target or snapshot is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openbook.store_snapshot import read_snapshot, write_snapshot

DIM = 16  # the conftest stores' default dimension (`filled_store`)


def test_snapshot_round_trip_and_overwrite(tmp_path: Path, filled_store):
    store, (ids, vectors, labels) = filled_store(200, seed=16, shard_size=64)
    store.remove(ids[:10])
    queries = np.random.default_rng(17).standard_normal((10, DIM))
    snapshot = tmp_path / "snapshot"
    write_snapshot(store, snapshot, metadata={"log_offset": 1234})
    assert store.metadata == {"log_offset": 1234}
    loaded = read_snapshot(snapshot)
    assert loaded.metadata == {"log_offset": 1234} and loaded.version == store.version
    assert len(loaded) == len(store) and loaded.kind == "flat" and loaded.dim == DIM
    np.testing.assert_array_equal(loaded.ids(), store.ids())
    np.testing.assert_array_equal(loaded.labels(), store.labels())
    for a, b in [
        (store.search(queries, 7), loaded.search(queries, 7)),
        (store.search_per_label(queries, 3, 4), loaded.search_per_label(queries, 3, 4)),
    ]:
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.similarities, b.similarities)
    # Save again over the existing snapshot, with more data and without new metadata.
    loaded.add(ids[:10], vectors[:10], labels[:10])
    write_snapshot(loaded, snapshot)
    reloaded = read_snapshot(snapshot)
    assert len(reloaded) == 200 and reloaded.metadata == {"log_offset": 1234}
    np.testing.assert_array_equal(reloaded.search(queries, 5).ids, loaded.search(queries, 5).ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot"], "temp or old dirs left behind"
    manifest = json.loads((snapshot / "store.json").read_text())
    assert manifest["count"] == 200 and manifest["dim"] == DIM and manifest["kind"] == "flat"


def test_save_refuses_to_replace_a_foreign_directory(tmp_path: Path, filled_store):
    store, _ = filled_store(10, seed=18)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        write_snapshot(store, tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="JSON"):
        write_snapshot(store, tmp_path / "snap", metadata={"bad": object()})
    assert store.metadata == {} and not (tmp_path / "snap").exists()


def test_load_missing_or_corrupt_snapshot_raises(tmp_path: Path, filled_store):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_snapshot(tmp_path / "nowhere")
    store, _ = filled_store(100, seed=19, shard_size=32)
    write_snapshot(store, tmp_path / "snap")
    (tmp_path / "snap" / "index_0001.faiss").write_bytes(b"not a faiss index")
    with pytest.raises(ValueError, match="snap"):
        read_snapshot(tmp_path / "snap")
    write_snapshot(store, tmp_path / "snap2")
    (tmp_path / "snap2" / "store.json").write_text("{ truncated")
    with pytest.raises(ValueError, match="snap2"):
        read_snapshot(tmp_path / "snap2")
    write_snapshot(store, tmp_path / "snap3")
    np.save(tmp_path / "snap3" / "ids.npy", np.arange(5))
    with pytest.raises(ValueError, match="snap3"):
        read_snapshot(tmp_path / "snap3")
    write_snapshot(store, tmp_path / "snap4")  # right lengths, but ids assigned to the wrong shards
    np.save(tmp_path / "snap4" / "index_of.npy", np.zeros(len(store), dtype=np.int64))
    with pytest.raises(ValueError, match="snap4"):
        read_snapshot(tmp_path / "snap4")


def test_a_snapshot_of_another_format_version_is_refused(tmp_path: Path, filled_store):
    store, _ = filled_store(10, seed=20)
    write_snapshot(store, tmp_path / "snap")
    manifest_path = tmp_path / "snap" / "store.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] += 1  # written by a newer release
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"unsupported format_version {manifest['format_version']}"):
        read_snapshot(tmp_path / "snap")


def test_texts_round_trip_and_a_store_without_them_writes_none(tmp_path: Path, filled_store):
    store, (ids, vectors, labels) = filled_store(20, seed=21, shard_size=8)
    store.add(ids[:3], vectors[:3], labels[:3], texts=["a", ("pair a", "pair b"), "ünïcode"])
    write_snapshot(store, tmp_path / "snap")
    loaded = read_snapshot(tmp_path / "snap")
    assert loaded.texts_of(ids[:3]) == ["a", ("pair a", "pair b"), "ünïcode"]
    with pytest.raises(KeyError, match="without its text"):
        loaded.texts_of(ids[3:4])
    # A store no text was given to writes no texts file, and loads with none.
    bare, _ = filled_store(20, seed=21, shard_size=8)
    write_snapshot(bare, tmp_path / "bare")
    assert json.loads((tmp_path / "bare" / "store.json").read_text())["texts_file"] is None
    assert not (tmp_path / "bare" / "texts.json").exists()
    loaded_bare = read_snapshot(tmp_path / "bare")
    assert len(loaded_bare) == len(bare) and loaded_bare.export_state().texts == {}
    # Texts for an id the store does not hold mean the parts disagree.
    write_snapshot(store, tmp_path / "bad")
    (tmp_path / "bad" / "texts.json").write_text(json.dumps({"ids": [10**6], "texts": ["x"]}))
    with pytest.raises(ValueError, match="texts are stored for ids the store does not hold"):
        read_snapshot(tmp_path / "bad")
