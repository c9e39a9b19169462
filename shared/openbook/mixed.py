"""Mixed-task batches: the prompts of several LoRA tasks on one shared backbone run as one forward.

Tasks whose method trains LoRA adapters (`methods/lora.py`) read one set of base weights, each through
its own low-rank updates. A projection of such a task computes

    h = W x + s_t * B_t A_t x        # W shared; A_t, B_t, s_t = alpha / r: task t's adapter

so a batch whose rows belong to different tasks can share the `W x` of every layer, the expensive
part, and add each row's own update after it. `MixedForward` does that: it stacks the tasks' prompts
into one padded batch, task after task, and runs it through a copy of the base's module tree (the
same weight tensors, as `adapted_backbone` makes one) whose adapted projections carry a forward hook
adding `s_t * (x[rows_t] A_t^T) B_t^T` to the rows of task t. This is what peft's mixed-adapter
batches (`adapter_names=`) compute, grouped by adapter; here every task's rows are one contiguous
block, so a group is a slice, and the adapters stay where their own classifiers keep them.

Each task then reads its own label words from the shared slot scores and scores its own store, so a
row's prediction is the one its task alone would give, up to the float rounding that a different
padding width brings (`tests/test_mixed.py` checks this on the tiny model).

A task joins a mixed batch if its classifier runs on adapters over this base, with no trainable
prompt and no demonstration pass (those change the input, not the projections) and scores its label
words exactly (the words of every part are scored in one pass over their token tree); `mixes` says
which.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.compiled import pad_batch
from openbook.predictions import Embeddings, Prediction
from openbook.prompting import EncodedBatch, TextInput

# One task's update to one projection: (A (r, in), B (out, r), scaling).
Update = tuple[torch.Tensor, torch.Tensor, float]


def lora_updates(backbone: Backbone) -> dict[str, Update]:
    """The adapted projections of `backbone`, by module name (as named in the base): A, B and scaling.

    Only the plain adapter peft injects as `default` (no DoRA, no other variant) is read; a
    backbone with anything else has no updates here and does not mix.
    """
    updates: dict[str, Update] = {}
    for name, module in backbone.model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if not isinstance(lora_a, nn.ModuleDict) or "default" not in lora_a:
            continue
        if getattr(module, "lora_variant", {}).get("default") is not None:
            return {}
        lora_b = cast(nn.ModuleDict, module.lora_B)
        updates[name] = (
            cast(torch.Tensor, lora_a["default"].weight),
            cast(torch.Tensor, lora_b["default"].weight),
            float(cast(dict[str, float], module.scaling)["default"]),
        )
    return updates


def shares_weights(backbone: Backbone, base: Backbone) -> bool:
    """Whether `backbone` reads `base`'s very weight tensors (the copy `adapted_backbone` made)."""
    own = {p.data_ptr() for name, p in backbone.model.named_parameters() if "lora_" not in name}
    return own == {p.data_ptr() for p in base.model.parameters()}


@dataclass(frozen=True)
class _Block:
    """One task's rows in the stacked batch, and its adapters."""

    rows: slice
    updates: dict[str, Update]


def stack(batches: Sequence[EncodedBatch], pad_id: int, left: bool) -> EncodedBatch:
    """One batch of the rows of `batches`, in order, padded to the widest (on the left for a causal LM)."""
    width = max(b.input_ids.shape[1] for b in batches)
    padded = [pad_batch(b, len(b.input_ids), width, left, pad_id=pad_id) for b in batches]

    def joined(name: str) -> torch.Tensor | None:
        parts = [getattr(b, name) for b in padded]
        return None if any(p is None for p in parts) else torch.cat(parts)

    return EncodedBatch(
        input_ids=torch.cat([b.input_ids for b in padded]),
        attention_mask=torch.cat([b.attention_mask for b in padded]),
        position_ids=joined("position_ids"),
        slot_index=torch.cat([b.slot_index for b in padded]),
        demo_index=None,
        truncated=torch.cat([b.truncated for b in padded]),
        template_mask=joined("template_mask"),
    )


class MixedForward:
    """Runs the prompts of several LoRA tasks over one shared `base` backbone as one forward.

    Thread-safe: one mixed forward runs at a time (the hooks read the blocks of the forward in
    progress). The base module tree is never touched: the hooks sit on a copy that shares its tensors.
    """

    def __init__(self, base: Backbone) -> None:
        self.base = base
        memo: dict[int, Any] = {id(p): p for p in base.model.parameters()}
        memo.update({id(b): b for b in base.model.buffers()})
        tree = copy.deepcopy(base.model, memo)  # new modules over the same tensors: hooks stay here
        self.backbone = Backbone(tree, base.tokenizer, base.kind, base.config)
        self._modules = dict(tree.named_modules())
        self._hooked: set[str] = set()
        self._blocks: list[_Block] = []
        self._lock = threading.Lock()
        # each backbone's adapters, forgotten with the backbone (classifiers come and go with hot swaps)
        self._seen: weakref.WeakKeyDictionary[Backbone, dict[str, Update]] = weakref.WeakKeyDictionary()

    def mixes(self, classifier: Classifier) -> bool:
        """Whether `classifier` can share a forward here: LoRA adapters over this base, nothing else (its
        label words scored exactly, as the shared forward scores every part's; no sentence reader, whose
        embeddings the shared forward does not take)."""
        if classifier.prompt is not None or (classifier.demos is not None and len(classifier.store) > 0):
            return False
        if classifier.reader is not None:
            return False
        if classifier.label_scoring != "exact":
            return False
        return bool(self._updates(classifier))

    def _updates(self, classifier: Classifier) -> dict[str, Update]:
        """The classifier's adapters if its backbone mixes here, else {}; kept per backbone (a serving
        replica asks for every forward, and walking the module tree costs milliseconds)."""
        backbone = classifier.backbone
        known = self._seen.get(backbone)
        if known is not None:
            return known
        updates = lora_updates(backbone)
        fits = (
            bool(updates)
            and all(isinstance(self._modules.get(name), nn.Linear) for name in updates)
            and backbone.kind == self.base.kind
            and backbone.config.layer == self.base.config.layer
            and shares_weights(backbone, self.base)
        )
        self._seen[backbone] = updates if fits else {}
        return self._seen[backbone]

    def embed(self, parts: Sequence[tuple[Classifier, Sequence[TextInput]]]) -> list[Embeddings]:
        """Each part's `Classifier.embed(texts, vectors_only=True)`, from one forward of every part's rows.

        Every classifier must pass `mixes`. The label words of all parts are scored together at each
        row's slot, and each part keeps its own columns.
        """
        if not parts or any(not texts for _, texts in parts):
            raise ValueError("every part needs texts")
        batches, blocks, columns = [], [], []
        label_ids: list[list[int]] = []
        start = 0
        for classifier, texts in parts:
            if not self.mixes(classifier):
                raise ValueError(
                    "a classifier without LoRA adapters over this base cannot join a mixed batch"
                )
            batch = classifier.encoder.encode(texts)
            batches.append(batch)
            blocks.append(_Block(slice(start, start + len(texts)), self._updates(classifier)))
            start += len(texts)
            ids = classifier.encoder.label_token_ids
            columns.append(slice(len(label_ids), len(label_ids) + len(ids)))
            label_ids.extend(ids)
        pad_id = parts[0][0].encoder.pad_id
        batch = stack(batches, pad_id, left=self.base.kind == "causal")
        with self._lock, self._adapters(blocks), torch.inference_mode():
            out = self.backbone.forward(batch, label_ids)
        vectors = nn.functional.normalize(out.hidden, dim=-1).cpu().numpy()
        scores = out.label_log_probs.cpu().numpy()
        truncated = batch.truncated.numpy()
        return [
            Embeddings(vectors[block.rows], scores[block.rows, cols], truncated[block.rows])
            for block, cols in zip(blocks, columns, strict=True)
        ]

    def predict(self, parts: Sequence[tuple[Classifier, Sequence[TextInput]]]) -> list[list[Prediction]]:
        """Each part's `Classifier.predict(texts)`, from one forward: its store and calibration its own."""
        embeddings = self.embed(parts)
        return [classifier.explain(e) for (classifier, _), e in zip(parts, embeddings, strict=True)]

    @contextmanager
    def _adapters(self, blocks: list[_Block]) -> Iterator[None]:
        for name in {name for block in blocks for name in block.updates} - self._hooked:
            self._modules[name].register_forward_hook(self._make_hook(name))
            self._hooked.add(name)
        self._blocks = blocks
        try:
            yield
        finally:
            self._blocks = []

    def _make_hook(self, name: str) -> Any:
        def add_updates(
            _module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor
        ) -> torch.Tensor:
            x = args[0]
            for block in self._blocks:
                update = block.updates.get(name)
                if update is None:
                    continue
                a, b, scaling = update
                rows = x[block.rows].to(a.dtype)
                out[block.rows] += (scaling * (rows @ a.T) @ b.T).to(out.dtype)
            return out

        return add_updates
