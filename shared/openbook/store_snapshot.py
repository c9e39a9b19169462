"""Snapshot persistence for :class:`~openbook.store.KnowledgeStore`: one directory per snapshot.

A snapshot holds a JSON manifest, the sorted id, label and index-assignment arrays as ``.npy`` files and
one faiss file per index, and, when some entry has its text, ``texts.json`` (ids and texts, a pair as a
two-item list; the manifest's ``texts_file`` is null without one).
It is written into a staging directory next to the target and published with a
rename, so readers see either the old snapshot or the new one, never a half-written one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from openbook.atomic import staged_directory
from openbook.prompting.templates import TextInput
from openbook.store import KnowledgeStore, StoreState

FORMAT_VERSION = 1
MANIFEST_NAME = "store.json"
ARRAY_FILES = ("ids.npy", "labels.npy", "index_of.npy")
TEXTS_NAME = "texts.json"


def write_snapshot(
    store: KnowledgeStore, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> None:
    """Write a snapshot directory atomically; ``metadata``, if given, replaces ``store.metadata``."""
    target = Path(path)
    new_metadata = dict(store.metadata if metadata is None else metadata)
    state = store.export_state()
    indexes, arrays = state.indexes, (state.ids, state.labels, state.index_of)
    index_files = [f"index_{position:04d}.faiss" for position in range(len(indexes))]
    manifest = {
        "format_version": FORMAT_VERSION,
        "dim": store.dim,
        "kind": store.kind,
        "count": len(store),
        "version": store.version,
        "approx_threshold": store.approx_threshold,
        "nprobe": store.nprobe,
        "seed": store.seed,
        "shard_size": store.shard_size,
        "approx_recall": store.approx_recall,
        "ivf_built_at": state.ivf_built_at,
        "index_files": index_files,
        "texts_file": TEXTS_NAME if state.texts else None,
        "metadata": new_metadata,
    }
    try:
        manifest_text = json.dumps(manifest, indent=2, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata must be JSON-serialisable: {error}") from error
    if target.exists() and not (target / MANIFEST_NAME).is_file():
        raise FileExistsError(f"{target} exists and is not a knowledge store snapshot; not replacing it")
    with staged_directory(target) as staging:
        for index, name in zip(indexes, index_files, strict=True):
            faiss.write_index(index, str(staging / name))
        for name, array in zip(ARRAY_FILES, arrays, strict=True):
            np.save(staging / name, array)
        if state.texts:
            texts = {"ids": list(state.texts), "texts": list(state.texts.values())}
            (staging / TEXTS_NAME).write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        (staging / MANIFEST_NAME).write_text(manifest_text, encoding="utf-8")
    store.metadata = new_metadata


def read_snapshot(path: str | os.PathLike[str]) -> KnowledgeStore:
    """Restore a store written by :func:`write_snapshot`; it gives the same search results as the original."""
    source = Path(path)
    if not (source / MANIFEST_NAME).is_file():
        raise FileNotFoundError(f"no knowledge store snapshot at {source} (missing {MANIFEST_NAME})")
    try:
        manifest = json.loads((source / MANIFEST_NAME).read_text(encoding="utf-8"))
        if manifest["format_version"] != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {manifest['format_version']}")
        store = KnowledgeStore(
            manifest["dim"],
            approx_threshold=manifest["approx_threshold"],
            nprobe=manifest["nprobe"],
            seed=manifest["seed"],
            shard_size=manifest["shard_size"],
        )
        loaded = [np.load(source / name, allow_pickle=False) for name in ARRAY_FILES]
        ids, labels, index_of = (array.astype(np.int64) for array in loaded)
        indexes = [faiss.read_index(str(source / name)) for name in manifest["index_files"]]
        store.version = int(manifest["version"])
        store.metadata = dict(manifest["metadata"])
        texts = _read_texts(source / manifest["texts_file"]) if manifest["texts_file"] else {}
        kind, built_at, recall = manifest["kind"], int(manifest["ivf_built_at"]), manifest["approx_recall"]
        store.restore_state(StoreState(kind, indexes, ids, labels, index_of, built_at, texts, recall))
        _check_consistency(store, int(manifest["count"]))
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"corrupt knowledge store snapshot at {source}: {error}") from error
    return store


def _read_texts(path: Path) -> dict[int, TextInput]:
    stored = json.loads(path.read_text(encoding="utf-8"))
    return {
        int(i): text if isinstance(text, str) else tuple(text)
        for i, text in zip(stored["ids"], stored["texts"], strict=True)
    }


def _check_consistency(store: KnowledgeStore, count: int) -> None:
    """Reject a restored store whose parts disagree; set the IVF nprobe once the store passes."""
    state = store.export_state()
    indexes, ids, labels, index_of = state.indexes, state.ids, state.labels, state.index_of
    if store.kind not in ("flat", "ivf"):
        raise ValueError(f"unknown index kind {store.kind!r}")
    if not len(ids) == len(labels) == len(index_of) == count:
        raise ValueError("ids, labels and index assignment do not match the recorded count")
    if (np.diff(ids) <= 0).any():
        raise ValueError("ids are not sorted and unique")
    per_index = np.bincount(index_of, minlength=len(indexes)).tolist()
    actual = [index.ntotal for index in indexes]
    if per_index != actual:
        raise ValueError(f"index sizes {actual} do not match the id arrays")
    if not np.isin(np.fromiter(state.texts, np.int64, len(state.texts)), ids).all():
        raise ValueError("texts are stored for ids the store does not hold")
    if any(index.d != store.dim for index in indexes):
        raise ValueError(f"an index has a dimension other than {store.dim}")
    if store.kind == "ivf":
        faiss.extract_index_ivf(indexes[0]).nprobe = store.nprobe
