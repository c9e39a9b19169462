"""Fewer kernel launches per forward: the backbone compiled over a few padded shapes.

On a GPU a small model's forward is launch-bound: 30 layers issue their kernels one by one from
Python, and the device waits on the process that feeds it (docs/benchmarks.md, the H100 profile).
`torch.compile(mode="reduce-overhead")` fuses those kernels and replays them as CUDA graphs, which
launch a whole forward at once. A graph holds fixed shapes, so each batch is padded up to one of a
few buckets first: rows to a power of 4 (1, 4, 16, ... up to `max_rows`) and length to a multiple of
32 (up to the backbone's max_length). `Backbone.compile` compiles and records every bucket at once,
when a backbone is loaded or swapped in, so no request waits on a compiler.

Padding does not change a real row's answer: extra rows repeat the batch's last row (a row of
nothing but masked positions would make attention's softmax divide by zero) and are dropped after
the forward; extra columns are masked positions, on the left of a causal prompt (its slot stays the
last position) and on the right of a masked one. `tests/test_compiled.py` checks compiled against
eager on the tiny models, on the CPU (compiled in the "default" mode: there are no graphs there, and
the CPU gains nothing, docs/benchmarks.md) and on CUDA.

Neural and word demonstrations go through the compiled forward too: they are vectors written into
the input embeddings at the batch's demonstration slots before the model reads them, so the shapes
stay a bucket's (their slots move with a causal prompt's left padding; padded rows repeat the last
row's vectors). A trainable prompt, multi-token label words of a causal model (the pass over their
token tree reads the prompt's KV cache, `word_scores.py`) or a shape over every bucket runs eagerly,
as it always did. `Backbone.slot_vectors` (store keys) goes through the compiled forward too, whatever
the label words, since it scores none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from openbook.prompting import EncodedBatch

LENGTH_STEP = 32  # a prompt's padded length is a multiple of this
ROWS_BASE = 4  # a batch's padded row count is a power of this


def buckets(limit: int, *, base: int | None = None, step: int | None = None) -> list[int]:
    """Powers of `base` below `limit`, then `limit`; or multiples of `step` below it, then `limit`."""
    found: list[int] = []
    size = 1 if base is not None else step or 1
    while size < limit:
        found.append(size)
        size = size * base if base is not None else size + (step or 1)
    return [*found, limit]


def fit(size: int, sizes: list[int]) -> int | None:
    """The smallest of `sizes` that holds `size`; None when none does."""
    return next((s for s in sizes if s >= size), None)


def pad_batch(batch: EncodedBatch, rows: int, width: int, left: bool, *, pad_id: int = 0) -> EncodedBatch:
    """`batch` padded to (rows, width): new rows repeat the last row, new columns are masked `pad_id`s."""
    real, length = batch.input_ids.shape
    more, extra = rows - real, width - length
    sides = (extra, 0) if left else (0, extra)

    def widen(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return F.pad(tensor, sides, value=value)

    def lengthen(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, tensor[-1:].expand(more, *tensor.shape[1:])]) if more else tensor

    position_ids = None if batch.position_ids is None else lengthen(widen(batch.position_ids, 0))
    template = None if batch.template_mask is None else lengthen(widen(batch.template_mask, False))
    shift = extra if left else 0  # positions move right with the padding on their left
    demo_index = None if batch.demo_index is None else lengthen(batch.demo_index + shift)
    return EncodedBatch(
        input_ids=lengthen(widen(batch.input_ids, pad_id)),
        attention_mask=lengthen(widen(batch.attention_mask, 0)),
        position_ids=position_ids,
        slot_index=lengthen(batch.slot_index + shift),
        demo_index=demo_index,
        truncated=lengthen(batch.truncated),
        template_mask=template,
    )


@dataclass
class CompiledForward:
    """A backbone's compiled model and the shapes it was recorded for (`Backbone.compile` sets it)."""

    model: Any  # torch.compile's wrapper around the backbone's model
    row_sizes: list[int]
    lengths: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call, and its read-out, at a time

    def shape(self, batch: EncodedBatch) -> tuple[int, int] | None:
        """The bucket (rows, width) `batch` pads to; None when it fits none (it runs eagerly)."""
        rows, width = batch.input_ids.shape
        padded = fit(rows, self.row_sizes), fit(width, self.lengths)
        return None if padded[0] is None or padded[1] is None else (padded[0], padded[1])

    def warm_up_batches(self, causal: bool) -> Iterator[EncodedBatch]:
        """One batch of each bucket's shape, to compile and record it before any request comes."""
        for rows in self.row_sizes:
            for width in self.lengths:
                ones = torch.ones((rows, width), dtype=torch.long)
                yield EncodedBatch(
                    input_ids=torch.zeros_like(ones),
                    attention_mask=ones,
                    position_ids=ones.cumsum(1) - 1 if causal else None,
                    slot_index=torch.full((rows,), width - 1),
                    demo_index=None,
                    truncated=torch.zeros(rows, dtype=torch.bool),
                )
