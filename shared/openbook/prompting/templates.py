"""Templates (`{text} It was {mask}`) and verbalizers (`0=terrible,1=great`).

A template is literal text with placeholders: `{text}` for a single input or
`{text_a}` and `{text_b}` for a pair, and exactly one `{mask}`, the slot the
language model fills. Parsing and validation live here; turning a template into
token ids lives in `encoder.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from openbook.label_names import LabelNameError, words_for_names

TextInput = str | tuple[str, str]

_PLACEHOLDER = re.compile(r"\{(\w*)\}")
_SINGLE_FIELDS = ("text",)
_PAIR_FIELDS = ("text_a", "text_b")


class PromptError(ValueError):
    """A template, verbalizer or input that cannot form a valid prompt."""


@dataclass(frozen=True)
class Segment:
    kind: Literal["literal", "text", "slot"]
    value: str  # the literal text, or the field name for "text"


@dataclass(frozen=True)
class Template:
    source: str
    segments: tuple[Segment, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        segments: list[Segment] = []
        cursor = 0
        for match in _PLACEHOLDER.finditer(self.source):
            if match.start() > cursor:
                segments.append(Segment("literal", self.source[cursor : match.start()]))
            name = match.group(1)
            if name == "mask":
                segments.append(Segment("slot", "mask"))
            elif name in _SINGLE_FIELDS + _PAIR_FIELDS:
                segments.append(Segment("text", name))
            else:
                raise PromptError(
                    f"template {self.source!r}: unknown placeholder {{{name}}}; "
                    "use {text} (or {text_a} and {text_b}) and {mask}"
                )
            cursor = match.end()
        if cursor < len(self.source):
            segments.append(Segment("literal", self.source[cursor:]))
        object.__setattr__(self, "segments", tuple(segments))
        self._validate()

    def _validate(self) -> None:
        names = [s.value for s in self.segments if s.kind != "literal"]
        if names.count("mask") != 1:
            raise PromptError(
                f"template {self.source!r} needs exactly one {{mask}} slot, found {names.count('mask')}"
            )
        fields = [n for n in names if n != "mask"]
        if sorted(fields) not in (list(_SINGLE_FIELDS), list(_PAIR_FIELDS)):
            raise PromptError(
                f"template {self.source!r} must contain {{text}} once, or {{text_a}} and {{text_b}} "
                f"once each; found {fields or 'no text field'}"
            )

    @property
    def is_pair(self) -> bool:
        return any(s.value == "text_a" for s in self.segments)

    @property
    def slot_at_end(self) -> bool:
        """True when nothing but whitespace follows `{mask}`: required for causal backbones."""
        last = self.segments[-1]
        return last.kind == "slot" or (
            last.kind == "literal" and not last.value.strip() and self.segments[-2].kind == "slot"
        )

    def require_slot_at_end(self) -> None:
        if not self.slot_at_end:
            raise PromptError(
                f"template {self.source!r}: a causal backbone predicts the next token, so {{mask}} "
                "must be the last thing in the template (e.g. '{text} It was {mask}')"
            )

    def check_input(self, text: object, position: int | None = None) -> None:
        """Raise PromptError unless `text` fits this template (a str, or a pair of them).

        A blank text is a valid input: its prompt is the template alone. Published k-shot splits have
        a few (CR's has three); the service refuses them at its edge, where one is a client's mistake.
        """
        where = "" if position is None else f"input {position}: "
        parts: Sequence[object]
        if not self.is_pair:
            parts = (text,)
        elif isinstance(text, tuple | list) and len(text) == 2:
            parts = text
        else:
            raise PromptError(f"{where}this template takes a pair of texts (text_a, text_b)")
        for part in parts:
            if not isinstance(part, str):
                raise PromptError(f"{where}text must be a string, got {type(part).__name__}")


@dataclass(frozen=True)
class Verbalizer:
    """Maps each label (as it appears in the data) to the word the LM should put in the slot."""

    labels: tuple[str, ...]
    words: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.words):
            raise PromptError("verbalizer needs one word per label")
        if len(self.labels) < 2:
            raise PromptError(f"a classifier needs at least 2 labels, got {list(self.labels)}")
        if len(set(self.labels)) != len(self.labels):
            raise PromptError(f"verbalizer has a repeated label: {list(self.labels)}")
        if len(set(self.words)) != len(self.words):
            raise PromptError(f"verbalizer maps two labels to the same word: {list(self.words)}")
        for label, word in zip(self.labels, self.words, strict=True):
            if not label.strip() or not word.strip():
                raise PromptError(f"verbalizer entry {label!r}={word!r} is empty")

    @classmethod
    def parse(cls, spec: str) -> Verbalizer:
        """Parse `0=terrible,1=great` (label=word pairs, comma-separated), or label names alone,
        `book_flight,transfer`, each scored by its readable word (`openbook.label_names`)."""
        items = [item.strip() for item in spec.split(",")]
        if not any("=" in item for item in items):
            return cls.of(items)
        labels, words = [], []
        for item in items:
            label, sep, word = item.partition("=")
            if not sep:
                raise PromptError(
                    f"label spec {item!r} is not of the form label=word (e.g. 0=terrible): give every label "
                    "a word, or give label names alone"
                )
            labels.append(label.strip())
            words.append(word.strip())
        return cls(tuple(labels), tuple(words))

    @classmethod
    def of(cls, labels: Mapping[str, str] | Sequence[str]) -> Verbalizer:
        """From label -> word, in label order, or from label names alone, each scored by its readable
        word (`openbook.label_names`: book_flight -> "book flight"), as a service task takes its labels."""
        if isinstance(labels, Mapping):
            return cls(tuple(labels), tuple(labels.values()))
        if isinstance(labels, str):
            raise PromptError(f"labels {labels!r}: give a list of names, or parse a spec (Verbalizer.parse)")
        try:
            named = words_for_names(labels)
        except LabelNameError as error:
            raise PromptError(str(error)) from None
        return cls(tuple(named), tuple(named.values()))

    def index(self, label: str) -> int:
        try:
            return self.labels.index(label)
        except ValueError:
            raise PromptError(f"unknown label {label!r}; known labels: {list(self.labels)}") from None

    def __str__(self) -> str:
        return ",".join(f"{label}={word}" for label, word in zip(self.labels, self.words, strict=True))
