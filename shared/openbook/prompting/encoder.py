"""Turn (template, verbalizer, texts) into token ids with a known slot position.

Layout of one row (demonstrations optional):

    masked:  [prefix specials] body-with-[MASK] [demo block] [suffix specials]
    causal:  [prefix specials] [demo block] body            <- slot = last position

The demo block holds, for each class, one placeholder position (its embedding
is overwritten by the class's demonstration vector) followed by the class's
label-word tokens. For a causal backbone the block goes before the input,
because the slot must stay the last position.

Whitespace belongs to the token that follows it (the byte-level BPE
convention): a literal's trailing space moves onto the next text or label
word, so " great" is scored as the single token the LM would really emit.

Truncation only ever shortens the input texts (longest first for pairs), never
the template, the slot or the demonstrations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from openbook.prompting.templates import PromptError, Template, TextInput, Verbalizer

BackboneKind = Literal["masked", "causal"]


@dataclass
class EncodedBatch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    position_ids: torch.Tensor | None  # (B, T); causal rows are left-padded, so positions start per row
    slot_index: torch.Tensor  # (B,) position whose hidden state and next-token scores are read
    demo_index: torch.Tensor | None  # (B, C) placeholder positions of the demonstration vectors
    truncated: torch.Tensor  # (B,) bool: some input text was cut to fit max_length
    template_mask: torch.Tensor | None = None  # (B, T) bool: the template's own tokens (not text, slot, pad)

    def to(self, device: torch.device | str) -> EncodedBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return EncodedBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            move(self.position_ids),
            self.slot_index.to(device),
            move(self.demo_index),
            self.truncated,
            move(self.template_mask),
        )


@dataclass(frozen=True)
class _Piece:
    kind: Literal["ids", "text", "slot"]
    ids: tuple[int, ...] = ()
    field: str = ""
    leading_space: bool = False


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a text ([CLS]/[SEP], <s>, ... or nothing)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start]), list(full[start + len(bare) :])
    return [], []


class PromptEncoder:
    def __init__(
        self,
        tokenizer: Any,
        template: Template,
        verbalizer: Verbalizer,
        kind: BackboneKind,
        max_length: int,
        *,
        demonstrations: bool = False,
    ) -> None:
        if kind == "causal":
            template.require_slot_at_end()
        elif tokenizer.mask_token_id is None:
            raise PromptError("this masked-LM tokenizer has no mask token")
        self.tokenizer = tokenizer
        self.template = template
        self.verbalizer = verbalizer
        self.kind = kind
        self.max_length = max_length
        self.demonstrations = demonstrations
        self.prefix, suffix = special_tokens(tokenizer)
        self.suffix = suffix if kind == "masked" else []  # nothing may follow a causal slot
        self.pad_id = next(
            i
            for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id, 0)
            if i is not None
        )
        self._pieces, slot_space = self._plan(template)
        self.label_token_ids = [self._word_ids(word, slot_space) for word in verbalizer.words]
        self._demo_block = [tok for ids in self.label_token_ids for tok in (self.pad_id, *ids)]
        self._demo_offsets = np.cumsum([0] + [1 + len(ids) for ids in self.label_token_ids[:-1]]).tolist()
        fixed = len(self.prefix) + len(self.suffix) + sum(len(p.ids) for p in self._pieces)
        fixed += 1 if kind == "masked" else 0
        fixed += len(self._demo_block) if demonstrations else 0
        self.text_budget = max_length - fixed
        if self.text_budget < len([p for p in self._pieces if p.kind == "text"]):
            raise PromptError(
                f"the template{' and demonstrations' if demonstrations else ''} take {fixed} tokens, "
                f"leaving no room for the input within max_length={max_length}"
            )

    def _plan(self, template: Template) -> tuple[list[_Piece], bool]:
        pieces: list[_Piece] = []
        carry_space = False
        slot_space = False
        for segment in template.segments:
            if segment.kind == "literal":
                text = (" " if carry_space and not segment.value[:1].isspace() else "") + segment.value
                stripped = text.rstrip()
                carry_space = len(stripped) < len(text)
                if stripped:
                    ids = self.tokenizer(stripped, add_special_tokens=False)["input_ids"]
                    pieces.append(_Piece("ids", ids=tuple(ids)))
            elif segment.kind == "text":
                pieces.append(_Piece("text", field=segment.value, leading_space=carry_space))
                carry_space = False
            else:
                slot_space, carry_space = carry_space, False
                pieces.append(_Piece("slot"))
        return pieces, slot_space

    def _word_ids(self, word: str, leading_space: bool) -> list[int]:
        ids = self.tokenizer((" " if leading_space else "") + word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PromptError(f"label word {word!r} tokenizes to nothing")
        return list(ids)

    def encode(self, texts: Sequence[TextInput]) -> EncodedBatch:
        if not texts:
            raise PromptError("no texts to encode")
        for position, text in enumerate(texts):
            self.template.check_input(text, position)
        fields = ("text_a", "text_b") if self.template.is_pair else ("text",)
        rows_fields = [dict(zip(fields, t if self.template.is_pair else (t,), strict=True)) for t in texts]
        text_pieces = [p for p in self._pieces if p.kind == "text"]
        flat = [
            _spaced(row[piece.field].strip(), piece.leading_space)
            for row in rows_fields
            for piece in text_pieces
        ]
        flat_ids = self.tokenizer(flat, add_special_tokens=False)["input_ids"]
        per_row = len(text_pieces)
        rows, slots, demos, literals, truncated = [], [], [], [], []
        for r in range(len(texts)):
            text_ids, cut = _truncate_longest_first(
                flat_ids[r * per_row : (r + 1) * per_row], self.text_budget
            )
            row, slot, demo_start, literal = self._layout(text_ids)
            if not row:  # a blank text, a template of nothing else, no special tokens: nothing to read
                raise PromptError("a blank text leaves this template an empty prompt")
            rows.append(row)
            slots.append(slot)
            demos.append(demo_start)
            literals.append(literal)
            truncated.append(cut)
        return self._pad(rows, slots, demos, literals, truncated)

    def _layout(self, text_ids: list[list[int]]) -> tuple[list[int], int, int, list[int]]:
        texts = iter(text_ids)
        body: list[int] = []
        literal: list[int] = []  # positions in body of the template's own tokens
        slot = -1
        for piece in self._pieces:
            if piece.kind == "ids":
                literal.extend(range(len(body), len(body) + len(piece.ids)))
                body.extend(piece.ids)
            elif piece.kind == "text":
                body.extend(next(texts))
            else:
                slot = len(body)
                if self.kind == "masked":
                    body.append(self.tokenizer.mask_token_id)
        block = self._demo_block if self.demonstrations else []
        if self.kind == "masked":
            row = self.prefix + body + block + self.suffix
            start = len(self.prefix)
            return row, start + slot, start + len(body), [start + i for i in literal]
        row = self.prefix + block + body
        start = len(self.prefix) + len(block)
        return row, len(row) - 1, len(self.prefix), [start + i for i in literal]

    def _pad(
        self,
        rows: list[list[int]],
        slots: list[int],
        demo_starts: list[int],
        literals: list[list[int]],
        truncated: list[bool],
    ) -> EncodedBatch:
        width = max(len(r) for r in rows)
        left = self.kind == "causal"  # left padding keeps every causal slot at position T-1
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        template_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        shifts = []
        for i, row in enumerate(rows):
            shift = width - len(row) if left else 0
            ids[i, shift : shift + len(row)] = torch.tensor(row)
            mask[i, shift : shift + len(row)] = 1
            template_mask[i, [shift + p for p in literals[i]]] = True
            shifts.append(shift)
        shift_t = torch.tensor(shifts)
        position_ids = (mask.cumsum(1) - 1).clamp(min=0) if left else None
        demo_index = None
        if self.demonstrations:
            offsets = torch.tensor(self._demo_offsets)
            demo_index = (torch.tensor(demo_starts) + shift_t)[:, None] + offsets[None, :]  # (B, C)
        return EncodedBatch(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            slot_index=torch.tensor(slots) + shift_t,
            demo_index=demo_index,
            truncated=torch.tensor(truncated),
            template_mask=template_mask,
        )


def _spaced(text: str, leading_space: bool) -> str:
    """A text field as it is tokenised: a blank one adds no token, not even the space before it."""
    return " " + text if leading_space and text else text


def _truncate_longest_first(parts: list[list[int]], budget: int) -> tuple[list[list[int]], bool]:
    """Cut token lists (one per text field) to fit `budget` in total, shortening the longest first."""
    lengths = [len(p) for p in parts]
    excess = sum(lengths) - budget
    if excess <= 0:
        return parts, False
    while excess > 0:
        order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
        gap = lengths[order[0]] - (lengths[order[1]] if len(order) > 1 else 0)
        step = min(excess, max(gap, 1))
        lengths[order[0]] -= step
        excess -= step
    return [p[:n] for p, n in zip(parts, lengths, strict=True)], True
