"""The replica's base models: each backbone loaded once per name and shared by the tasks that keep it
frozen, and, per backbone, the forward its LoRA tasks' rows share (openbook.mixed).

Which backbones may be loaded at all is said here too (`check_name`): a task names its backbone, and
this service loads nothing it would have to reach out for.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.encoders import DEFAULT_READER, ENCODERS
from openbook.mixed import MixedForward
from openbook.models import DEFAULT_BACKBONE, PACKAGED_MODELS, model_cache_dir


class UnknownBackbone(ValueError):
    """A backbone name this service does not load (not registered, not a model directory it may read)."""


class Backbones:
    """Backbones by name, loaded on first use (and compiled if the settings say so); thread-safe."""

    def __init__(
        self,
        *,
        max_length: int,
        device: str,
        default_backbone: str = DEFAULT_BACKBONE,
        default_reader: str = DEFAULT_READER,
        model_dirs: Sequence[Path] = (),
        batch_size: int | None = None,
        mixed_batches: bool = True,  # LoRA tasks on one backbone may share a forward (openbook.mixed)
        compile: bool = False,  # compile each backbone loaded (openbook.compiled), off the request path
    ) -> None:
        self.max_length = max_length
        self.device = device
        self.default_backbone = default_backbone
        self.default_reader = default_reader
        self.model_dirs = [model_cache_dir(), *model_dirs]
        # Texts per forward in a task's classifier (None: the library's default). The micro-batcher
        # already bounds a forward (OPENBOOK_BATCH_MAX_TEXTS, 1024 on CUDA); a smaller chunk here would
        # cut each of its batches into several forwards again.
        self.batch_size = batch_size
        self.mixed_batches = mixed_batches
        self.compile = compile
        self._loaded: dict[str, Backbone] = {}
        self._mixers: dict[str, MixedForward] = {}  # one per backbone, for its LoRA tasks' mixed batches
        self._lock = threading.Lock()  # guards _loaded and _mixers

    def check_name(self, name: str) -> None:
        """Raise UnknownBackbone unless `name` is a backbone this service may load without reaching out.

        That is a registered backbone (openbook.models), the service's default, or a model directory
        (with a config.json) under the model cache or `model_dirs`. Anything else would be looked up on a
        model hub, which takes long offline and lets a client make the server fetch models; and a path
        outside those directories lets a client probe the server's files.
        """
        if name in PACKAGED_MODELS or name == self.default_backbone or self._local(name, "config.json"):
            return
        known = ", ".join(sorted({*PACKAGED_MODELS, self.default_backbone}))
        where = ", ".join(str(d) for d in self.model_dirs)
        raise UnknownBackbone(
            f"unknown backbone {name!r}: use one of {known}, or the path of a model directory under {where}"
        )

    def check_reader(self, name: str) -> None:
        """Raise UnknownBackbone unless `name` is a sentence encoder this service may load without
        reaching out: a registered one (openbook.encoders), the service's default, or a sentence-transformers
        folder (with a modules.json) under the model cache or `model_dirs`."""
        if name in ENCODERS or name == self.default_reader or self._local(name, "modules.json"):
            return
        where = ", ".join(str(d) for d in self.model_dirs)
        raise UnknownBackbone(
            f"unknown reader {name!r}: use one of {', '.join(sorted(ENCODERS))}, or the path of a "
            f"sentence-transformers folder under {where}"
        )

    def _local(self, name: str, marker: str) -> bool:
        """Whether `name` is the absolute path of a folder holding `marker` under one of `model_dirs`."""
        path = Path(name)
        if not path.is_absolute():
            return False
        resolved = path.resolve()
        return (resolved / marker).is_file() and any(
            resolved.is_relative_to(root.resolve()) for root in self.model_dirs
        )

    def backbone(self, name: str) -> Backbone:
        """The backbone `name`, loaded on first use; raises what loading raises (OSError, ValueError)."""
        with self._lock:
            if name not in self._loaded:
                config = BackboneConfig(name=name, max_length=self.max_length, device=self.device)
                self._loaded[name] = self.prepare(load_backbone(config))
            return self._loaded[name]

    def prepare(self, backbone: Backbone) -> Backbone:
        """A newly loaded backbone, compiled for the replica's batches if the settings say so."""
        if self.compile:
            backbone.compile(max_rows=self.batch_size or Classifier.batch_size)
        return backbone

    def mixer(self, name: str) -> MixedForward | None:
        """The mixed-batch forward of backbone `name` (None when mixed batches are off)."""
        if not self.mixed_batches:
            return None
        backbone = self.backbone(name)
        with self._lock:
            if name not in self._mixers:
                self._mixers[name] = MixedForward(backbone)
            return self._mixers[name]
