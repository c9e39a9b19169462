"""Turn (template, verbalizer, texts) into token ids with a known slot position.

Layout of one row (demonstrations optional):

    masked:  [prefix specials] body-with-[MASK] [demo block] [suffix specials]
    causal:  [prefix specials] [demo block] body            <- slot = last position

The demo block comes in two layouts. `vectors`: for each class shown, one
placeholder position (its embedding is overwritten by the class's
demonstration vector) followed by the class's label-word tokens. A task with
many labels shows only some of its classes per row (`demo_classes`; which ones
is the caller's choice, `encode(classes=...)`): the block is budgeted for the
longest label words, so any choice fits, and the encoder shows as many classes
as fit when fewer than asked do. With every class shown the block is each
label's pair in label order. `text`
(LM-BFF): each demonstration is the template filled with an example's text(s)
and its label word in the slot, e.g. `a gem It was great`; the template
instances of a row (demonstrations and the input's own prompt) are separated
by a line break, because a causal template ends at its label word and the next
instance would otherwise run on from it. For a causal backbone the block goes
before the input, because the slot must stay the last position.

Whitespace belongs to the token that follows it (the byte-level BPE
convention): a literal's trailing space moves onto the next text or label
word, so " great" is scored as the single token the LM would really emit.

Truncation only ever shortens the input texts (longest first for pairs), never
the template, the slot or a `vectors` block; a template that leaves no room
for the input beside even one class's `vectors` pair is a PromptError. Textual demonstrations take the
room the input's prompt leaves within max_length: while even one token per
demonstration text would not fit, the last demonstration is dropped; then the
demonstration texts are shortened, longest first. The input is never cut for
them.

A text is tokenized once (`tokenize`, field by field): the result, `TokenizedTexts`, is still a
sequence of the texts, so it goes wherever texts go, and every encoder on the same tokenizer and
template fields lays it out without tokenizing it again (a server sizes its batch by the prompts'
lengths, `prompt_lengths`, and the forward reads the same tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch

from openbook.prompting.templates import PromptError, Template, TextInput, Verbalizer
from openbook.prompting.tokens import TokenizedTexts

BackboneKind = Literal["masked", "causal"]
DemoLayout = Literal["none", "vectors", "text"]
Demo = tuple[TextInput, int]  # a textual demonstration: an example's text (or pair) and its label index
DEMO_SEPARATOR = "\n"  # between the template instances of a row with textual demonstrations


@dataclass
class EncodedBatch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    position_ids: torch.Tensor | None  # (B, T); causal rows are left-padded, so positions start per row
    slot_index: torch.Tensor  # (B,) position whose hidden state and next-token scores are read
    demo_index: torch.Tensor | None  # (B, K) placeholder positions of the demonstration vectors
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
        demonstrations: DemoLayout = "none",
        demo_classes: int | None = None,  # vectors: at most this many classes' pairs a row; None: every one
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
        # One class's `vectors` pair: its placeholder, then its label word; all of them in one flat array.
        self._pair_sizes = np.array([1 + len(ids) for ids in self.label_token_ids], dtype=np.int64)  # (C,)
        self._pair_starts = np.cumsum(self._pair_sizes) - self._pair_sizes  # (C,)
        self._pair_tokens = np.array(
            [tok for ids in self.label_token_ids for tok in (self.pad_id, *ids)], dtype=np.int64
        )
        self._separator = list(tokenizer(DEMO_SEPARATOR, add_special_tokens=False)["input_ids"])
        self._text_pieces = [p for p in self._pieces if p.kind == "text"]
        self._fields = tuple((p.field, p.leading_space) for p in self._text_pieces)  # what tokenizing needs
        fixed = len(self.prefix) + len(self.suffix) + sum(len(p.ids) for p in self._pieces)
        fixed += 1 if kind == "masked" else 0
        self.demo_classes = 0  # the classes whose pairs a `vectors` row shows
        if demonstrations == "vectors":
            self.demo_classes = self._classes_that_fit(demo_classes, max_length - fixed)
            fixed += int(self._widest_pairs(self.demo_classes).sum())  # any choice of classes fits
        self.text_budget = max_length - fixed
        if self.text_budget < len(self._text_pieces):
            shown = ""
            if demonstrations == "vectors":
                shown = " and demonstrations" if self.demo_classes > 1 else " and one demonstration"
            raise PromptError(
                f"the template{shown} take {fixed} tokens, leaving no room for the input within "
                f"max_length={max_length}"
            )

    def _widest_pairs(self, count: int) -> np.ndarray:
        """The sizes of the `count` longest classes' pairs, longest first."""
        return np.sort(self._pair_sizes)[::-1][:count]

    def _classes_that_fit(self, asked: int | None, room: int) -> int:
        """How many classes' pairs a row shows: `asked` (every class for None), fewer where the longest
        pairs would leave no token for each text; at least one (if none fits, __init__ raises)."""
        if asked is not None and asked < 1:
            raise ValueError(f"demo_classes must be at least 1, got {asked}")
        count = len(self.label_token_ids) if asked is None else min(asked, len(self.label_token_ids))
        fitting = int((np.cumsum(self._widest_pairs(count)) <= room - len(self._text_pieces)).sum())
        return max(1, fitting)

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

    def tokenize(self, texts: Sequence[TextInput]) -> TokenizedTexts:
        """`texts` checked against the template and tokenized, field by field: what `encode` lays out.

        Texts already tokenized on this tokenizer for these template fields are returned as they are.
        """
        if (
            isinstance(texts, TokenizedTexts)
            and texts.tokenizer is self.tokenizer
            and texts.fields == self._fields
        ):
            return texts
        plain = tuple(texts)  # texts another encoder tokenized are tokenized again
        for position, text in enumerate(plain):
            self.template.check_input(text, position)
        flat = self._tokenize_fields(plain)
        per_text = len(self._text_pieces)
        ids = tuple(tuple(flat[i * per_text : (i + 1) * per_text]) for i in range(len(plain)))
        return TokenizedTexts(plain, ids, self.tokenizer, self._fields)

    def prompt_lengths(self, texts: Sequence[TextInput]) -> np.ndarray:
        """(N,) tokens in each text's prompt as `encode` lays it out, before padding; `texts` tokenized if
        they are not yet. For an encoder without demonstrations only: theirs depend on what is retrieved."""
        if self.demonstrations != "none":
            raise ValueError("a prompt with demonstrations is as long as what is retrieved into it")
        tokenized = self.tokenize(texts)
        in_texts = np.fromiter(
            (sum(map(len, ids)) for ids in tokenized.ids), dtype=np.int64, count=len(tokenized)
        )  # (N,)
        fixed = self.max_length - self.text_budget  # the template's own tokens, the slot, the specials
        lengths = fixed + np.minimum(in_texts, self.text_budget)  # truncation cuts the texts to the budget
        if not lengths.all():
            raise PromptError("a blank text leaves this template an empty prompt")
        return lengths

    def encode(
        self,
        texts: Sequence[TextInput],
        demos: Sequence[Sequence[Demo]] | None = None,
        classes: np.ndarray | None = None,
    ) -> EncodedBatch:
        """Encode `texts` (tokenized by `tokenize` unless they are already); with the `text` layout,
        `demos[b]` are row b's demonstrations, in prompt order; with the `vectors` layout, `classes[b]`
        (B, K) are the label indices whose pairs row b shows, in prompt order (None: every class, in label
        order, where the encoder shows them all)."""
        if not texts:
            raise PromptError("no texts to encode")
        if (demos is not None) != (self.demonstrations == "text") or (demos and len(demos) != len(texts)):
            raise ValueError("an encoder with the text layout takes one list of demonstrations per text")
        blocks: list[list[int]] = [[] for _ in texts]
        offsets = None
        if self.demonstrations == "vectors":
            blocks, offsets = self._vector_blocks(self._checked_classes(classes, len(texts)))
        elif classes is not None:
            raise ValueError("only an encoder with the vectors layout takes the classes to show")
        tokenized = self.tokenize(texts)
        per_row = len(self._text_pieces)
        demo_ids = self._tokenize_fields([text for row in demos or [] for text, _ in row])
        demo_rows = iter(demo_ids[i : i + per_row] for i in range(0, len(demo_ids), per_row))
        rows, slots, demo_starts, literals, truncated = [], [], [], [], []
        for r in range(len(texts)):
            text_ids, cut = _truncate_longest_first(list(tokenized.ids[r]), self.text_budget)
            block = blocks[r]
            if demos is not None:
                row_demos = [(next(demo_rows), label) for _, label in demos[r]]
                block = self._text_block(row_demos, room=self.text_budget - sum(map(len, text_ids)))
            row, slot, demo_start, literal = self._layout(text_ids, block)
            if not row:  # a blank text, a template of nothing else, no special tokens: nothing to read
                raise PromptError("a blank text leaves this template an empty prompt")
            rows.append(row)
            slots.append(slot)
            demo_starts.append(demo_start)
            literals.append(literal)
            truncated.append(cut)
        return self._pad(rows, slots, demo_starts, literals, truncated, offsets)

    def _checked_classes(self, classes: np.ndarray | None, rows: int) -> np.ndarray:
        """(B, K) label indices to show: those given, checked, or every class where all are shown."""
        num_labels = len(self.label_token_ids)
        if classes is None:
            if self.demo_classes < num_labels:
                raise ValueError(
                    f"this encoder shows {self.demo_classes} of {num_labels} classes' demonstrations a row: "
                    "give each row's classes"
                )
            return np.broadcast_to(np.arange(num_labels), (rows, num_labels))
        classes = np.asarray(classes)
        if classes.ndim != 2 or len(classes) != rows or not 1 <= classes.shape[1] <= self.demo_classes:
            raise ValueError(
                f"classes must be ({rows}, K) with 1 <= K <= {self.demo_classes}, got {classes.shape}"
            )
        if classes.min() < 0 or classes.max() >= num_labels:
            raise ValueError(f"classes must be label indices below {num_labels}")
        return classes

    def _vector_blocks(self, classes: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
        """Each row's `vectors` block for `classes` (B, K), and its placeholders' offsets in it (B, K)."""
        sizes = self._pair_sizes[classes]  # (B, K)
        offsets = np.cumsum(sizes, axis=1) - sizes  # (B, K) each pair's start within its row's block
        flat_sizes = sizes.ravel()  # (B*K,) the rows' pairs, one after another
        pair_starts = np.repeat(self._pair_starts[classes].ravel(), flat_sizes)  # each token's pair's start
        within = np.arange(flat_sizes.sum()) - np.repeat(np.cumsum(flat_sizes) - flat_sizes, flat_sizes)
        tokens = self._pair_tokens[pair_starts + within]  # every row's block, concatenated
        row_ends = np.cumsum(sizes.sum(1))[:-1]
        return [block.tolist() for block in np.split(tokens, row_ends)], offsets

    def _tokenize_fields(self, texts: Sequence[TextInput]) -> list[list[int]]:
        """Token ids of every text field of `texts`, in template order: one list per (text, field)."""
        if not texts:
            return []
        fields = ("text_a", "text_b") if self.template.is_pair else ("text",)
        rows_fields = [dict(zip(fields, t if self.template.is_pair else (t,), strict=True)) for t in texts]
        # check_input has made every field a string (for a pair template, the text is a pair of them).
        flat = [
            _spaced(cast(str, row[piece.field]).strip(), piece.leading_space)
            for row in rows_fields
            for piece in self._text_pieces
        ]
        return list(self.tokenizer(flat, add_special_tokens=False)["input_ids"])

    def _text_block(self, demos: list[tuple[list[list[int]], int]], room: int) -> list[int]:
        """The filled templates of `demos` ((field ids, label) each) with separators, within `room` tokens."""
        fixed = [
            len(self._separator) + sum(len(p.ids) for p in self._pieces) + len(self.label_token_ids[label])
            for _, label in demos
        ]
        kept = len(demos)
        while kept and sum(fixed[:kept]) + kept * len(self._text_pieces) > room:
            kept -= 1  # even one token per text would not fit: the last demonstration goes
        fields = [ids for field_ids, _ in demos[:kept] for ids in field_ids]
        fields, _ = _truncate_longest_first(fields, room - sum(fixed[:kept]))
        per_demo = len(self._text_pieces)
        block: list[int] = []
        for i, (_, label) in enumerate(demos[:kept]):
            filled, _, _ = self._fill(fields[i * per_demo : (i + 1) * per_demo], self.label_token_ids[label])
            instance = [*self._separator, *filled] if self.kind == "masked" else [*filled, *self._separator]
            block.extend(instance)
        return block

    def _fill(self, text_ids: list[list[int]], slot_ids: list[int]) -> tuple[list[int], int, list[int]]:
        """The template with its text fields and slot filled: ids, slot position, the literals' positions."""
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
                body.extend(slot_ids)
        return body, slot, literal

    def _layout(self, text_ids: list[list[int]], block: list[int]) -> tuple[list[int], int, int, list[int]]:
        slot_ids = [self.tokenizer.mask_token_id] if self.kind == "masked" else []
        body, slot, literal = self._fill(text_ids, slot_ids)
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
        demo_offsets: np.ndarray | None,  # (B, K) the placeholders' offsets within each row's vectors block
    ) -> EncodedBatch:
        # One array operation per field, not per row: with many concurrent requests a batch has hundreds
        # of rows, and per-row tensor writes were most of the encoder's time on the served path.
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))  # (B,)
        width = int(lengths.max())
        left = self.kind == "causal"  # left padding keeps every causal slot at position T-1
        shifts = width - lengths if left else np.zeros_like(lengths)  # (B,)
        columns = np.arange(width)[None, :]  # (1, T)
        filled = (columns >= shifts[:, None]) & (columns < (shifts + lengths)[:, None])  # (B, T)
        ids_np = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        ids_np[filled] = np.fromiter(
            (token for row in rows for token in row), dtype=np.int64, count=int(lengths.sum())
        )  # row-major: each row's tokens land in its filled span, in order
        literal_rows = np.repeat(np.arange(len(rows)), [len(positions) for positions in literals])
        literal_columns = np.fromiter(
            (p for positions in literals for p in positions), dtype=np.int64, count=len(literal_rows)
        )
        template_np = np.zeros((len(rows), width), dtype=bool)
        template_np[literal_rows, literal_columns + shifts[literal_rows]] = True
        ids = torch.from_numpy(ids_np)
        mask = torch.from_numpy(filled.astype(np.int64))
        template_mask = torch.from_numpy(template_np)
        shift_t = torch.from_numpy(shifts)
        position_ids = (mask.cumsum(1) - 1).clamp(min=0) if left else None
        demo_index = None
        if demo_offsets is not None:
            offsets = torch.from_numpy(np.ascontiguousarray(demo_offsets, dtype=np.int64))
            demo_index = (torch.tensor(demo_starts) + shift_t)[:, None] + offsets  # (B, K)
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
