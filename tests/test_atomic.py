"""Atomic publishing (`atomic.py`): a write that fails leaves the old file or directory, and no staging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from openbook import atomic
from openbook.atomic import staged_directory, staged_file, write_text


def tree(root: Path) -> dict[str, bytes]:
    """Every file below `root` (relative path -> bytes): what a reader would see."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def old_directory(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "a.txt").write_text("old a")
    (path / "sub" / "b.txt").write_text("old b")
    return path


def fail_renames_of_staging(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """Make publishing fail: renaming the staging copy onto `target` raises, every other rename works."""
    real_rename, real_replace = os.rename, os.replace

    def refuse(real):
        def rename(source, destination):
            if Path(source).name.startswith(f".{target.name}.tmp-"):
                raise OSError("rename failed")
            real(source, destination)

        return rename

    monkeypatch.setattr(atomic.os, "rename", refuse(real_rename))
    monkeypatch.setattr(atomic.os, "replace", refuse(real_replace))


def test_staged_file_replaces_the_target_with_what_was_written(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "notes.txt"  # missing parents are created
    with staged_file(target) as staging:
        assert staging.parent == target.parent and staging.name.startswith(".notes.txt.tmp-")
        staging.write_text("first")
        assert not target.exists()  # nothing is published before the block ends
    assert target.read_text() == "first"
    write_text(target, "second, ünïcode")
    assert target.read_text(encoding="utf-8") == "second, ünïcode"
    assert [p.name for p in target.parent.iterdir()] == ["notes.txt"]


def test_a_failed_file_write_keeps_the_old_file_and_leaves_no_staging(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="interrupted"), staged_file(target) as staging:
        staging.write_text("half of the new")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_failed_file_publish_keeps_the_old_file_and_leaves_no_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old")
    fail_renames_of_staging(monkeypatch, target)
    with pytest.raises(OSError, match="rename failed"):
        write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_staged_directory_replaces_the_whole_target(tmp_path: Path) -> None:
    target = old_directory(tmp_path / "snapshot")
    with staged_directory(target) as staging:
        assert list(staging.iterdir()) == []  # starts empty: nothing of the old version carries over
        (staging / "c.txt").write_text("new c")
        assert tree(target) == {"a.txt": b"old a", "sub/b.txt": b"old b"}  # readers still see the old one
    assert tree(target) == {"c.txt": b"new c"}
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot"]  # neither staging nor the old copy is left


@pytest.mark.parametrize("existing", [True, False])
def test_a_failed_directory_write_keeps_the_old_directory_and_leaves_no_staging(
    tmp_path: Path, existing: bool
) -> None:
    target = tmp_path / "snapshot"
    if existing:
        old_directory(target)
    before = tree(target) if existing else None
    with pytest.raises(RuntimeError, match="interrupted"), staged_directory(target) as staging:
        (staging / "a.txt").write_text("new a")
        raise RuntimeError("interrupted")
    assert (tree(target) if target.exists() else None) == before
    assert [p.name for p in tmp_path.iterdir()] == (["snapshot"] if existing else [])


def test_a_failed_directory_publish_puts_the_old_directory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = old_directory(tmp_path / "snapshot")
    before = tree(target)
    fail_renames_of_staging(monkeypatch, target)
    with pytest.raises(OSError, match="rename failed"), staged_directory(target) as staging:
        (staging / "a.txt").write_text("new a")
    assert tree(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot"]  # the moved-aside copy went back
