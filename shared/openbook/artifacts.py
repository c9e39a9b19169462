"""Checkpoint directories for trained prompt methods: tensors, knowledge store and a self-describing manifest.

A checkpoint directory holds ``weights.safetensors`` (the method's tensors, never pickled), ``store/`` (a
:mod:`openbook.store_snapshot` of the knowledge store the method retrieves from) and ``manifest.json``: the
caller's description of the method (config, backbone, metrics) plus the format version and the sha256 of
every other file, so a loader can tell a complete, untouched checkpoint from a damaged one.

Everything is staged in a sibling directory, fsynced and published with a rename, so a crash or a
concurrent reader sees the old checkpoint or the new one, never a half-written mix of the two.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from openbook.atomic import staged_directory
from openbook.store import KnowledgeStore
from openbook.store_snapshot import MANIFEST_NAME as STORE_MANIFEST_NAME
from openbook.store_snapshot import read_snapshot, write_snapshot

MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "weights.safetensors"
STORE_DIR = "store"
FORMAT_VERSION = 1
CHUNK_SIZE = 1 << 20  # hash weight files in 1 MiB pieces instead of reading them into memory whole
# A checkpoint cannot be loaded without these, so a manifest that does not vouch for them is incomplete.
REQUIRED_FILES = (WEIGHTS_NAME, f"{STORE_DIR}/{STORE_MANIFEST_NAME}")


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or tampered with, or cannot be written as asked."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: the manifest as written, the method's tensors and its knowledge store."""

    path: Path
    manifest: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    store: KnowledgeStore


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(CHUNK_SIZE), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _listed_files(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root``, by relative posix path; runs before the manifest exists."""
    files = sorted((file.relative_to(root).as_posix(), file) for file in root.rglob("*") if file.is_file())
    return {name: sha256_file(file) for name, file in files}


def write_checkpoint(
    path: str | os.PathLike[str],
    *,
    tensors: dict[str, torch.Tensor],
    store: KnowledgeStore,
    manifest: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint directory atomically and return its path.

    ``manifest`` is written as given plus ``"format"`` and ``"files"``, which replace keys of those names.
    Only an existing checkpoint is ever replaced, and only with ``overwrite=True``.
    """
    target = Path(path)
    try:
        json.dumps(manifest, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{target}: manifest is not JSON-serialisable: {error}") from error
    if target.exists() and not overwrite:
        raise CheckpointError(f"{target}: already exists; pass overwrite=True to replace it")
    if target.exists() and not (target / MANIFEST_NAME).is_file():
        raise CheckpointError(f"{target}: exists but has no {MANIFEST_NAME}; not replacing it")
    with staged_directory(target) as staging:
        write_snapshot(store, staging / STORE_DIR)
        cpu_tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
        save_file(cpu_tensors, staging / WEIGHTS_NAME)
        written = {**manifest, "format": FORMAT_VERSION, "files": _listed_files(staging)}
        (staging / MANIFEST_NAME).write_text(json.dumps(written, indent=2, allow_nan=False), encoding="utf-8")
    return target


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check the manifest and the sha256 of every file it lists (others are ignored); return the manifest."""
    root = Path(path)
    manifest_path = root / MANIFEST_NAME
    if not root.is_dir():
        raise CheckpointError(f"{root}: no checkpoint directory there")
    if not manifest_path.is_file():
        raise CheckpointError(f"{manifest_path}: missing")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{manifest_path}: not valid JSON: {error}") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(digest, str) for digest in files.values()):
        raise CheckpointError(f'{manifest_path}: no "files" mapping relative paths to sha256 digests')
    version = manifest.get("format")
    if not (type(version) is int and version == FORMAT_VERSION):
        raise CheckpointError(f"{manifest_path}: format {version!r}, this code reads {FORMAT_VERSION}")
    for name in files:
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise CheckpointError(f"{manifest_path}: listed path {name!r} points outside the checkpoint")
    unlisted = [name for name in REQUIRED_FILES if name not in files]
    if unlisted:
        raise CheckpointError(f"{manifest_path}: does not list {', '.join(unlisted)}")
    problems = []
    for name, expected in files.items():
        if not (root / name).is_file():
            problems.append(f"missing file {name}")
        elif (actual := sha256_file(root / name)) != expected:
            problems.append(f"sha256 mismatch for {name}: manifest says {expected}, file has {actual}")
    if problems:
        raise CheckpointError(f"{root}: " + "; ".join(problems))
    return manifest


def load_checkpoint(path: str | os.PathLike[str], *, device: str = "cpu") -> Checkpoint:
    """Verify a checkpoint, then load its tensors onto ``device`` and restore its knowledge store."""
    root = Path(path)
    manifest = verify_checkpoint(root)
    try:
        tensors = load_file(root / WEIGHTS_NAME, device=device)
        store = read_snapshot(root / STORE_DIR)
    except (OSError, SafetensorError, ValueError) as error:
        # Reachable only if the files changed after verification or were rehashed after being damaged.
        raise CheckpointError(f"{root}: verified but could not be loaded: {error}") from error
    return Checkpoint(path=root, manifest=manifest, tensors=tensors, store=store)
