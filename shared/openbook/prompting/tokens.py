"""Texts tokenized once: `TokenizedTexts` keeps each text's token ids, field by field, beside the text,
so that the micro-batcher sizes a batch and the forward lays it out from one tokenization
(`PromptEncoder.tokenize`); `join_texts` puts batches of them back together."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import numpy as np

from openbook.prompting.templates import TextInput


@dataclass(frozen=True, eq=False)
class TokenizedTexts(Sequence[TextInput]):
    """Texts and their token ids, field by field, as `PromptEncoder.tokenize` cut them; a sequence of
    the texts still. An encoder on `tokenizer` whose template has these text `fields` reads the ids; any
    other tokenizes the texts anew."""

    texts: tuple[TextInput, ...]
    ids: tuple[tuple[list[int], ...], ...]  # per text, the token ids of each of its fields
    tokenizer: Any
    fields: tuple[tuple[str, bool], ...]  # the template's text fields, in order: (name, leading space)

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[TextInput]:
        return iter(self.texts)

    @overload
    def __getitem__(self, index: int) -> TextInput: ...

    @overload
    def __getitem__(self, index: slice) -> TokenizedTexts: ...

    def __getitem__(self, index: int | slice) -> TextInput | TokenizedTexts:
        if isinstance(index, slice):
            return self.select(range(len(self))[index])
        return self.texts[index]

    def select(self, rows: Sequence[int] | np.ndarray) -> TokenizedTexts:
        """The texts at `rows`, in that order, with their ids."""
        return TokenizedTexts(
            tuple(self.texts[i] for i in rows), tuple(self.ids[i] for i in rows), self.tokenizer, self.fields
        )


def join_texts(parts: Sequence[Sequence[TextInput]]) -> Sequence[TextInput]:
    """The texts of `parts`, one part after another: tokenized where one tokenizer and the same template
    fields tokenized every part, else the plain texts (tokenized when they are encoded)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, TokenizedTexts) and all(
        isinstance(part, TokenizedTexts) and part.tokenizer is first.tokenizer and part.fields == first.fields
        for part in parts
    ):
        tokenized = cast(Sequence[TokenizedTexts], parts)
        return TokenizedTexts(
            tuple(text for part in tokenized for text in part.texts),
            tuple(ids for part in tokenized for ids in part.ids),
            first.tokenizer,
            first.fields,
        )
    return [text for part in parts for text in part]
