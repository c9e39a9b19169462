"""Checkpoint directories: round trip, atomic replacement, and every kind of damage caught on load."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from openbook import artifacts
from openbook.artifacts import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    STORE_DIR,
    WEIGHTS_NAME,
    CheckpointError,
    load_checkpoint,
    sha256_bytes,
    sha256_file,
    verify_checkpoint,
    write_checkpoint,
)
from openbook.store import KnowledgeStore

DIM = 8
MANIFEST: dict[str, Any] = {"method": "dart", "config": {"num_tokens": 4, "lr": 0.01}, "backbone": "tiny"}


def make_store(seed: int = 0) -> KnowledgeStore:
    rng = np.random.default_rng(seed)
    store = KnowledgeStore(DIM)
    store.add(np.array([3, 11, 42, 7, 19]), rng.standard_normal((5, DIM)), np.array([0, 1, 1, 0, 2]))
    store.metadata = {"source": "test"}
    return store


def make_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "prompt": torch.randn(4, DIM, generator=generator).requires_grad_(),
        "projection": torch.randn(DIM, 3, generator=generator).t(),  # not contiguous
        "label_ids": torch.arange(6, dtype=torch.int64),
    }


def files_on_disk(root: Path) -> dict[str, bytes]:
    return {
        entry.relative_to(root).as_posix(): entry.read_bytes() for entry in root.rglob("*") if entry.is_file()
    }


def edit_manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    change(manifest)
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "ckpt", tensors=make_tensors(), store=make_store(), manifest=MANIFEST)


def test_round_trip_restores_tensors_store_and_manifest(tmp_path: Path, checkpoint: Path) -> None:
    tensors, store = make_tensors(), make_store()
    loaded = load_checkpoint(checkpoint)

    assert checkpoint == tmp_path / "ckpt" and loaded.path == checkpoint
    assert loaded.tensors.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert torch.equal(loaded.tensors[name], tensor.detach()), name
        assert loaded.tensors[name].dtype == tensor.dtype
    np.testing.assert_array_equal(loaded.store.ids(), store.ids())
    np.testing.assert_array_equal(loaded.store.labels(), store.labels())
    assert loaded.store.metadata == {"source": "test"}
    queries = np.random.default_rng(1).standard_normal((3, DIM))
    expected, actual = store.search(queries, k=4), loaded.store.search(queries, k=4)
    np.testing.assert_array_equal(actual.ids, expected.ids)
    np.testing.assert_array_equal(actual.labels, expected.labels)
    np.testing.assert_array_equal(actual.similarities, expected.similarities)

    assert loaded.manifest == json.loads((checkpoint / MANIFEST_NAME).read_text())
    assert {key: loaded.manifest[key] for key in MANIFEST} == MANIFEST
    assert loaded.manifest["format"] == FORMAT_VERSION
    assert "files" not in MANIFEST  # the caller's dict is not modified
    on_disk = files_on_disk(checkpoint)
    del on_disk[MANIFEST_NAME]
    assert WEIGHTS_NAME in on_disk and f"{STORE_DIR}/ids.npy" in on_disk
    assert loaded.manifest["files"] == {name: sha256_bytes(data) for name, data in on_disk.items()}
    assert list(loaded.manifest["files"]) == sorted(on_disk)


def test_sha256_helpers_match_hashlib(tmp_path: Path) -> None:
    data = np.random.default_rng(0).bytes(2_500_000)  # spans several 1 MiB chunks
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob") == hashlib.sha256(data).hexdigest()
    assert sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_refuses_to_overwrite_without_permission(tmp_path: Path, checkpoint: Path) -> None:
    before = files_on_disk(checkpoint)
    with pytest.raises(CheckpointError, match="already exists"):
        write_checkpoint(checkpoint, tensors=make_tensors(1), store=make_store(1), manifest={"method": "ipt"})
    assert files_on_disk(checkpoint) == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["ckpt"]


def test_overwrite_replaces_checkpoint_and_leaves_no_temporary_directories(
    tmp_path: Path, checkpoint: Path
) -> None:
    new_tensors = make_tensors(1)
    write_checkpoint(
        checkpoint, tensors=new_tensors, store=make_store(1), manifest={"method": "ipt"}, overwrite=True
    )
    loaded = load_checkpoint(checkpoint)
    assert loaded.manifest["method"] == "ipt" and "backbone" not in loaded.manifest
    assert all(torch.equal(loaded.tensors[name], new_tensors[name].detach()) for name in new_tensors)
    assert [entry.name for entry in tmp_path.iterdir()] == ["ckpt"]


def test_overwrite_never_replaces_something_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not replacing"):
        write_checkpoint(tmp_path / "results", tensors={}, store=make_store(), manifest={}, overwrite=True)
    assert (tmp_path / "results" / "notes.txt").read_text() == "keep me"
    assert [entry.name for entry in tmp_path.iterdir()] == ["results"]


def test_one_flipped_byte_in_the_weights_is_caught(checkpoint: Path) -> None:
    weights = checkpoint / WEIGHTS_NAME
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # inside the tensor data, so the file still parses as safetensors
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"sha256 mismatch for {WEIGHTS_NAME}"):
        load_checkpoint(checkpoint)


def test_a_deleted_store_file_is_reported_missing(checkpoint: Path) -> None:
    (checkpoint / STORE_DIR / "ids.npy").unlink()
    with pytest.raises(CheckpointError, match=f"missing file {STORE_DIR}/ids.npy"):
        load_checkpoint(checkpoint)


def test_all_problems_are_reported_together(checkpoint: Path) -> None:
    (checkpoint / STORE_DIR / "labels.npy").unlink()
    (checkpoint / WEIGHTS_NAME).write_bytes(b"not weights")
    with pytest.raises(CheckpointError) as caught:
        verify_checkpoint(checkpoint)
    assert f"missing file {STORE_DIR}/labels.npy" in str(caught.value)
    assert f"sha256 mismatch for {WEIGHTS_NAME}" in str(caught.value)


def test_unlisted_files_are_ignored(checkpoint: Path) -> None:
    (checkpoint / "notes.txt").write_text("added later")
    assert verify_checkpoint(checkpoint)["method"] == "dart"


@pytest.mark.parametrize("bad_value", [object(), {1, 2}, float("nan")])
def test_unserialisable_manifest_writes_nothing(tmp_path: Path, bad_value: object) -> None:
    with pytest.raises(CheckpointError, match="JSON"):
        write_checkpoint(
            tmp_path / "out" / "ckpt", tensors=make_tensors(), store=make_store(), manifest={"bad": bad_value}
        )
    assert list(tmp_path.iterdir()) == []


def test_failure_while_staging_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_save_file(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(artifacts, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path / "ckpt", tensors=make_tensors(), store=make_store(), manifest=MANIFEST)
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_checkpoint(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files_on_disk(checkpoint)

    def failing_save_file(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(artifacts, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(
            checkpoint, tensors=make_tensors(1), store=make_store(1), manifest={}, overwrite=True
        )
    assert files_on_disk(checkpoint) == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["ckpt"]


def test_failed_publish_puts_the_old_checkpoint_back(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files_on_disk(checkpoint)
    real_rename = artifacts.os.rename

    def rename(source: Path, destination: Path) -> None:
        if Path(source).name.startswith(".ckpt.tmp-"):  # the step that publishes the new checkpoint
            raise OSError("rename failed")
        real_rename(source, destination)

    monkeypatch.setattr(artifacts.os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        write_checkpoint(
            checkpoint, tensors=make_tensors(1), store=make_store(1), manifest={}, overwrite=True
        )
    assert files_on_disk(checkpoint) == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("escape", ["relative", "absolute"])
def test_paths_outside_the_checkpoint_are_rejected(tmp_path: Path, checkpoint: Path, escape: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not part of the checkpoint")
    # The digest is right, so only the path check can reject it.
    name = "../outside.txt" if escape == "relative" else str(outside)
    edit_manifest(checkpoint, lambda manifest: manifest["files"].update({name: sha256_file(outside)}))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        verify_checkpoint(checkpoint)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: (root / MANIFEST_NAME).write_text("{not json"), "not valid JSON"),
        (lambda root: (root / MANIFEST_NAME).unlink(), "missing"),
        (lambda root: edit_manifest(root, lambda manifest: manifest.pop("files")), '"files"'),
        (lambda root: edit_manifest(root, lambda manifest: manifest.update(format=2)), "format 2"),
        (lambda root: edit_manifest(root, lambda manifest: manifest["files"].clear()), "does not list"),
    ],
)
def test_damaged_manifest_is_rejected(checkpoint: Path, damage: Callable[[Path], Any], message: str) -> None:
    damage(checkpoint)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(checkpoint)


def test_missing_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")
